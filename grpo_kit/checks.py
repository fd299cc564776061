"""Settings checked in the first seconds, before any model or data set is loaded; checkpoints found for resuming.

Each check is a small function of the resolved settings (a dict of every field's value) that returns one line
per problem, naming the setting and a value that works. Checks that TRL or transformers also make are repeated
only where they would otherwise fail later (after the model has loaded) or with a message that names no fix.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import zipfile
from importlib import metadata
from pathlib import Path

from grpo_kit import folders, presets, smoke
from grpo_kit.models import GPU_EXTRAS

TAG_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
RESUME_LATEST = ("latest", "true", "True", "1")
VLLM_RANGE = ("0.22.0", "0.31.0")  # the versions TRL 1.16 accepts (trl/import_utils.py, is_vllm_available)
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


def world_size() -> int:
    """Processes of this run (`accelerate launch` / torchrun set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def zero_stage() -> str | None:
    """The DeepSpeed ZeRO stage `accelerate launch` runs under, None without DeepSpeed."""
    return os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") if os.environ.get("ACCELERATE_USE_DEEPSPEED") else None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def installed_version(package: str) -> str | None:
    """The installed version of `package`, None when it is absent (found without importing it: cheap)."""
    if importlib.util.find_spec(package.replace("-", "_")) is None:
        return None
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints


WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """Every `checkpoint-N` folder in `output_dir`, complete or not, oldest first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("checkpoint-*") if p.name[11:].isdigit() and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name[11:]))


def missing_parts(checkpoint: str | Path) -> list[str]:
    """What a resume needs that `checkpoint` lacks (files absent, truncated or damaged); empty when complete."""
    folder = Path(checkpoint)
    state = folder / "trainer_state.json"
    whole_state = isinstance(folders.read_json(state), dict)
    missing = [] if whole_state else [f"{state.name}{' (damaged)' if state.is_file() else ''}"]
    weights = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        missing.append("its weights (model.safetensors or adapter_model.safetensors)")
    for path in weights:
        if path.name.endswith(".index.json"):
            index = folders.read_json(path)
            shards = index.get("weight_map", {}).values() if isinstance(index, dict) else ["(a damaged index)"]
            missing += [f"{name} (a shard)" for name in sorted(set(shards)) if not _whole(folder / name)]
        elif path.suffix == ".safetensors" and not _whole(path):
            missing.append(f"{path.name} (truncated or damaged)")
    if not any(folder.glob("global_step*")):  # DeepSpeed keeps the optimizer there instead
        for name in ("optimizer.pt", "scheduler.pt"):
            path = folder / name
            if not path.is_file():
                missing.append(name)
            elif not zipfile.is_zipfile(path) or (name == "scheduler.pt" and not _loads(path)):
                missing.append(f"{name} (truncated or damaged)")  # torch.save writes a zip; a cut one has no end
    rng = sorted(folder.glob("rng_state*.pth"))
    missing += [f"{path.name} (truncated or damaged)" for path in rng if not _loads(path)]
    if not rng:
        missing.append("rng_state.pth")
    return missing


def _loads(path: Path) -> bool:
    """Whether a small torch file (scheduler, RNG state) loads as a resume will load it. The optimizer's state is
    too large to read here (12 bytes a parameter): only its zip structure is checked."""
    import torch
    from transformers.trainer_pt_utils import safe_globals

    if not zipfile.is_zipfile(path):
        return False
    try:
        with safe_globals():
            torch.load(path, weights_only=True)
    except Exception:  # any damage: a zip entry's CRC, an unpickling error, a wrong type
        return False
    return True


def _whole(path: Path) -> bool:
    """Whether a safetensors file holds every byte its header promises (a cut file does not)."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size >= 8 + size + end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints (`missing_parts` empty) in `output_dir`, oldest first."""
    return [p for p in checkpoint_folders(output_dir) if not missing_parts(p)]


def trains(v: dict) -> bool:
    """Whether the settings ask for a training run (not --eval_only, not --ask)."""
    return not (v["eval_only"] or v["ask"] is not None)


# Settings a resumed run cannot change without training differently from the run it continues: the optimizer and
# its schedule, the batch and groups, the model and its adapter, the data. (name, the run record's section)
FIXED_ON_RESUME = (
    *[
        (name, "training")
        for name in (
            "learning_rate", "lr_scheduler_type", "warmup_steps", "adam_beta1", "adam_beta2", "weight_decay",
            "max_grad_norm", "max_steps", "num_train_epochs", "num_generations", "per_device_train_batch_size",
            "gradient_accumulation_steps", "generation_batch_size", "steps_per_generation", "max_completion_length",
            "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "beta", "loss_type", "scale_rewards",
            "reward_weights", "seed", "epsilon", "epsilon_high", "num_iterations", "importance_sampling_level",
            "mask_truncated_completions", "multi_objective_aggregation",
        )
    ],
    *[
        (name, "model")
        for name in (
            "model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
            "load_in_4bit", "load_in_8bit",
        )
    ],
    ("dataset", "run"),
    ("max_prompt_tokens", "run"),
    ("validation_rows", "run"),
    ("reasoning_tag", "run"),
    ("answer_tag", "run"),
)  # fmt: skip


def changed_since_start(v: dict, record: dict) -> list[str]:
    """`name: was -> now` for each FIXED_ON_RESUME setting that differs from the run record's."""
    changed = []
    for name, section in FIXED_ON_RESUME:
        stored = record.get("settings", {}).get(section, {})
        if name not in stored:
            continue
        old, new = stored[name], json.loads(json.dumps(v[name], default=str))
        if new is None:  # not set: derived from the others (generation_batch_size), which are compared
            continue
        if name in ("model_name_or_path", "dataset") and isinstance(old, str) and isinstance(new, str):
            old, new = (str(Path(p).expanduser().resolve()) if Path(p).expanduser().exists() else p for p in (old, new))
        if old != new and not (
            isinstance(old, list) and isinstance(new, list) and sorted(map(str, old)) == sorted(map(str, new))
        ):
            changed.append(f"{name}: {old} -> {new}")
    return changed


# ----------------------------------------------------------------------------------------------------------------
# The checks


def problems(v: dict, *, n_rewards: int) -> list[str]:
    """Every problem with the resolved settings `v` that shows without loading anything."""
    preset = presets.chosen(v)
    return [
        *sizes(v),
        *groups_fit_the_batch(v),
        *reward_weights(v, n_rewards),
        *tag_names(v),
        *local_paths(v, preset),
        *output_folder(v),
        *existing_checkpoints(v, preset),
        *adapters(v),
        *quantization(v),
        *optimizer(v),
        *vllm(v),
        *generation_precision(v),
        *evaluation_processes(v),
        *evaluation_protocols(v),
        *health_checks(v),
    ]


def _finite(low: float, high: float, low_open: bool = False, high_open: bool = False):
    def ok(x) -> bool:
        return math.isfinite(x) and (x > low if low_open else x >= low) and (x < high if high_open else x <= high)

    return ok


# Settings that transformers, TRL or PEFT would refuse only after the model loaded (or never, training on NaN).
RANGES = {
    "weight_decay": (_finite(0, math.inf), "must be a finite number, 0 or more (the recipe uses 0.1)"),
    "adam_beta1": (_finite(0, 1, high_open=True), "must be in [0, 1) (the recipe uses 0.9)"),
    "adam_beta2": (_finite(0, 1, high_open=True), "must be in [0, 1) (the recipe uses 0.99)"),
    "adam_epsilon": (_finite(0, math.inf, low_open=True), "must be positive"),
    "max_grad_norm": (_finite(0, math.inf), "must be a finite number, 0 or more (the recipe uses 0.1)"),
    "warmup_steps": (_finite(0, math.inf), "must be 0 or more: a fraction below 1, or a number of steps"),
    "num_train_epochs": (lambda x: math.isfinite(x), "must be a finite number"),
    "top_p": (_finite(0, 1, low_open=True), "must be in (0, 1]"),
    "top_k": (lambda x: x >= 0, "must be 0 (off) or more"),
    "repetition_penalty": (_finite(0, math.inf, low_open=True), "must be positive (1.0 is none)"),
    "steps_per_generation": (lambda x: x >= 1, "must be at least 1"),
    "num_iterations": (lambda x: x >= 1, "must be at least 1"),
    "epsilon": (_finite(0, math.inf, low_open=True), "must be positive (TRL's clipping range, 0.2)"),
    "lora_dropout": (_finite(0, 1, high_open=True), "must be in [0, 1)"),
    "beta": (_finite(0, math.inf), "must be 0 (no KL) or more"),
}


def sizes(v: dict) -> list[str]:
    out = []
    for name in ("max_completion_length", "max_prompt_tokens", "per_device_train_batch_size"):
        if v[name] is None or v[name] <= 0:
            out.append(f"{name}={v[name]}: must be a positive number of tokens or completions")
    for name in ("gradient_accumulation_steps", "save_steps", "logging_steps"):
        if v[name] <= 0:
            out.append(f"{name}={v[name]}: must be at least 1")
    for name in ("eval_subset", "eval_batch_size", "eval_limit"):
        if v[name] is not None and v[name] <= 0:
            out.append(f"{name}={v[name]}: must be at least 1")
    if v["validation_rows"] < 0:
        out.append(f"validation_rows={v['validation_rows']}: the train rows held out for validation, 0 or more")
    if v["eval_split"] == "validation" and v["validation_rows"] <= 0:
        out.append(
            "eval_split=validation measures the train rows --validation_rows holds out: set how many "
            "(e.g. --validation_rows 500), or --eval_split test"
        )
    if v["eval_every_steps"] < 0:
        out.append(f"eval_every_steps={v['eval_every_steps']}: 0 turns in-training accuracy off, N > 0 runs it")
    if not (math.isfinite(v["learning_rate"]) and v["learning_rate"] > 0):
        out.append(f"learning_rate={v['learning_rate']}: must be a positive number (the recipe uses 5e-6)")
    if not (math.isfinite(v["temperature"]) and v["temperature"] > 0):
        out.append(f"temperature={v['temperature']}: sampling needs a positive temperature (the recipe uses 0.9)")
    if not 0 <= v["seed"] < 2**32:
        out.append(f"seed={v['seed']}: must be from 0 to 2**32 - 1 (numpy's range)")
    out += [
        f"{name}={v[name]}: {rule}"
        for name, (ok, rule) in RANGES.items()
        if v.get(name) is not None and not ok(v[name])
    ]
    if v["eval_only"] and v["ask"] is not None:
        out.append("eval_only and ask are two modes: choose one")
    if (v["eval_only"] or v["ask"] is not None) and v["resume_from_checkpoint"]:
        out.append(
            "resume_from_checkpoint is for training: to evaluate or ask a checkpoint, "
            "--model_name_or_path <run>/checkpoint-N"
        )
    no_steps = v["max_steps"] == 0 or v["max_steps"] < -1 or (v["max_steps"] == -1 and v["num_train_epochs"] <= 0)
    if trains(v) and no_steps:
        out.append(
            f"max_steps={v['max_steps']}, num_train_epochs={v['num_train_epochs']}: this run would train nothing "
            "(max_steps N > 0, or -1 with num_train_epochs > 0)"
        )
    if v["ask"] is not None and not v["ask"].strip():
        out.append('ask is empty: give the question to answer, --ask "A train leaves at 3 pm..."')
    return out


def groups_fit_the_batch(v: dict) -> list[str]:
    """TRL checks this too, but only once GRPOConfig is built, and without naming a value that works."""
    n_gen, per_device = v["num_generations"], v["per_device_train_batch_size"]
    if n_gen is None or n_gen < 2:
        return [
            f"num_generations={n_gen}: GRPO compares completions within a group, so it needs at least 2 "
            "(the recipe uses 16)"
        ]
    if not per_device or per_device <= 0:
        return []
    processes = world_size()
    steps = v["steps_per_generation"] or v["gradient_accumulation_steps"]
    batch = v["generation_batch_size"] or per_device * processes * steps
    if batch % n_gen == 0:
        return []
    return [
        f"generation batch {batch} completions (per_device_train_batch_size {per_device} x {processes} process(es)"
        f" x {steps} steps) is not divisible by num_generations={n_gen}: "
        f"use --per_device_train_batch_size {n_gen} (one prompt's completions per device step)"
    ]


def reward_weights(v: dict, n_rewards: int) -> list[str]:
    weights = v["reward_weights"]
    if weights is not None and len(weights) != n_rewards:
        return [f"reward_weights has {len(weights)} values for {n_rewards} rewards: give {n_rewards}"]
    return []


def tag_names(v: dict) -> list[str]:
    """The answer format's tags: names TRL's logs and the tokenizer treat as one word, and two different ones."""
    out = [
        f"{name}={v[name]!r}: a tag's name is a letter, then letters, digits, '_' or '-' (e.g. think, for <think>)"
        for name in ("reasoning_tag", "answer_tag")
        if not TAG_NAME_RE.fullmatch(v[name])
    ]
    if v["reasoning_tag"] == v["answer_tag"]:
        out.append(f"reasoning_tag and answer_tag are both {v['answer_tag']!r}: the two blocks need different tags")
    return out


def local_paths(v: dict, preset) -> list[str]:
    out = []
    dataset, model = v["dataset"], v["model_name_or_path"]
    if dataset and not presets.writes(preset, "dataset", dataset) and not (Path(dataset) / "train.jsonl").is_file():
        out.append(f"dataset={dataset}: no train.jsonl there (a folder like GSM8K's, or leave it unset)")
    folder = Path(model).expanduser()
    # A Hub id is `org/name`: a path with more parts, or under a folder that exists here, is a local path.
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or Path(folder.parts[0]).is_dir()
    local = looks_local and not presets.writes(preset, "model_name_or_path", model)
    if local and not folder.is_dir():
        out.append(f"model_name_or_path={model}: no such folder (a local model folder or a Hub id)")
    elif folder.is_dir() and not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):
        found = checkpoint_folders(folder)
        hint = f": its newest checkpoint is {found[-1]}" if found else " (a saved model or adapter folder)"
        out.append(f"model_name_or_path={model}: no model in it, no config.json or adapter_config.json{hint}")
    elif folder.is_dir() and (cut := [p.name for p in sorted(folder.glob("*.safetensors")) if not _whole(p)]):
        out.append(f"model_name_or_path={model}: {', '.join(cut)} truncated or damaged (a copy or download cut short?)")
    resume = v["resume_from_checkpoint"]
    if resume and resume not in RESUME_LATEST and not Path(resume).is_dir():
        out.append(f"resume_from_checkpoint={resume}: no such folder (a checkpoint-N folder, or 'latest')")
    elif resume and resume not in RESUME_LATEST and (missing := missing_parts(resume)):
        found = checkpoints(Path(resume).parent)
        other = f"; the newest complete one is {found[-1]}" if found else ""
        out.append(f"resume_from_checkpoint={resume}: incomplete, without {', '.join(missing)}{other}")
    return out


def output_folder(v: dict) -> list[str]:
    """The output folder can be made and written: not empty, not a file, on a writable disk."""
    output_dir = v["output_dir"]
    if not output_dir or not str(output_dir).strip():
        return ["output_dir is empty: name a folder for checkpoints and results (--output_dir outputs/my-run)"]
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        return [f"output_dir={output_dir}: a file is there, not a folder: choose another --output_dir"]
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"output_dir={output_dir}: {existing} cannot be written to: choose another --output_dir"]
    if trains(v) and path.is_dir() and path.resolve() == Path(v["model_name_or_path"]).expanduser().resolve():
        return [f"output_dir={output_dir} is the start model's folder: training would overwrite it; choose another"]
    if trains(v) and path.is_dir() and not (path / "run_record.json").is_file():
        # Without a run record, only what a run alone makes (checkpoints, evaluations): not a model, not notes.
        others = sorted(p.name for p in path.iterdir() if not any(p.match(x) for x in folders.RUN_ONLY_ENTRIES))
        if others:
            return [
                f"output_dir={output_dir} holds files that are not a run's ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}), which a run would write over: choose another --output_dir"
            ]
    return []


def existing_checkpoints(v: dict, preset) -> list[str]:
    """A training run never writes over another run's checkpoints (a preset restarts its own folder)."""
    output_dir = v["output_dir"]
    found = checkpoint_folders(output_dir)  # incomplete ones too: they belong to a run as well
    if found and trains(v) and not v["resume_from_checkpoint"] and not presets.writes(preset, "output_dir", output_dir):
        return [
            f"output_dir={output_dir} already holds {found[-1].name}: resume it with --resume_from_checkpoint latest, "
            "or start a new run with another --output_dir"
        ]
    return []


def adapters(v: dict) -> list[str]:
    if v["use_peft"] and v["lora_r"] is not None and v["lora_r"] <= 0:
        return [f"lora_r={v['lora_r']}: the adapter's rank must be at least 1 (the recipe uses 16)"]
    return []


def quantization(v: dict) -> list[str]:
    bits = [name for name in ("load_in_4bit", "load_in_8bit") if v[name]]
    if len(bits) == 2:  # ModelConfig raises too, once built, without saying which one is QLoRA
        return ["load_in_4bit and load_in_8bit are both set: choose one (--load_in_4bit is QLoRA)"]
    out = []
    for name in bits:
        if not v["use_peft"]:
            out.append(
                f"{name}: a quantized base model cannot be trained itself, only adapters on it: "
                f"add --use_peft (QLoRA), or drop --{name} to train the full model"
            )
        if not cuda_available():
            out.append(
                f"{name} needs a CUDA GPU (bitsandbytes' quantized kernels) and this machine has none: "
                f"drop --{name} and train LoRA in full precision with --use_peft alone"
            )
        elif installed_version("bitsandbytes") is None:
            out.append(
                f"{name} needs bitsandbytes, which is not installed: {GPU_EXTRAS} "
                "(or drop it and train LoRA in full precision with --use_peft alone)"
            )
        if zero_stage() == "3" and name == "load_in_8bit":
            out.append("load_in_8bit does not shard under DeepSpeed ZeRO-3: use --load_in_4bit, or ZeRO-2")
        if zero_stage() == "3" and name == "load_in_4bit" and v["bnb_4bit_quant_storage"] not in FLOAT_DTYPES:
            out.append(
                "load_in_4bit under DeepSpeed ZeRO-3 packs the 4-bit weights in a float dtype so they can be "
                "sharded: add --bnb_4bit_quant_storage bfloat16"
            )
        if v["use_vllm"]:
            # trl/generation/vllm_generation.py syncs weights by merge_adapter() / unmerge_adapter(), which for a
            # bitsandbytes base dequantizes, adds and requantizes through the CPU (peft/tuners/lora/bnb.py): every
            # step adds requantization noise to the frozen base.
            out.append(
                f"{name} with use_vllm: every weight sync would merge the adapter into the quantized base and "
                "requantize it, so the frozen base drifts each step: drop --use_vllm (generate with transformers), "
                f"or drop --{name} (LoRA on the bf16 base works with vLLM)"
            )
    return out


# transformers' optimizers that bitsandbytes implements (OptimizerNames): 8-bit states, paged memory.
BNB_OPTIMIZERS = {
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "lion_8bit", "lion_32bit",
    "paged_lion_32bit", "paged_lion_8bit", "ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
}  # fmt: skip


def optimizer(v: dict) -> list[str]:
    """A bitsandbytes optimizer (configs/unsloth_llama8b_qlora.yaml's paged 8-bit AdamW) fails only once the model
    has loaded, at the first step, without either."""
    name = str(v["optim"])
    if name not in BNB_OPTIMIZERS:
        return []
    if not cuda_available():
        return [
            f"optim={name} is a bitsandbytes optimizer, for CUDA GPUs, and this machine has none: "
            "--optim adamw_torch (the recipe's AdamW)"
        ]
    if installed_version("bitsandbytes") is None:
        return [f"optim={name} needs bitsandbytes, which is not installed: {GPU_EXTRAS} (or --optim adamw_torch)"]
    return []


def vllm(v: dict) -> list[str]:
    if not v["use_vllm"]:
        return []
    from packaging.version import Version

    out = []
    version, (low, high) = installed_version("vllm"), VLLM_RANGE
    if version is None:
        out.append(
            f"use_vllm: vllm is not installed: {GPU_EXTRAS} (CUDA only), "
            "or drop --use_vllm to generate with transformers"
        )
    elif not Version(low) <= Version(Version(version).base_version) <= Version(high):
        out.append(f"use_vllm: vllm {version} is installed, TRL 1.16 works with {low} to {high}: {GPU_EXTRAS}")
    elif not cuda_available():
        out.append("use_vllm needs a CUDA GPU and this machine has none: drop --use_vllm")
    if v["vllm_mode"] not in ("colocate", "server"):
        out.append(
            f"vllm_mode={v['vllm_mode']}: 'colocate' (vLLM inside each training process) or 'server' "
            "(a separate `trl vllm-serve`)"
        )
    utilization = v["vllm_gpu_memory_utilization"]
    if utilization is not None and not 0 < utilization < 1:
        out.append(
            f"vllm_gpu_memory_utilization={utilization}: the share of each GPU vLLM may take, between 0 and 1 "
            "(0.3 beside training leaves the rest to the model, its gradients and the optimizer)"
        )
    return out


def generation_precision(v: dict) -> list[str]:
    """trl 1.16 casts the whole model to bf16 (fp16) in place before every continuous-batching generation
    (grpo_trainer.py, `_generate_single_turn`: `unwrapped_model.to(torch.bfloat16)`), which throws away fp32
    weights, and the fp32 adapters PEFT makes even on a half-precision base."""
    if not v["use_transformers_continuous_batching"]:
        return []
    half = "bfloat16" if v["bf16"] else "float16" if v["fp16"] else None
    if half and (v["use_peft"] or v["dtype"] != half):
        return [
            f"use_transformers_continuous_batching: TRL casts the model to {half} in place before each such "
            "generation, which would drop this run's fp32 weights (or fp32 LoRA adapters): generate with vLLM "
            "(--use_vllm) or with transformers' generate (the default)"
        ]
    return []


def evaluation_processes(v: dict) -> list[str]:
    """What evaluation can do under several processes (it runs collectively: each process a shard)."""
    if world_size() > 1 and v["ask"] is not None:
        return [
            "ask answers one question in one process: start it with python, not accelerate launch "
            "(under ZeRO-3 a model loaded by one process alone would wait for the others forever)"
        ]
    if not (v["eval_only"] and world_size() > 1):
        return []
    out = []
    if v["use_vllm"]:
        out.append(
            "eval_only with use_vllm runs one vLLM engine, in one process: start it with python, not accelerate "
            "launch (vLLM spreads over GPUs itself: --vllm_tensor_parallel_size N)"
        )
    if zero_stage() == "3":
        out.append(
            "eval_only under DeepSpeed ZeRO-3 would shard the weights it only reads: launch it with "
            "--config_file configs/ddp.yaml (each process evaluates its share of the questions on a full copy)"
        )
    return out


def updates_per_generation(v: dict) -> float:
    """Optimizer steps each generation batch serves (TRL's steps_per_generation or generation_batch_size, over the
    accumulation), times num_iterations: above 1, the policy has moved since it sampled, and its ratio leaves 1."""
    accumulation = v["gradient_accumulation_steps"]
    steps = v["steps_per_generation"]
    if steps is None and v["generation_batch_size"]:
        steps = v["generation_batch_size"] / (v["per_device_train_batch_size"] * world_size())
    return (steps or accumulation) / accumulation * v["num_iterations"]


def warnings(v: dict) -> list[str]:
    """Settings that work but are probably not what the user wants: one line each."""
    out = []
    if v.get("eval_temperature") is not None and not v.get("eval_samples"):
        out.append("eval_temperature is the temperature of eval_samples, which is 0: no samples are drawn")
    if v["tiny_model"] != smoke.TINY_MODELS[0] and presets.chosen(v) is None:
        out.append(
            f"tiny_model={v['tiny_model']} chooses the model of --smoke and --demo only: this run trains "
            f"{v['model_name_or_path']}"
        )
    clipping = [
        f"{name}={v[name]}"
        for name, default in (("epsilon_high", None), ("epsilon", 0.2), ("importance_sampling_level", "token"))
        if v[name] != default
    ]
    if clipping and updates_per_generation(v) <= 1 and not v["use_vllm"]:
        out.append(
            f"{', '.join(clipping)}: clipping acts only where the policy has moved since it sampled, and here each "
            "generation batch serves one update, so the ratio stays 1 and nothing is clipped: "
            f"--steps_per_generation {4 * v['gradient_accumulation_steps']} (4 updates a batch, as configs/dapo.yaml)"
        )
    if v["multi_objective_aggregation"] == "normalize_then_sum" and v["scale_rewards"] != "group":
        out.append(
            f"scale_rewards={v['scale_rewards']} is not used with multi_objective_aggregation=normalize_then_sum: "
            "TRL normalises each reward in its group, then the sum over the batch"
        )
    full_bf16 = v["dtype"] in ("bfloat16", "float16") and not v["use_peft"] and zero_stage() is None
    if full_bf16 and not v["use_cpu"]:
        out.append(
            f"dtype={v['dtype']} with full fine-tuning: AdamW updates {v['dtype']} weights in place, and updates "
            f"below half their spacing round away (most of them at lr {v['learning_rate']}); leave --dtype unset "
            "for fp32 weights with bf16 compute, or use DeepSpeed (which keeps fp32 master weights)"
        )
    return out


def evaluation_protocols(v: dict) -> list[str]:
    from grpo_kit.protocols import PROTOCOLS

    out = []
    unknown = [name for name in v.get("eval_protocols") or [] if name not in PROTOCOLS]
    if unknown:
        out.append(f"eval_protocols: {', '.join(unknown)}: no such protocol (the protocols: {', '.join(PROTOCOLS)})")
    if not 1 <= v["eval_shots"] <= 32:
        out.append(f"eval_shots={v['eval_shots']}: the kshot protocol shows 1 to 32 worked examples (lm-eval: 5, 8)")
    if v["eval_samples"] < 0:
        out.append(f"eval_samples={v['eval_samples']}: 0 (greedy only) or the samples per question for pass@k")
    temperature = v.get("eval_temperature")
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        out.append(f"eval_temperature={temperature}: sampling needs a positive temperature")
    return out


def health_checks(v: dict) -> list[str]:
    from grpo_kit.health import CHECKS

    unknown = [name for name in v.get("health_checks_off") or [] if name not in (*CHECKS, "all")]
    if unknown:
        return [f"health_checks_off: {', '.join(unknown)}: no such check (the checks: {', '.join(CHECKS)}; or all)"]
    return []
