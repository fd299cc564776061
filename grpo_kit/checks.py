"""Settings checked in the first seconds, before any model or data set is loaded; checkpoints found for resuming."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml

from grpo_kit import smoke

TAG_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
RESUME_LATEST = ("latest", "true", "True", "1")


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

    smoke_run = v["smoke"]
    generated = smoke_run and v["dataset"] == smoke.DATA_DIR  # written by the preset itself
    if v["dataset"] and not generated and not (Path(v["dataset"]) / "train.jsonl").is_file():
        problems.append(f"dataset={v['dataset']}: no train.jsonl there (a folder like GSM8K's, or leave it unset)")
    model = v["model_name_or_path"]
    local = model.startswith((".", "/", "~")) and not (smoke_run and model == smoke.MODEL_DIR)
    if local and not Path(model).expanduser().is_dir():
        problems.append(f"model_name_or_path={model}: no such folder (a local model folder or a Hub id)")

    resume, output_dir = v["resume_from_checkpoint"], v["output_dir"]
    if resume and resume not in RESUME_LATEST and not Path(resume).is_dir():
        problems.append(f"resume_from_checkpoint={resume}: no such folder (a checkpoint-N folder, or 'latest')")
    found = checkpoints(output_dir)
    if found and not resume and not (smoke_run and output_dir == smoke.SMOKE_DEFAULTS["output_dir"]):
        problems.append(
            f"output_dir={output_dir} already holds {found[-1].name}: resume it with --resume_from_checkpoint latest, "
            "or start a new run with another --output_dir"
        )
    return problems
