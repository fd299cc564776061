"""A run's output folder, file by file: every file and folder a run writes there is named here and nowhere else (the
files inside a checkpoint are the trainer's, read in `runs`; those inside an lm-eval evaluation are lm-eval's).

    <output_dir>/
      .run.lock             the process that holds the run (`runs.claim`)
      run_record.json       command, settings, versions, code, hardware, data (`runs.write_run_record`)
      checkpoint-N/         the trainer's checkpoints, N its step (resume: `runs.resume`)
      warm-start/           the supervised warm start's model and its stamp (`warm_start`)
      eval/<name>/          one evaluation: summary.json, completions.jsonl (`evaluation`, `reports`)
      eval/comparison.json  baseline against final (`reports.compare`)
      completions/          TRL's logged completions, parquet
      health.json           the training-health verdict (`health`)
      curves.png            the curves (`plots`)
      wandb/                wandb's own run folders

Pure path and JSON reading: no library is imported here."""

import json
import re
from pathlib import Path

LOCK, RECORD, STATE = ".run.lock", "run_record.json", "trainer_state.json"
HEALTH, CURVES, EVAL, COMPLETIONS = "health.json", "curves.png", "eval", "completions"
WARM_START, WARM_START_STAMP = "warm-start", "warm_start.json"
SUMMARY, EVAL_COMPLETIONS, COMPARISON = "summary.json", "completions.jsonl", "comparison.json"
CHECKPOINT = re.compile(r"checkpoint-(0|[1-9][0-9]*)")  # what the trainer names a checkpoint (no checkpoint-02)
# What a run writes into its output folder, path by path inside it (full matches): a preset clears only these, and
# refuses a folder holding anything else. A folder is the run's when its path matches RUN_FOLDERS (wandb's run folders
# are wandb's: whatever it keeps in them is its own).
MODEL_FILES = (
    r"(config|generation_config|adapter_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens|"
    r"preprocessor_config|model\.safetensors\.index)\.json|(model|adapter_model)(-\d{5}-of-\d{5})?\.safetensors|"
    r"vocab\.json|merges\.txt|chat_template\.jinja|README\.md|training_args\.bin"
)
PROTOCOL = r"(-[a-z][a-z0-9_]*(-chat)?)"  # an evaluation's protocol in its folder's name: -chat, -gsm8k_cot-chat
RUN_FILES = re.compile(
    rf"(\.run\.lock|run_record\.json|trainer_state\.json|curves\.png|health\.json|{MODEL_FILES})"
    rf"|checkpoint-(0|[1-9][0-9]*)/({MODEL_FILES}|trainer_state\.json|optimizer\.pt|scheduler\.pt|scaler\.pt|"
    r"rng_state(_[0-9]+)?\.pth|entropy_ctrl_state\.json|latest|zero_to_fp32\.py|global_step[0-9]+/[^/]+)"
    r"|completions/completions_[0-9]{5,}\.parquet|\.?warm-start(\.part)?/[^/]+"
    rf"|eval/comparison{PROTOCOL}?\.json|eval/\.?(baseline|final|checkpoint-[0-9]+){PROTOCOL}?(-[0-9]+)?(\.part)?/"
    r"(summary\.json|completions\.jsonl|lm_eval_task\.yaml|lm_eval_results\.json|lm_eval_samples\.jsonl)"
    r"|wandb/(latest-run|debug\.log|debug-internal\.log|settings)|wandb/(offline-)?run-[0-9]{8}_[0-9]{6}-\w+/.+"
)
RUN_FOLDERS = re.compile(
    r"checkpoint-(0|[1-9][0-9]*)(/global_step[0-9]+)?|completions|\.?warm-start(\.part)?"
    rf"|eval(/\.?(baseline|final|checkpoint-[0-9]+){PROTOCOL}?(-[0-9]+)?(\.part)?)?|wandb(/(offline-)?run-[0-9]{{8}}_[0-9]{{6}}-\w+(/.+)?)?"
)
# no model or user file looks so (the warm start's folder and the one it is built in: a run stopped during the warm
# start has written nothing else yet)
RUN_ONLY_ENTRIES = ("checkpoint-*", EVAL, "wandb", COMPLETIONS, WARM_START, f".{WARM_START}.part", LOCK)
MODEL_ONLY_PARTS = ["optimizer.pt", "scheduler.pt", "rng_state.pth"]  # what a --save_only_model checkpoint lacks
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def default_names(model_name: str) -> dict[str, str]:
    """Where a run of `model_name` goes when --output_dir is not given, and its wandb name: outputs/<short>-GRPO and
    <short>-GRPO-gsm8k, <short> like `Qwen-1.5B` or `Llama-1B` (the model's own folder name otherwise)."""
    base = model_name.rstrip("/").split("/")[-1]
    match = re.match(r"(Qwen|Llama)[-\d.]*?-(\d+(?:\.\d+)?B)\b", base, re.IGNORECASE)
    short = f"{match[1]}-{match[2]}" if match else base
    return {"output_dir": f"outputs/{short}-GRPO", "run_name": f"{short}-GRPO-gsm8k"}


def path(output_dir: str | Path, name: str) -> Path:
    """One of the run's files or folders: `path(out, folder.RECORD)`, `path(out, folder.HEALTH)`..."""
    return Path(output_dir) / name


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step}"


def checkpoint(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / checkpoint_name(step)


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Every `checkpoint-N` folder in `output_dir`, complete or not, oldest (lowest step) first."""
    found = [p for p in Path(output_dir).glob("checkpoint-*") if CHECKPOINT.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("checkpoint-")))


def is_checkpoint(model_dir: str | Path) -> bool:
    return bool(CHECKPOINT.fullmatch(Path(model_dir).name))


def step_of(model_dir: str | Path) -> int | None:
    """N of a `checkpoint-N` folder, None for any other."""
    return int(Path(model_dir).name.removeprefix("checkpoint-")) if is_checkpoint(model_dir) else None


def run_of(model_dir: str | Path) -> Path:
    """The run folder a model folder belongs to: the run's own for a `checkpoint-N`, else the folder itself."""
    model_dir = Path(model_dir).expanduser()
    return model_dir.parent if is_checkpoint(model_dir) else model_dir


def eval_name(base: str, protocol: str = "recipe") -> str:
    """The folder an evaluation in `protocol` is written to: `baseline`, `final` (the recipe's), `final-chat`..."""
    return base if protocol == "recipe" else f"{base}-{protocol}"


def eval_dir(output_dir: str | Path, name: str | None = None) -> Path:
    """The evaluation folder of a run (`<output_dir>/eval`), or of one evaluation in it (`.../eval/<name>`)."""
    found = Path(output_dir) / EVAL
    return found / name if name else found


def comparison(output_dir: str | Path, protocol: str = "recipe") -> Path:
    return eval_dir(output_dir) / (COMPARISON if protocol == "recipe" else f"comparison-{protocol}.json")


def part(final: str | Path, tag: str = "") -> Path:
    """Where `final` is built before it is renamed into place: `.<name>[.<tag>].part` beside it (whole or not at
    all: a stop while writing leaves the older one)."""
    final = Path(final)
    return final.parent / f".{final.name}{'.' + tag if tag else ''}.part"


def read_json(file: str | Path, default=None):
    """A JSON object of a run (record, state, summary, lock), or `default` when it is missing, cannot be read or is
    not an object (a damaged file: `[]`, `null`)."""
    try:
        value = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
    return value if isinstance(value, dict) else default


def read_record(output_dir: str | Path) -> dict | None:
    return read_json(path(output_dir, RECORD))


def read_state(model_dir: str | Path) -> dict | None:
    """A checkpoint's (or a finished run's) trainer_state.json."""
    return read_json(path(model_dir, STATE))


def step_and_end(checkpoint: str | Path, max_steps: int) -> tuple[int, int]:
    """A checkpoint's step, and the step its run ends at: `max_steps`, or where that is -1 (epochs), its state's."""
    state = read_state(checkpoint) or {}
    return state.get("global_step", 0), max_steps if max_steps > 0 else state.get("max_steps", 0)


def read_summary(output_dir: str | Path, name: str) -> dict | None:
    return read_json(eval_dir(output_dir, name) / SUMMARY)


def weight_files(model_dir: str | Path) -> list[Path]:
    return [Path(model_dir) / name for name in WEIGHT_FILES if (Path(model_dir) / name).is_file()]


def not_written_by_a_run(output_dir: str | Path, under: str = "") -> list[str]:
    """What in `output_dir` no run wrote, at any depth (RUN_FILES, RUN_FOLDERS): each path inside it, a folder ending
    in `/` and named once, not what it holds. A link is a file here: never followed."""
    found = []
    for entry in sorted(Path(output_dir, under).iterdir()):
        name = f"{under}{entry.name}"
        if entry.is_dir() and not entry.is_symlink():
            found += not_written_by_a_run(output_dir, f"{name}/") if RUN_FOLDERS.fullmatch(name) else [f"{name}/"]
        elif not RUN_FILES.fullmatch(name):
            found.append(name)
    return found
