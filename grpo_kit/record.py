"""The run record: everything needed to tell later what a run was (settings, versions, code, hardware, data)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from grpo_kit.checks import installed_version
from grpo_kit.folders import read_json

logger = logging.getLogger("grpo_demo")

RECORD_NAME = "run_record.json"
PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "wandb", "flash-attn", "vllm")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that change results; None for one that is absent."""
    return {"python": platform.python_version(), **{name: installed_version(name) for name in PACKAGES}}


def recipe_commit() -> dict[str, str | bool | None]:
    """The git commit of the recipe's own folder, and whether its tracked files were edited since."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(dirty) if commit else None}


def hardware() -> dict:
    import torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpu_count": len(gpus),
        "gpus": gpus,
        "cuda": torch.version.cuda,
    }


def data_fingerprint(dataset) -> str:
    """sha256 over the training rows as the trainer sees them (prompt and gold answer), in order."""
    digest = hashlib.sha256()
    for prompt, answer in zip(dataset["prompt"], dataset["answer"], strict=True):
        digest.update(json.dumps([prompt, answer], sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def write_run_record(
    output_dir: str, settings: dict, dataset, seed: int, model: dict | None = None, resumed_from: str | None = None
) -> dict:
    """Write `<output_dir>/run_record.json` and return it. A resumed run keeps the record its start wrote (command,
    settings, commit) and adds an entry to its `resumes`: when, the command, the checkpoint, versions and commit."""
    path = Path(output_dir) / RECORD_NAME
    now = datetime.now(UTC).isoformat(timespec="seconds")
    previous = read_run_record(output_dir) if resumed_from else None
    if previous is not None:
        record = previous
        record.setdefault("resumes", []).append(
            {
                "at": now,
                "command": sys.argv,
                "from": resumed_from,
                "recipe": recipe_commit(),
                "versions": package_versions(),
                "hardware": hardware(),
            }
        )
    else:
        record = {
            "created": now,
            "command": sys.argv,
            "recipe": recipe_commit(),
            "seed": seed,
            "versions": package_versions(),
            "hardware": hardware(),
            "data": {"rows": len(dataset), "sha256": data_fingerprint(dataset)},
            "model": model,
            "settings": {name: _plain(value) for name, value in settings.items()},
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    logger.info("Run record: %s (data sha256 %s…)", path, record["data"]["sha256"][:12])
    return record


def read_run_record(output_dir: str | Path) -> dict | None:
    """The run record in `output_dir`, None when there is none (or it cannot be read)."""
    return read_json(Path(output_dir) / RECORD_NAME)


def _plain(args) -> dict:
    """A settings dataclass as JSON-ready values."""
    if hasattr(args, "to_dict"):
        return args.to_dict()
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


def model_facts(model) -> dict:
    """What the trainer actually loaded: the weights' dtypes, the attention implementation, trainable parameters."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    return {
        "weights_dtype": sorted({str(p.dtype).removeprefix("torch.") for p in params}),
        "trainable_dtype": sorted({str(p.dtype).removeprefix("torch.") for p in trainable}),
        "attention": getattr(model.config, "_attn_implementation", None),
        "parameters": sum(_numel(p) for p in params),
        "trainable_parameters": sum(_numel(p) for p in trainable),
    }


def _numel(param) -> int:
    """Elements of a parameter, whole even when DeepSpeed ZeRO-3 keeps only this process's shard of it."""
    return getattr(param, "ds_numel", None) or param.numel()


def start(trainer, settings: dict, dataset) -> dict | None:
    """Write the run record (main process), link it from wandb, and note peak GPU memory into it at the end."""
    from transformers import TrainerCallback

    args = trainer.args
    if not trainer.accelerator.is_main_process:
        return None
    facts = model_facts(trainer.model)
    record = write_run_record(args.output_dir, settings, dataset, args.seed, facts, args.resume_from_checkpoint)

    class RunRecordCallbacks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            try:
                import wandb
            except ImportError:
                return
            if wandb.run is not None:
                wandb.run.config.update(
                    {
                        "run_record": str(Path(args.output_dir).resolve() / RECORD_NAME),
                        "data_sha256": record["data"]["sha256"],
                        "recipe_commit": record["recipe"]["commit"],
                    },
                    allow_val_change=True,
                )

        def on_train_end(self, args, state, control, **kwargs):
            memory = peak_gpu_memory()
            if memory:
                logger.info("Peak GPU memory: %.1f GiB allocated by torch, %.1f GiB reserved", *memory.values())
                record["peak_gpu_memory_gib"] = memory
                path = Path(args.output_dir) / RECORD_NAME
                path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")

    trainer.add_callback(RunRecordCallbacks())
    return record


def peak_gpu_memory() -> dict | None:
    """Peak GPU memory of this process since it started, as torch's allocator counts it: the model, gradients,
    optimizer, activations, evaluation, and vLLM's weights and KV cache when it runs colocated in this process."""
    import torch

    if not torch.cuda.is_available():
        return None
    return {
        "allocated": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "reserved": round(torch.cuda.max_memory_reserved() / 2**30, 2),
    }
