"""Checks made once the training data is read and before the weights load: enough data for a step, the same data as
the run being resumed, LoRA targets the model has, a disk with room for a checkpoint."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from grpo_kit.record import data_fingerprint, read_run_record

logger = logging.getLogger("grpo_demo")


def check(train, run, model_args, training_args, examples=None) -> None:
    """Stop with a message, before the weights load, where the run could not train what it says it trains (or
    measure what it says it measures: k-shot's examples from the whole train split `examples`)."""
    enough_data(train, training_args)
    enough_examples(examples, run)
    same_data(train, run, training_args)
    model_and_disk(model_args, training_args)


def enough_examples(examples, run) -> None:
    """k-shot evaluation shows eval_shots worked train solutions; the train split must hold them."""
    if "kshot" not in run.eval_protocols or examples is None:
        return
    have = sum(1 for solution in examples["solution"] if solution)
    if have < run.eval_shots:
        sys.exit(
            f"--eval_protocols kshot shows {run.eval_shots} worked train solutions, and the train split has {have}: "
            "lower --eval_shots"
        )


def enough_data(train, training_args) -> None:
    """One optimizer step takes generation_batch_size / num_generations distinct prompts (TRL's RepeatSampler
    yields only whole batches): with fewer, the run would train nothing and report success."""
    needed = training_args.generation_batch_size // training_args.num_generations
    if len(train) < needed:
        sys.exit(
            f"{len(train)} training prompts, and one step takes {needed} (generation_batch_size "
            f"{training_args.generation_batch_size} / num_generations {training_args.num_generations}): use more "
            "data, or a smaller --per_device_train_batch_size / --gradient_accumulation_steps"
        )


def same_data(train, run, training_args) -> None:
    """A resumed run trains on the data its start trained on (the run record's fingerprint)."""
    checkpoint = training_args.resume_from_checkpoint
    record = read_run_record(Path(checkpoint).parent) if checkpoint else None
    if record is None or "data" not in record:
        return
    fingerprint = data_fingerprint(train)
    if fingerprint != record["data"].get("sha256"):
        change = (
            f"the training data differ from the run's start: {len(train)} rows, sha256 {fingerprint[:12]}... "
            f"against {record['data'].get('rows')} rows, {str(record['data'].get('sha256'))[:12]}..."
        )
        if not run.allow_changed_settings:
            sys.exit(f"Resuming {checkpoint}: {change}. Resume on the same data, or --allow_changed_settings true")
        logger.warning("Resuming %s: %s (--allow_changed_settings)", checkpoint, change)


def model_and_disk(model_args, training_args) -> None:
    """What the model's config (a few KB, no weights) can tell before the weights load: that LoRA's target modules
    exist in the model, and that the disk holds a checkpoint. Stops with a message otherwise."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    name = model_args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(
            name, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
        with torch.device("meta"):  # shapes only: nothing allocated
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=training_args.trust_remote_code)
    except (OSError, ValueError) as err:
        sys.exit(f"Could not read the model {name!r}'s config ({str(err).splitlines()[0][:200]})")
    modules = {module_name.rsplit(".", 1)[-1] for module_name, _ in skeleton.named_modules()}
    targets = model_args.lora_target_modules
    if model_args.use_peft and isinstance(targets, list) and (unknown := [t for t in targets if t not in modules]):
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)})
        sys.exit(f"lora_target_modules: {name} has no {unknown}; its linear layers are {linear}")

    parameters = sum(p.numel() for p in skeleton.parameters())
    # A full fine-tuning checkpoint holds the fp32 weights and AdamW's two moments; an adapter's is small.
    checkpoint = 2 * 2**30 if model_args.use_peft else parameters * (4 + 8)
    folder = Path(training_args.output_dir)
    free = shutil.disk_usage(next(p for p in (folder, *folder.absolute().parents) if p.exists())).free
    kept = training_args.save_total_limit
    if free < checkpoint:
        sys.exit(
            f"{training_args.output_dir}: {_size(free)} free, and one checkpoint of this run takes about "
            f"{_size(checkpoint)}: free some space, or choose another --output_dir"
        )
    if kept and free < (kept + 1) * checkpoint:
        logger.warning(
            "%s: %s free for %d checkpoints of about %s each: the disk may fill before the end",
            training_args.output_dir, _size(free), kept + 1, _size(checkpoint),
        )  # fmt: skip


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
