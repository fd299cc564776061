"""A run's life in its output folder: held by one process (a lock), recorded (settings, versions, code, hardware,
data), checkpointed, resumed on the settings and data it started with, and cleared only of what a run wrote."""

import atexit
import dataclasses
import errno
import json
import logging
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path

from grpo_kit import RecipeError, layout, patches, scoring
from grpo_kit.models import installed_version, world_size

logger = logging.getLogger("grpo_demo")

RESUME_LATEST = ("latest", "true", "True", "1")
PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "wandb", "flash-attn", "vllm")
# What a config file's `env:` may set: each honoured because the recipe applies it (`read_config`) before the library
# that reads it is imported or reads it. Nothing else: a variable such as PATH, LD_PRELOAD, GIT_CONFIG_*, PYTHON*,
# NCCL_NET_PLUGIN or WANDB__EXECUTABLE would run code; CUDA_VISIBLE_DEVICES must reach accelerate launch, which places
# its processes on GPUs before they read the file, and ACCELERATE_* are its own config's: those are set in the shell.
CONFIG_ENV = {
    # huggingface_hub/constants.py and datasets/config.py read these at import (TRANSFORMERS_OFFLINE too)
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
    # wandb.init's settings, transformers' WandbCallback and online.configure_wandb read these when a run starts
    "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP", "WANDB_JOB_TYPE", "WANDB_TAGS", "WANDB_NOTES", "WANDB_MODE",
    "WANDB_DIR", "WANDB_LOG_MODEL", "WANDB_WATCH",
    "TOKENIZERS_PARALLELISM",  # tokenizers reads it at each use
    "PYTORCH_CUDA_ALLOC_CONF",  # torch's CUDA allocator reads it: set before torch is imported (`resolve`)
    "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME",  # read when the process group starts
}  # fmt: skip


def disk_full(err: BaseException) -> bool:
    """Whether `err` (or what caused it) is a full disk or quota. safetensors reports one as its own error type,
    torch.save (an optimizer state) as its zip writer's failed write: "[enforce fail at inline_container.cc:...]
    . unexpected pos" (caffe2/serialize/inline_container.cc, checked on torch 2.13)."""
    while err is not None:
        text = str(err)
        full = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in text
        if full or ("inline_container.cc" in text and "unexpected pos" in text):
            return True
        err = err.__cause__ or err.__context__
    return False


def as_a_command(main) -> None:
    """Run `main` as a command: a `RecipeError` (a mistake to fix) exits with its message, Ctrl-C with 130 and the
    command that resumes, a full disk with what to free; nothing of these prints a traceback."""
    try:
        main()
    except RecipeError as err:
        sys.exit(str(err))
    except KeyboardInterrupt:
        print(f"\nStopped (Ctrl-C). A training run goes on from its newest checkpoint: {resume_command()}")
        sys.exit(130)
    except Exception as err:
        if not disk_full(err):
            raise
        sys.exit(f"The disk is full: free some space, then (a cut checkpoint is skipped): {resume_command()}")


SECRET_NAME = re.compile(r"--?[\w-]*(token|api[_-]key|password|secret)", re.I)  # --hub_token, not --max_tokens
SECRET_VALUE = re.compile(r"\b(hf|api|sk)_[A-Za-z0-9]{16,}")  # a Hub token (or a key) given anywhere else


def public(argv: list[str]) -> list[str]:
    """`argv` as the recipe may write or print it: a token, key or password's value replaced by <redacted>."""
    shown, hide = [], False
    for arg in argv:
        name, eq, value = arg.partition("=")
        if hide:
            arg, hide = "<redacted>", False
        elif SECRET_NAME.fullmatch(name):
            arg, hide = (f"{name}=<redacted>", False) if eq else (arg, True)
        shown.append(SECRET_VALUE.sub("<redacted>", arg))
    return shown


def starts_again(args: list[str]) -> bool:
    """Whether a command line is an evaluation or a question (`--eval_only`, `--eval-only true`, `--ask=...`): no
    checkpoint, so it goes on by starting again. (One a --config file makes so is not seen here.)"""
    found = False
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        name = name.replace("-", "_")
        if name in ("__eval_only", "__ask"):
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            found = name == "__ask" or value.lower() not in ("false", "0", "no")
    return found


def resume_command(argv: list[str] | None = None) -> str:
    """The command that continues this run, to print as it stops: this process's own command line, its
    --resume_from_checkpoint replaced by `latest`; under a launcher, that launcher's line around it."""
    argv = public(list(sys.argv if argv is None else argv))  # a token stays out of the log: the user gives it again
    script, args, kept = argv[0], iter(argv[1:]), []
    for arg in args:
        if arg in ("--resume_from_checkpoint", "--resume-from-checkpoint"):
            next(args, None)  # and its value
        elif not arg.startswith(("--resume_from_checkpoint=", "--resume-from-checkpoint=")):
            kept.append(arg)
    again = starts_again(argv[1:])
    line = shlex.join([script, *kept] if again else [script, *kept, "--resume_from_checkpoint", "latest"])
    return f"accelerate launch <as before> {line}" if world_size() > 1 else f"python {line}"


def ask_command(model_dir: str, question: str, argv: list[str] | None = None) -> str:
    """The command that asks the model a run saved a question: the run's preset, --config and answer tags (what
    shapes the prompt), its model folder and the question."""
    argv = list(sys.argv if argv is None else argv)
    kept, valued = [], ("--config", "--tiny_model", "--reasoning_tag", "--answer_tag")
    for i, arg in enumerate(argv[1:], 1):
        name = arg.split("=", 1)[0]
        if name in ("--smoke", "--demo"):  # a flag, or a flag and its value (--demo true)
            alone = "=" in arg or i + 1 >= len(argv) or argv[i + 1].startswith("--")
            kept += [arg] if alone else argv[i : i + 2]
        elif name in valued:
            kept += [arg] if "=" in arg else argv[i : i + 2]
    return "python " + shlex.join([argv[0], *kept, "--model_name_or_path", str(model_dir), "--ask", question])


def trains(v: dict) -> bool:
    """Whether the settings ask for a training run (not --eval_only, not --ask)."""
    return not (v["eval_only"] or v["ask"] is not None)


# ---------------------------------------------- One run per output folder ---------------------------------------------
def started_at(pid: int) -> str | None:
    """When process `pid` started (Linux: /proc/<pid>/stat), to tell it from a later process given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, alive
        pass
    return started is None or started_at(pid) in (None, started)  # a reused pid is another process


def claim(output_dir: str | Path) -> Path:
    """Hold `output_dir` for this process until it exits (`.run.lock`: pid, host, Slurm job). A lock whose process is
    gone, or left by an earlier run of this requeued Slurm job (Slurm ends one run of a job before it starts the next,
    maybe on another machine; SLURM_RESTART_COUNT counts them), is taken over; a live one is refused."""
    path = layout.path(output_dir, layout.LOCK)
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]  # the folders this run makes
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RecipeError(
            f"output_dir={output_dir}: cannot be made ({err.strerror}): choose another --output_dir"
        ) from None
    job, restart = os.environ.get("SLURM_JOB_ID"), int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": started_at(os.getpid())}
    me |= {"slurm_job": job, "slurm_restart": restart} if job else {}
    while True:
        try:
            since = datetime.now(UTC).isoformat(timespec="seconds")
            with path.open("x", encoding="utf-8") as f:
                json.dump({**me, "since": since, "command": public(sys.argv)}, f)
            break
        except FileExistsError:
            holder = layout.read_json(path, {})  # {} while being written, or damaged
            same_host = holder.get("host") == me["host"]
            if holder.get("pid") == me["pid"] and same_host:
                return path  # this process holds it already
            if isinstance(holder.get("pid"), int) and same_host and not alive(holder["pid"], holder.get("started")):
                why = f"its run (pid {holder['pid']}) is gone"
            elif job and holder.get("slurm_job") == job and (holder.get("slurm_restart") or 0) < restart:
                why = f"Slurm job {job} held it before it was requeued"
            else:
                where = "" if same_host else f" on {holder.get('host')}"
                raise RecipeError(
                    f"output_dir={output_dir} is in use by another run (pid {holder.get('pid')}{where}, since "
                    f"{holder.get('since')}): wait for it to end, or choose another --output_dir "
                    f"(if that run is over, delete {path})"
                ) from None
            logger.warning("Taking over %s: %s", path, why)
            path.unlink(missing_ok=True)
    atexit.register(release, path, made)
    return path


def release(lock: Path, made: list[Path]) -> None:
    """At exit: the lock removed if this process holds it, then each folder `claim` made that is left empty (a run
    that failed before writing anything leaves no empty outputs/<run>/ behind)."""
    if layout.read_json(lock, {}).get("pid") != os.getpid():
        return
    lock.unlink(missing_ok=True)
    for folder in made:  # innermost first
        try:
            folder.rmdir()  # only when empty
        except OSError:
            break


def clear_preset_folder(output_dir: str | Path, preset: str, reads: dict[str, str | None] | None = None) -> None:
    """Empty a preset's own output folder for a new run (its lock stays), file by file: only when the runs in it
    were that preset's (their run record says so), it holds only what a run writes (`not_written_by_a_run`) and
    this run reads none of it (`reads`: {setting: path}, a start model or data inside it); else refuse, naming why."""
    folder = Path(output_dir)
    inside = []
    for setting, path in (reads or {}).items():
        if not path or not Path(path).expanduser().exists():  # checked first: resolving a loop raises
            continue
        if folder.resolve() in (where := Path(path).expanduser().resolve(), *where.parents):
            inside.append(f"--{setting} {path}")
    if inside:
        raise RecipeError(
            f"--{preset} starts afresh in {folder}, clearing what its runs wrote there, and this run reads "
            f"{', '.join(inside)} inside it: copy that out of {folder} first, or give the preset another --output_dir"
        )
    if not folder.is_dir() or all(p.name == layout.LOCK for p in folder.iterdir()):
        return
    foreign = layout.not_written_by_a_run(folder)
    settings = (layout.read_record(folder) or {}).get("settings") or {}
    if not (settings.get("run") or settings.get("recipe") or {}).get(preset) or foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise RecipeError(
            f"--{preset} starts afresh in {folder}, which holds files a --{preset} run did not write"
            f"{': ' + listed if foreign else ''}: move them, or give the preset another --output_dir"
        )
    logger.warning("--%s starts afresh: clearing %s", preset, folder)
    for where, folders, files in os.walk(folder, topdown=False):  # what a folder holds first; links not followed
        for name in files + folders:
            path = Path(where, name)
            if path != layout.path(folder, layout.LOCK):
                path.rmdir() if name in folders and not path.is_symlink() else path.unlink()


# ---------------------------------------------- Checkpoints -----------------------------------------------------------
def rotate_checkpoints(output_dir: str | Path, limit: int | None, keep: tuple[str | None, ...] = ()) -> None:
    """Keep the newest `limit` checkpoints of `output_dir` (those in `keep` too: the one just saved, the best one):
    transformers' rotation, but of the `checkpoint-N` folders alone (its pattern, `.*checkpoint-([0-9]+)`, also
    takes a user's `checkpoint-2-keep`), by step (not by modification time, which a copy changes), links left."""
    if not limit or limit <= 0:
        return
    found, keep = [p for p in layout.checkpoints(output_dir) if not p.is_symlink()], {Path(p) for p in keep if p}
    kept = [p for p in found if any(p.samefile(k) for k in keep if k.exists())]
    for folder in [p for p in found if p not in kept][: max(len(found) - max(limit, len(kept)), 0)]:
        shutil.rmtree(folder, ignore_errors=True)


def missing_parts(checkpoint: str | Path) -> list[str]:
    """What a resume needs that `checkpoint` lacks (files absent, truncated or damaged); empty when complete."""
    folder = Path(checkpoint)
    state = layout.path(folder, layout.STATE)
    missing = [f"{state.name}{f' ({why})' if state.is_file() else ''}"] if (why := state_damage(state)) else []
    if not (weights := layout.weight_files(folder)):
        missing.append("its weights (model.safetensors or adapter_model.safetensors)")
    for path in weights:
        if path.name.endswith(".index.json"):
            index = layout.read_json(path)
            shards = index.get("weight_map", {}).values() if isinstance(index, dict) else ["(a damaged index)"]
            missing += [f"{name} (a shard)" for name in sorted(set(shards)) if not whole(folder / name)]
        elif path.suffix == ".safetensors" and not whole(path):
            missing.append(f"{path.name} (truncated or damaged)")
    if not any(folder.glob("global_step*")):  # DeepSpeed keeps the optimizer there instead
        for name in ("optimizer.pt", "scheduler.pt"):
            if not (folder / name).is_file():
                missing.append(name)
            elif not (_loads(folder / name) if name == "scheduler.pt" else zipfile.is_zipfile(folder / name)):
                missing.append(f"{name} (truncated or damaged)")  # torch.save writes a zip; a cut one has no end
    rng = sorted(folder.glob("rng_state*.pth"))
    missing += [f"{path.name} (truncated or damaged)" for path in rng if not _loads(path)]
    return missing if rng else [*missing, "rng_state.pth"]


def state_damage(path: Path) -> str | None:
    """What makes a checkpoint's trainer_state.json unusable for a resume ("damaged: ..."), None when it is sound:
    the step a resume continues from (and names the next checkpoint by) a count, the epoch a number, the logs a
    list. transformers reads them unchecked: a step of -3 would train from -3 and write over checkpoint-4."""
    if not isinstance(state := layout.read_json(path), dict):
        return "damaged"
    step, epoch = state.get("global_step"), state.get("epoch", 0)
    if type(step) is not int or step < 0:
        return f"damaged: global_step {step!r} is not a step count"
    if epoch is not None and (type(epoch) not in (int, float) or not 0 <= epoch < float("inf")):
        return f"damaged: epoch {epoch!r} is not a number of epochs"
    if not isinstance(state.get("log_history", []), list):
        return "damaged: log_history is not a list"
    return None


def _loads(path: Path) -> bool:
    """Whether a small torch file (scheduler, RNG state) loads as a resume loads it. The optimizer's state is too
    large to read here (12 bytes a parameter): only its zip structure is checked."""
    return _torch_file(path, map_location=None) is not None and zipfile.is_zipfile(path)  # torch.save writes a zip


def whole(path: Path) -> bool:
    """Whether a safetensors file holds every byte its header promises (a cut file does not)."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size >= 8 + size + end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


# ---------------------------------------------- Resuming --------------------------------------------------------------
# Settings a resumed run cannot change without training differently from the run it continues: the optimizer and
# its schedule, the batch and groups, the model and its adapter, the data; by the run record's section.
FIXED_ON_RESUME = {
    "training": (
        "learning_rate", "lr_scheduler_type", "warmup_steps", "adam_beta1", "adam_beta2", "weight_decay",
        "max_grad_norm", "max_steps", "num_train_epochs", "num_generations", "per_device_train_batch_size",
        "gradient_accumulation_steps", "generation_batch_size", "steps_per_generation", "max_completion_length",
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "beta", "loss_type", "scale_rewards",
        "reward_weights", "seed", "epsilon", "epsilon_high", "num_iterations", "importance_sampling_level",
        "mask_truncated_completions", "multi_objective_aggregation",
    ),
    "model": ("model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
              "load_in_4bit", "load_in_8bit"),
    "run": ("dataset", "max_prompt_tokens", "validation_rows", "reasoning_tag", "answer_tag", "warm_start_rows",
            "warm_start_learning_rate"),
}  # fmt: skip


def latest(values: dict) -> str | None:
    """`--resume_from_checkpoint latest`: the newest complete checkpoint (saying which newer ones are incomplete);
    for a run continued from another folder that saved none yet, the one it continues; None for a fresh start."""
    asked = values["resume_from_checkpoint"]
    folders = layout.checkpoints(output_dir := values["output_dir"])
    missing = [missing_parts(folder) for folder in folders]
    newest = max((i for i, parts in enumerate(missing) if not parts), default=-1)  # the newest complete one
    path = str(folders[newest]) if newest >= 0 else None
    for folder, parts in list(zip(folders, missing, strict=True))[newest + 1 :]:
        logger.warning("Skipping %s: incomplete, without %s", folder, ", ".join(parts))
    model_only = [f for f, parts in zip(folders, missing, strict=True) if parts == layout.MODEL_ONLY_PARTS]
    continued = (layout.read_record(output_dir) or {}).get("continues")
    if path is None and continued and trains(values):  # a run continued from another folder, stopped before it
        path = continued  # saved a checkpoint of its own: from the one it continues, again
        logger.info("--resume_from_checkpoint %s: no checkpoint in %s yet: from %s, which it continues", asked,
                    output_dir, continued)  # fmt: skip
    if path is None and model_only and trains(values):  # a retry on a stop under --save_only_model
        raise RecipeError(
            f"--resume_from_checkpoint {asked}: {model_only[-1]} holds the model alone (--save_only_model true "
            "saved no optimizer state): no run resumes from it, and a new run here would write over it. Start a "
            f"new run from its weights: --model_name_or_path {model_only[-1]} --output_dir <another folder>"
        )
    if path is None:
        logger.warning("--resume_from_checkpoint %s: no complete checkpoint in %s: starting afresh", asked, output_dir)
    return path


def changed_settings(path: str, values: dict) -> tuple[list[str], str]:
    """`name: was -> now` for each setting fixed on resume that `values` changes from the run's record (a copied
    checkpoint's own state where there is none), and how they were read."""
    record, changed = layout.read_record(Path(path).parent), []  # the run the checkpoint belongs to
    held = "" if record else " (as the checkpoint's optimizer, scheduler and trainer state hold them)"
    record = record or {"settings": {"training": checkpoint_settings(path)}}  # a checkpoint copied on its own
    for section, names in FIXED_ON_RESUME.items():  # `name: was -> now` for each that differs from the record's
        stored = record.get("settings", {}).get(section, {})
        for name in (n for n in names if n in stored and values[n] is not None):  # None: derived from others
            old, new = stored[name], json.loads(json.dumps(values[name], default=str))
            if name in ("model_name_or_path", "dataset") and isinstance(old, str) and isinstance(new, str):
                old, new = (
                    str(Path(p).expanduser().resolve()) if Path(p).expanduser().exists() else p for p in (old, new)
                )
            if old != new and not (
                isinstance(old, list) and isinstance(new, list) and sorted(map(str, old)) == sorted(map(str, new))
            ):
                changed.append(f"{name}: {old} -> {new}")
    return changed, held


def resume(values: dict) -> str | None:
    """The checkpoint a run resumes from (`latest` resolved), None for a fresh start; refused when the run's fixed
    settings differ from its start's."""
    path = asked = values["resume_from_checkpoint"]
    if asked in RESUME_LATEST:
        path = latest(values)
    if not (path and trains(values)):
        return path
    step, end = layout.step_and_end(path, values["max_steps"])
    if 0 < end <= step:  # the last step: finished, or stopped in or after the final evaluation, before the model
        if finished(Path(path).parent, step):
            raise RecipeError(
                f"{path} is at step {step}, and this run ends at max_steps={end}: nothing to train. "
                "Train longer with a larger --max_steps (and --allow_changed_settings true), or start a new run"
            )
        logger.warning(
            "%s is the run's last step, and the run has no final model: finishing it (final evaluation, model)", path
        )
    changed, held = changed_settings(path, values)
    if changed:
        listed = "\n".join(f"  - {change}" for change in changed)
        if not values["allow_changed_settings"]:
            raise RecipeError(
                f"Resuming {path} with settings its run did not start with{held}:\n{listed}\n"
                "The checkpoint's optimizer and schedule follow the old ones: resume with the same settings, start "
                "a new run (another --output_dir), or resume anyway: --allow_changed_settings true"
            )
        logger.warning("Resuming with settings changed since the run's start (--allow_changed_settings):\n%s", listed)
    return path


def _torch_file(path: Path, mmap: bool = False, map_location: str | None = "cpu") -> dict | None:
    """A checkpoint's torch file, `weights_only` (nothing unpickled runs; {} when it holds no dict), None when absent
    or damaged in any way (DeepSpeed keeps its own optimizer); `mmap`: tensors mapped, not read (an optimizer's state
    is 12 bytes a parameter)."""
    import torch
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():
            loaded = torch.load(path, weights_only=True, mmap=mmap, map_location=map_location)
    except Exception:
        return None
    return loaded if isinstance(loaded, dict) else {}


def checkpoint_settings(checkpoint: str | Path) -> dict:
    """The fixed settings a checkpoint holds itself, for one copied without its run's record (not training_args.bin:
    only an unsafe unpickling reads it): the scheduler's base rate, the optimizer groups' betas and (decayed group's)
    weight_decay, and trainer_state.json's train_batch_size."""
    folder, found = Path(checkpoint), {}
    if rates := (_torch_file(folder / "scheduler.pt") or {}).get("base_lrs"):
        found["learning_rate"] = max(rates)
    optimizer = _torch_file(folder / "optimizer.pt", mmap=True) or {}
    groups = [g for g in optimizer.get("param_groups") or [] if "params" in g]
    if betas := [g["betas"] for g in groups if len(g.get("betas") or ()) == 2]:
        found["adam_beta1"], found["adam_beta2"] = (float(x) for x in betas[0])
    if decays := [g["weight_decay"] for g in groups if "weight_decay" in g]:
        found["weight_decay"] = max(decays)
    if isinstance(batch := (layout.read_state(folder) or {}).get("train_batch_size"), int):
        # The trainer's batch per process: per device x the GPUs it counts, which is one in every run of the recipe
        # (models.one_gpu sets the Trainer's count to 1 where a lone process sees several)
        found["per_device_train_batch_size"] = batch
    return found


def same_parameters(model, checkpoint: str | Path) -> None:
    """A resumed checkpoint's optimizer state is for the weights this run trains (their number and shapes): one of
    another model or adapter would fail in the optimizer's loading with a traceback of parameter groups."""
    from collections import Counter

    state = _torch_file(Path(checkpoint) / "optimizer.pt", mmap=True) or {}
    if not (groups := state.get("param_groups")):
        return  # none to compare (DeepSpeed keeps its own)
    trained = [p for p in model.parameters() if p.requires_grad]
    counted = sum(len(g.get("params") or []) for g in groups)
    moments = [s["exp_avg"] for s in (state.get("state") or {}).values() if "exp_avg" in s]
    if counted == len(trained) and not Counter(tuple(m.shape) for m in moments) - Counter(p.shape for p in trained):
        return
    size = f" ({held:,} parameters)" if (held := sum(m.numel() for m in moments)) else ""
    raise RecipeError(
        f"{checkpoint}: its optimizer state is for {counted} weight tensors{size}, and this run "
        f"trains {len(trained)} ({sum(p.numel() for p in trained):,}): the checkpoint is of another model or adapter. "
        "Resume it with the model and adapter settings it trained with, or start a new run (another --output_dir)"
    )


def finished(output_dir: str | Path, step: int) -> bool:
    """Whether the run in `output_dir` saved its final model after step `step`: its state (written after the model)
    at that step or later, and its weights whole."""
    folder = Path(output_dir)
    state = layout.read_state(folder)
    done = isinstance(state, dict) and (state.get("global_step") or 0) >= step and bool(layout.weight_files(folder))
    return done and all(whole(path) for path in folder.glob("*.safetensors"))


def same_data(train, run, training_args) -> None:
    """A resumed run trains on the data its start trained on (the run record's fingerprint)."""
    checkpoint = training_args.resume_from_checkpoint
    data = (layout.read_record(Path(checkpoint).parent) or {}).get("data") if checkpoint else None
    if data is None or (fingerprint := scoring.data_fingerprint(train)) == data.get("sha256"):
        return
    change = (
        f"the training data differ from the run's start: {len(train)} rows, sha256 {fingerprint[:12]}... "
        f"against {data.get('rows')} rows, {str(data.get('sha256'))[:12]}..."
    )
    if not run.allow_changed_settings:
        raise RecipeError(f"Resuming {checkpoint}: {change}. Resume on the same data, or --allow_changed_settings true")
    logger.warning("Resuming %s: %s (--allow_changed_settings)", checkpoint, change)


def same_data_order(trainer) -> None:
    """A run resumed in a later epoch trains on the prompts, in the order, of the run that never stopped. TRL's
    RepeatSampler shuffles each epoch with the next permutation of one generator seeded once, and the resumed Trainer
    makes a new sampler: it first draws the permutations of the epochs the checkpoint holds."""
    import torch
    from transformers import TrainerCallback

    made = patches.keep_train_sampler(trainer)

    class SameDataOrder(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            drawn = made[-1] if made else None
            if state.global_step == 0 or not getattr(drawn, "shuffle", False) or train_dataloader is None:
                return
            batches = len(train_dataloader)  # an epoch's optimizer steps, as the Trainer counts them when it resumes
            per_epoch = max(-(-batches // args.gradient_accumulation_steps), 1)
            for _ in range(state.global_step // per_epoch):
                torch.randperm(drawn.num_samples, generator=drawn.generator)

    trainer.add_callback(SameDataOrder())


# ---------------------------------------------- The run record --------------------------------------------------------
def package_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that change results; None for one that is absent."""
    return {"python": platform.python_version(), **{name: installed_version(name) for name in PACKAGES}}


def recipe_commit() -> dict[str, str | bool | None]:
    """The git commit of the recipe's own folder, and whether its tracked files were edited since."""
    folder = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None}


def hardware() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "gpu_count": len(gpus), "gpus": gpus,
            "cuda": torch.version.cuda}  # fmt: skip


def write_run_record(output_dir, settings: dict, dataset, seed: int, model: dict | None = None, resumed_from=None):
    """Write `<output_dir>/run_record.json` and return it. A resumed run keeps the record its start wrote (command,
    settings, commit) and adds an entry to its `resumes`: when, the command, the checkpoint, versions and commit."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    record = layout.read_record(output_dir) if resumed_from else None
    environment = {name: os.environ[name] for name in sorted(CONFIG_ENV) if name in os.environ}
    facts = {"recipe": recipe_commit(), "versions": package_versions(), "hardware": hardware(), "env": environment}
    if record is not None:
        record.setdefault("resumes", []).append({"at": now, "command": public(sys.argv), "from": resumed_from, **facts})
    else:
        plain = {name: a.to_dict() if hasattr(a, "to_dict") else dataclasses.asdict(a) for name, a in settings.items()}
        record = {"created": now, "command": public(sys.argv), "recipe": facts["recipe"], "seed": seed,
                  "versions": facts["versions"], "hardware": facts["hardware"], "env": environment,
                  "data": {"rows": len(dataset), "sha256": scoring.data_fingerprint(dataset)}, "model": model,
                  "settings": plain}  # fmt: skip
        if resumed_from:  # a checkpoint of another folder's run, continued in this one
            record["continues"] = str(resumed_from)
    path = layout.path(output_dir, layout.RECORD)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    logger.info("Run record: %s (data sha256 %s…)", path, record["data"]["sha256"][:12])
    return record


def model_facts(model) -> dict:
    """What the trainer loaded: dtypes, attention, parameters (whole under ZeRO-3, which shards them: `ds_numel`)."""
    params = list(model.parameters())
    groups = {"weights": params, "trainable": [p for p in params if p.requires_grad]}
    dtypes = {f"{k}_dtype": sorted({str(p.dtype).removeprefix("torch.") for p in g}) for k, g in groups.items()}
    counts = [sum(getattr(p, "ds_numel", None) or p.numel() for p in g) for g in groups.values()]
    attention = getattr(model.config, "_attn_implementation", None)
    return {**dtypes, "attention": attention, "parameters": counts[0], "trainable_parameters": counts[1]}


def start(trainer, settings: dict, dataset) -> dict | None:
    """Rotate the trainer's checkpoints by `rotate_checkpoints`, resume on the run's data order (`same_data_order`);
    write the run record (main process), link it from wandb, and note peak GPU memory into it at the end."""
    from transformers import TrainerCallback

    patches.rotate_after_save(trainer, rotate_checkpoints)
    same_data_order(trainer)
    args = trainer.args
    if args.resume_from_checkpoint:
        same_parameters(trainer.model, args.resume_from_checkpoint)
    if not trainer.accelerator.is_main_process:
        return None
    record = write_run_record(
        args.output_dir, settings, dataset, args.seed, model_facts(trainer.model), args.resume_from_checkpoint
    )

    class RunRecordCallbacks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            wandb = sys.modules.get("wandb")  # imported by its integration when it reports
            if wandb is not None and wandb.run is not None:
                link = {"run_record": str(layout.path(Path(args.output_dir).resolve(), layout.RECORD))}
                link |= {"data_sha256": record["data"]["sha256"], "recipe_commit": record["recipe"]["commit"]}
                wandb.run.config.update(link, allow_val_change=True)

        def on_train_end(self, args, state, control, **kwargs):
            import torch

            # Peak GPU memory of this process since it started, as torch's allocator counts it: the model, gradients,
            # optimizer, activations, evaluation, and vLLM's weights and KV cache when it runs colocated in this one.
            if torch.cuda.is_available():
                peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
                memory = dict(zip(("allocated", "reserved"), (round(b / 2**30, 2) for b in peak), strict=True))
                logger.info("Peak GPU memory: %.1f GiB allocated by torch, %.1f GiB reserved", *memory.values())
                record["peak_gpu_memory_gib"] = memory
                path = layout.path(args.output_dir, layout.RECORD)
                path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")

    trainer.add_callback(RunRecordCallbacks())
    return record
