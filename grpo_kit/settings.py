"""The recipe's settings: its constants are defaults, a preset (`--smoke`, `--demo`) sits on them, a YAML file
(`--config`) on that, and the command line wins. Every value is checked before anything is loaded.

Any field of `RunArguments` (below), TRL's `GRPOConfig` or `ModelConfig` can be set either way. The YAML is read
here, not by TRL, so that every value can be checked before a dataclass or model is built; its `env:` block sets
environment variables, as TRL's does.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from grpo_kit import checks, hub, models, presets
from grpo_kit.folders import read_json
from grpo_kit.smoke import TINY_MODELS

logger = logging.getLogger("grpo_demo")


@dataclass
class RunArguments:
    """What to run, on which data, and how to measure it."""

    dataset: str | None = field(
        default=None, metadata={"help": "Folder with GSM8K's train.jsonl/test.jsonl; default: the Hub's openai/gsm8k"}
    )
    max_prompt_tokens: int = field(default=256, metadata={"help": "Longer prompts are dropped"})
    reasoning_tag: str = field(
        default="reasoning",
        metadata={"help": "The reasoning block's tag, in prompt, rewards and evaluation alike (think: <think>)"},
    )
    answer_tag: str = field(default="answer", metadata={"help": "The answer block's tag (<answer>...</answer>)"})
    validation_rows: int = field(
        default=0,
        metadata={
            "help": "Train rows held out as a validation split (a fixed draw, whatever the seed), never trained on"
        },
    )
    strict_data: bool = field(
        default=False, metadata={"help": "Stop on a bad data row instead of dropping it (and saying so)"}
    )
    smoke: bool = field(
        default=False, metadata={"help": "Offline CPU check: tiny generated model and problems, a few steps"}
    )
    demo: bool = field(
        default=False,
        metadata={"help": "Offline CPU demo, ~2 min: GRPO raises a tiny warm-started model's accuracy (curves.png)"},
    )
    tiny_model: str = field(
        default=TINY_MODELS[0],
        metadata={
            "help": "--smoke/--demo: the tiny model's architecture and chat conventions, qwen2 (Qwen2.5's ChatML) or "
            "llama3 (a Llama model with Llama 3's chat template and special tokens)",
            "choices": list(TINY_MODELS),
        },
    )
    # GSM8K test accuracy: greedy, max_completion_length new tokens, scored strict (answer block) and lenient
    eval_only: bool = field(
        default=False,
        metadata={"help": "Evaluate --model_name_or_path on the test split into <output_dir>/eval/ and exit"},
    )
    final_eval: bool = field(
        default=True, metadata={"help": "Evaluate the start model before training and the trained one after it"}
    )
    eval_every_steps: int = field(
        default=50, metadata={"help": "Accuracy on eval_subset test questions every N steps, logged; 0: off"}
    )
    eval_subset: int = field(default=100, metadata={"help": "The first N test questions, for eval_every_steps"})
    eval_split: str = field(
        default="test",
        metadata={
            "help": "What the accuracy evaluations measure: test, or validation (the rows --validation_rows holds out "
            "of train: for tuning, so that the test split stays unseen)",
            "choices": ["test", "validation"],
        },
    )
    eval_limit: int | None = field(default=None, metadata={"help": "Evaluate the first N test questions; default: all"})
    eval_batch_size: int = field(
        default=64,
        metadata={
            "help": "Questions generated together, per process; with eval_samples, completions (batch_size // "
            "eval_samples questions, at least one)"
        },
    )
    eval_protocols: list[str] = field(
        default_factory=lambda: ["recipe"],
        metadata={
            "help": "How questions are put and answers read (grpo_kit/protocols.py): recipe (its format, zero-shot), "
            "kshot (GSM8K's '#### N' style, eval_shots worked examples from train), chat (the question alone; "
            "\\boxed{} or the last number). Baseline and final run in each; a training run always in recipe"
        },
    )
    eval_shots: int = field(default=8, metadata={"help": "Worked examples the kshot protocol shows (drawn from train)"})
    eval_samples: int = field(
        default=0, metadata={"help": "Samples per question for pass@k and maj@k, beside greedy accuracy; 0: off"}
    )
    eval_temperature: float | None = field(
        default=None, metadata={"help": "The temperature of eval_samples; default: the training temperature"}
    )
    ask: str | None = field(
        default=None, metadata={"help": "Print a sampled answer of --model_name_or_path to this question and exit"}
    )
    health_checks_off: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Training-health checks to leave off (grpo_kit/health.py): truncation, no_signal, format_only, "
            "length_runaway, entropy_collapse, not_finite; or all"
        },
    )
    allow_changed_settings: bool = field(
        default=False,
        metadata={"help": "Resume even where settings differ from the run's start (learning rate, batch, model...)"},
    )


def setup_logging() -> None:
    """Info from the main process, warnings only from the others."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
    )


def read_config_flag(argv: list[str]) -> tuple[list[str], dict, Path | None]:
    """Split `--config FILE` off the command line: the rest of it, the YAML's values (its `env:` is applied), and
    the file's path."""
    argv = [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
    if "--config" not in argv:
        return argv, {}, None
    if argv.count("--config") > 1:
        sys.exit("--config is given twice: one YAML file, then the command line for what differs")
    i = argv.index("--config")
    if i + 1 >= len(argv):
        sys.exit("--config needs a YAML file: --config recipe.yaml")
    path = Path(argv[i + 1])
    if not path.is_file():
        sys.exit(f"--config {path}: no such file")
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where it is built in: far faster
        values = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        sys.exit(f"--config {path}: not a readable YAML file ({str(err).splitlines()[0]})")
    if not isinstance(values, dict):
        sys.exit(f"--config {path}: expected a mapping of setting: value")
    if "config" in values:
        sys.exit(f"--config {path}: a config: inside a config file is not read: put its settings here")
    env = values.pop("env", None) or {}
    if not isinstance(env, dict):
        sys.exit(f"--config {path}: env: expected a mapping of VARIABLE: value")
    for key, value in env.items():
        if not ENV_NAME_RE.fullmatch(str(key)) or "\0" in str(value):
            sys.exit(f"--config {path}: env: {key!r}: {value!r} is not an environment variable and value")
        if key in LAUNCHER_VARIABLES:
            sys.exit(f"--config {path}: env: {key} is set by accelerate launch / torchrun, not by a config file")
        os.environ[str(key)] = str(value)
    return argv[:i] + argv[i + 2 :], values, path


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LAUNCHER_VARIABLES = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def yaml_arguments(parser, values: dict, path: Path | None) -> tuple[list[str], dict, list[str]]:
    """(command-line tokens, values to set directly, unknown keys) for a YAML file's settings, so that its values
    are typed and checked by the same parser as the command line's. Mappings (`generation_kwargs`) are set directly;
    `null` means the default."""
    actions = {action.dest: action for action in parser._actions}
    tokens, direct, unknown = [], {}, []
    for key, value in values.items():
        action = actions.get(key)
        if action is None:
            unknown.append(key)
        elif isinstance(value, dict) and key in MAPPING_SETTINGS:
            direct[key] = value
        elif isinstance(value, dict) or key in MAPPING_SETTINGS:
            kind = "a mapping" if isinstance(value, dict) else type(value).__name__
            wanted = "a mapping (key: value lines under it)" if key in MAPPING_SETTINGS else "one value"
            sys.exit(f"--config {path}: {key}: {kind} given, it takes {wanted}")
        elif value is None:  # the default, as if the line were not there
            continue
        elif isinstance(value, list):
            if action.nargs not in ("+", "*") or not value:
                takes = "one or more values, not an empty list" if value == [] else "one value, not a list"
                sys.exit(f"--config {path}: {key}: {value}: it takes {takes}")
            tokens += [f"--{key}", *map(_token, value)]
        else:
            tokens += [f"--{key}", _token(value)]
    return tokens, direct, unknown


# GRPOConfig's fields that take a mapping (generation_kwargs, model_init_kwargs, ...): the only YAML mappings read.
MAPPING_SETTINGS = {
    "lr_scheduler_kwargs", "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs", "liger_kernel_config",
    "accelerator_config", "fsdp_config", "deepspeed", "model_init_kwargs", "generation_kwargs", "chat_template_kwargs",
    "transformers_continuous_batching_config",
}  # fmt: skip


def _token(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def run_names(model_name: str) -> dict:
    """outputs/<short>-GRPO and <short>-GRPO-gsm8k, <short> like `Qwen-1.5B` or `Llama-1B`."""
    base = model_name.rstrip("/").split("/")[-1]
    match = re.match(r"(Qwen|Llama)[-\d.]*?-(\d+(?:\.\d+)?B)\b", base, re.IGNORECASE)
    short = f"{match[1]}-{match[2]}" if match else base
    return {"output_dir": f"outputs/{short}-GRPO", "run_name": f"{short}-GRPO-gsm8k"}


def _parser(config: Path | None = None):
    from trl import GRPOConfig, ModelConfig, TrlParser

    parser = TrlParser((RunArguments, GRPOConfig, ModelConfig))
    where = f" (on the command line or in {config})" if config else ""

    def error(message: str):  # argparse's own prints the whole usage first: hundreds of lines
        sys.exit(f"Invalid setting{where}: {message}. python {Path(sys.argv[0]).name} --help lists them all")

    parser.error = error
    # Read (and taken off the command line) by read_config_flag; listed here for --help.
    parser.add_argument("--config", help="A YAML file of settings (any of these); the command line wins over it")
    return parser


def given_on_command_line(argv: list[str]) -> dict:
    """The settings the command line names, typed (values for everything else are left out)."""
    parser = _parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    namespace, _ = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    return vars(namespace)


def resolve(argv: list[str] | None, recipe_defaults: dict, reward_funcs: list) -> dict:
    """Every setting's value from the recipe's defaults, a preset, `--config` YAML and the command line, in that
    order, checked: stops with one line per problem before anything is loaded."""
    import torch

    setup_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            sys.exit(f"Invalid setting: {arg.encode('utf-8', 'surrogateescape')!r} is not UTF-8 text")
    argv, yaml_values, config = read_config_flag(argv)
    chosen = {k: v for k, v in {**yaml_values, **given_on_command_line(argv)}.items() if v is not None}
    preset = presets.chosen(chosen)
    cuda = torch.cuda.is_available()
    native_bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)  # Ampere or newer
    defaults = {
        **recipe_defaults,
        # bf16 compute (autocast) on a GPU that has it (or fp16 when asked); the weights' dtype is the recipe's
        # choice (dtype None). Older GPUs compute in fp32 unless --fp16 true.
        "bf16": native_bf16 and not chosen.get("fp16"),
        "use_cpu": not cuda,  # also makes `accelerate launch` processes on a CPU-only machine join one gloo group
        "dtype": None,
        **(presets.defaults(preset, chosen.get("tiny_model")) if preset else {}),
    }
    if cuda and not native_bf16 and not (chosen.get("fp16") or chosen.get("bf16")):
        logger.warning("This GPU has no native bf16: training computes in fp32 (slow); --fp16 true for fp16 autocast")
    # The output folder and run name follow the model, wherever it was chosen (a preset names its own).
    defaults = {**run_names(chosen.get("model_name_or_path", defaults["model_name_or_path"])), **defaults}

    parser = _parser(config)
    tokens, direct, unknown = yaml_arguments(parser, yaml_values, config)  # typed like the command line's
    parser.set_defaults(**{**defaults, **direct})
    namespace, unknown_cli = parser.parse_known_args(tokens + argv)  # the command line's come last: they win
    if unknown or unknown_cli:
        found = [f"in {config}: {unknown}"] if unknown else []
        found += [f"on the command line: {unknown_cli}"] if unknown_cli else []
        sys.exit(f"Unknown settings {'; '.join(found)} (python {Path(sys.argv[0]).name} --help lists them)")
    values = vars(namespace)
    values.pop("config", None)
    model_dir = Path(values["model_name_or_path"]).expanduser()
    own_model = presets.writes(preset, "model_name_or_path", values["model_name_or_path"])
    if values["eval_only"] and "output_dir" not in chosen and model_dir.is_dir() and not own_model:
        values["output_dir"] = str(model_dir)  # an evaluation lands beside the model it measured
    found = checks.problems(values, n_rewards=len(reward_funcs))
    if found:
        sys.exit("Invalid settings:\n" + "\n".join(f"  - {p}" for p in found))
    for warning in checks.warnings(values):
        logger.warning(warning)
    values["resume_from_checkpoint"] = resume(values)
    settings = SimpleNamespace(**values)
    values["attn_implementation"] = models.attention(settings, settings)  # flash-attention where it can run
    hub.go_offline_if_unreachable(values)
    return values


def resume(values: dict) -> str | None:
    """The checkpoint a run resumes from: `latest` resolved to the newest complete one (saying which newer ones are
    incomplete), None for a fresh start; stops when the run's fixed settings differ from its start's."""
    from grpo_kit.record import read_run_record

    asked, output_dir, path = values["resume_from_checkpoint"], values["output_dir"], values["resume_from_checkpoint"]
    if asked in checks.RESUME_LATEST:
        missing = {folder: checks.missing_parts(folder) for folder in checks.checkpoint_folders(output_dir)}
        complete = [folder for folder, parts in missing.items() if not parts]
        path = str(complete[-1]) if complete else None
        for folder, parts in missing.items():
            if parts and (path is None or int(folder.name[11:]) > int(Path(path).name[11:])):
                logger.warning("Skipping %s: incomplete, without %s", folder, ", ".join(parts))
        if path is None:
            logger.warning(
                "--resume_from_checkpoint %s: no complete checkpoint in %s: starting afresh", asked, output_dir
            )
    trains = checks.trains(values)
    if path and trains:
        step = (read_json(Path(path) / "trainer_state.json") or {}).get("global_step", 0)
        if 0 < values["max_steps"] <= step:
            sys.exit(
                f"{path} is at step {step}, and this run ends at max_steps={values['max_steps']}: nothing to train. "
                "Train longer with a larger --max_steps (and --allow_changed_settings true), or start a new run"
            )
    record = read_run_record(Path(path).parent) if path else None  # the run the checkpoint belongs to
    if path and trains and record is not None and (changed := checks.changed_since_start(values, record)):
        listed = "\n".join(f"  - {change}" for change in changed)
        if not values["allow_changed_settings"]:
            sys.exit(
                f"Resuming {path} with settings its run did not start with:\n{listed}\n"
                "The checkpoint's optimizer and schedule follow the old ones: resume with the same settings, start "
                "a new run (another --output_dir), or resume anyway: --allow_changed_settings true"
            )
        logger.warning("Resuming with settings changed since the run's start (--allow_changed_settings):\n%s", listed)
    return path


def parse(argv: list[str] | None, recipe_defaults: dict, reward_funcs: list):
    """(RunArguments, GRPOConfig, ModelConfig) of `resolve`'s values."""
    values = resolve(argv, recipe_defaults, reward_funcs)
    run, training_args, model_args = _parser().parse_dict(values)
    if isinstance(model_args.lora_target_modules, str) and model_args.lora_target_modules != "all-linear":
        # ModelConfig turns a list of one into a string, which PEFT reads as a pattern of whole module paths.
        model_args.lora_target_modules = [model_args.lora_target_modules]
    if training_args.resume_from_checkpoint:
        logger.info("Resuming from %s", training_args.resume_from_checkpoint)
    return run, training_args, model_args
