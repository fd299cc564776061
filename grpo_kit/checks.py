"""Settings checked in the first seconds, before any model or data set is loaded; checkpoints found for resuming."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from importlib import metadata
from pathlib import Path

import yaml

from grpo_kit import demo, smoke

TAG_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
RESUME_LATEST = ("latest", "true", "True", "1")
VLLM_RANGE = ("0.22.0", "0.31.0")  # the versions TRL 1.16 accepts (trl/import_utils.py, is_vllm_available)
GPU_EXTRAS = "pip install -r requirements-gpu.txt"


def read_config_flag(argv: list[str]) -> tuple[list[str], dict]:
    """Split `--config FILE` off the command line: the rest of it, and the YAML's values (its `env:` is applied)."""
    if "--config" not in argv:
        return argv, {}
    i = argv.index("--config")
    if i + 1 >= len(argv):
        sys.exit("--config needs a YAML file: --config recipe.yaml")
    path = Path(argv[i + 1])
    if not path.is_file():
        sys.exit(f"--config {path}: no such file")
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(values, dict):
        sys.exit(f"--config {path}: expected a mapping of setting: value")
    for key, value in (values.pop("env", None) or {}).items():
        os.environ[key] = str(value)
    return argv[:i] + argv[i + 2 :], values


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints (`checkpoint-N` holding a trainer_state.json) in `output_dir`, oldest first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("checkpoint-*") if p.name[11:].isdigit() and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[11:]))


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> str | None:
    """`latest` (or `true`) becomes the newest complete checkpoint in `output_dir`; a path stays a path."""
    if resume_from_checkpoint in RESUME_LATEST:
        found = checkpoints(output_dir)
        return str(found[-1]) if found else None
    return resume_from_checkpoint


def check_settings(values: dict, n_rewards: int, tags: tuple[str, str]) -> list[str]:
    """Every problem with the resolved settings that shows without loading anything: one line each, naming the
    setting and a value that works."""
    problems = []
    v = values
    for name in ("max_completion_length", "max_prompt_tokens", "per_device_train_batch_size"):
        if v[name] is None or v[name] <= 0:
            problems.append(f"{name}={v[name]}: must be a positive number of tokens or completions")
    for name in ("gradient_accumulation_steps", "save_steps", "logging_steps"):
        if v[name] <= 0:
            problems.append(f"{name}={v[name]}: must be at least 1")
    for name in ("eval_subset", "eval_batch_size", "eval_limit"):
        if v[name] is not None and v[name] <= 0:
            problems.append(f"{name}={v[name]}: must be at least 1")
    if v["eval_every_steps"] < 0:
        problems.append(f"eval_every_steps={v['eval_every_steps']}: 0 turns in-training accuracy off, N > 0 runs it")
    if v["learning_rate"] <= 0:
        problems.append(f"learning_rate={v['learning_rate']}: must be positive (the recipe uses 5e-6)")

    n_gen = v["num_generations"]
    if n_gen is None or n_gen < 2:
        problems.append(
            f"num_generations={n_gen}: GRPO compares completions within a group, so it needs at least 2 "
            "(the recipe uses 16)"
        )
    elif v["per_device_train_batch_size"] and v["per_device_train_batch_size"] > 0:
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        per_step = v["per_device_train_batch_size"] * processes
        steps = v["steps_per_generation"] or v["gradient_accumulation_steps"]
        batch = v["generation_batch_size"] or per_step * steps
        if batch % n_gen:
            problems.append(
                f"generation batch {batch} completions (per_device_train_batch_size {v['per_device_train_batch_size']}"
                f" x {processes} process(es) x {steps} steps) is not divisible by num_generations={n_gen}: "
                f"use --per_device_train_batch_size {n_gen} (one prompt's completions per device step)"
            )

    weights = v["reward_weights"]
    if weights is not None and len(weights) != n_rewards:
        problems.append(f"reward_weights has {len(weights)} values for {n_rewards} rewards: give {n_rewards}")

    reasoning, answer = tags
    for name, tag in (("REASONING_TAG", reasoning), ("ANSWER_TAG", answer)):
        if not TAG_RE.fullmatch(tag):
            problems.append(f"{name}={tag!r}: a tag name is a letter then letters, digits, '_' or '-' (e.g. 'think')")
    if reasoning == answer:
        problems.append(f"REASONING_TAG and ANSWER_TAG are both {reasoning!r}: they must differ")

    if v["smoke"] and v.get("demo"):
        problems.append("--smoke and --demo are two presets: choose one")
    preset = smoke if v["smoke"] else demo if v.get("demo") else None
    preset_output = {smoke: smoke.SMOKE_DEFAULTS, demo: demo.DEMO_DEFAULTS}.get(preset, {}).get("output_dir")
    generated = preset is not None and v["dataset"] == preset.DATA_DIR  # written by the preset itself
    if v["dataset"] and not generated and not (Path(v["dataset"]) / "train.jsonl").is_file():
        problems.append(f"dataset={v['dataset']}: no train.jsonl there (a folder like GSM8K's, or leave it unset)")
    model = v["model_name_or_path"]
    local = model.startswith((".", "/", "~")) and not (preset is not None and model == preset.MODEL_DIR)
    if local and not Path(model).expanduser().is_dir():
        problems.append(f"model_name_or_path={model}: no such folder (a local model folder or a Hub id)")

    resume, output_dir = v["resume_from_checkpoint"], v["output_dir"]
    if resume and resume not in RESUME_LATEST and not Path(resume).is_dir():
        problems.append(f"resume_from_checkpoint={resume}: no such folder (a checkpoint-N folder, or 'latest')")
    found = checkpoints(output_dir)
    trains = not (v["eval_only"] or v["ask"])
    if found and trains and not resume and output_dir != preset_output:
        problems.append(
            f"output_dir={output_dir} already holds {found[-1].name}: resume it with --resume_from_checkpoint latest, "
            "or start a new run with another --output_dir"
        )
    return problems + scale_problems(v)


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


def scale_problems(v: dict) -> list[str]:
    """LoRA, QLoRA, vLLM and DeepSpeed settings that cannot work on this machine or together: one line each."""
    from packaging.version import Version

    problems = []
    use_peft, zero_stage = v.get("use_peft"), os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if use_peft and v.get("lora_r") is not None and v["lora_r"] <= 0:
        problems.append(f"lora_r={v['lora_r']}: the adapter's rank must be at least 1 (the recipe uses 16)")

    bits = [name for name in ("load_in_4bit", "load_in_8bit") if v.get(name)]
    if len(bits) == 2:
        problems.append("load_in_4bit and load_in_8bit are both set: choose one (--load_in_4bit is QLoRA)")
    for name in bits[:1]:
        if not use_peft:
            problems.append(
                f"{name}: a quantized base model cannot be trained itself, only adapters on it: "
                f"add --use_peft (QLoRA), or drop --{name} to train the full model"
            )
        if not cuda_available():
            problems.append(
                f"{name} needs a CUDA GPU (bitsandbytes' quantized kernels) and this machine has none: "
                f"drop --{name} and train LoRA in full precision with --use_peft alone"
            )
        elif installed_version("bitsandbytes") is None:
            problems.append(
                f"{name} needs bitsandbytes, which is not installed: {GPU_EXTRAS} "
                "(or drop it and train LoRA in full precision with --use_peft alone)"
            )
        if zero_stage == "3" and name == "load_in_8bit":
            problems.append("load_in_8bit does not shard under DeepSpeed ZeRO-3: use --load_in_4bit, or ZeRO-2")
        storage = v.get("bnb_4bit_quant_storage")
        if zero_stage == "3" and name == "load_in_4bit" and storage not in ("bfloat16", "float16", "float32"):
            problems.append(
                "load_in_4bit under DeepSpeed ZeRO-3 packs the 4-bit weights in a float dtype so they can be "
                "sharded: add --bnb_4bit_quant_storage bfloat16"
            )

    if v.get("use_vllm"):
        version = installed_version("vllm")
        low, high = VLLM_RANGE
        if version is None:
            problems.append(
                f"use_vllm: vllm is not installed: {GPU_EXTRAS} (CUDA only), "
                "or drop --use_vllm to generate with transformers"
            )
        elif not Version(low) <= Version(Version(version).base_version) <= Version(high):
            problems.append(f"use_vllm: vllm {version} is installed, TRL 1.16 works with {low} to {high}: {GPU_EXTRAS}")
        elif not cuda_available():
            problems.append("use_vllm needs a CUDA GPU and this machine has none: drop --use_vllm")
        if v.get("vllm_mode") not in ("colocate", "server"):
            problems.append(
                f"vllm_mode={v.get('vllm_mode')}: 'colocate' (vLLM inside each training process) or 'server' "
                "(a separate `trl vllm-serve`)"
            )
        utilization = v.get("vllm_gpu_memory_utilization")
        if v.get("vllm_mode") == "colocate" and utilization is not None and not 0 < utilization < 1:
            problems.append(
                f"vllm_gpu_memory_utilization={utilization}: the share of each GPU vLLM may take beside training, "
                "between 0 and 1 (0.3 leaves the rest to the model, its gradients and the optimizer)"
            )
    return problems
