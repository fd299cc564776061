"""A supervised warm start before GRPO (`--warm_start_rows N`): for a model that never writes the answer format.

GRPO learns from the differences within a group: where no completion writes the tags, every reward is 0, every
advantage is 0 and nothing is learned (a 135 M chat model asked for the format writes plain prose: docs/real_model.md).
One epoch of supervised fine-tuning (TRL's SFTTrainer, loss on the completion only) on N GSM8K train solutions
rewritten in the format teaches it enough of the form that some completions earn the format rewards; GRPO then has
groups that differ. The rows are a fixed draw of the training rows (never a held-out or test row); the model is saved
in `<output_dir>/warm-start` and GRPO starts from it (its baseline evaluation measures it). The folder is kept with
the terms that made it and reused while they hold: a resumed run starts from the same model."""

import gc
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

from transformers import TrainerCallback

from grpo_kit import RecipeError
from grpo_kit.runs import read_json

logger = logging.getLogger("grpo_demo")

FOLDER, STAMP = "warm-start", "warm_start.json"  # in the run's output folder; in it, the terms that made it
BATCH_SIZE = 8  # rows per step: 64 rows are 8 steps
WARMUP = 0.1  # of the steps, then the learning rate stays: one short epoch has nothing to decay towards
CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, `48/2=<<48/2=24>>24`: no model writes these


def solution_text(answer_format, gsm8k_solution: str) -> str:
    """A GSM8K solution (`reasoning ... #### 72`) in the answer format, its calculator annotations removed and no
    newline after the closing tag: the chat template ends the turn there."""
    return answer_format.gsm8k_solution(CALCULATOR.sub("", gsm8k_solution)).rstrip("\n")


def examples(train, n: int, seed: int, answer_format):
    """`n` training rows, a fixed draw for `seed`, as prompt-completion chats: the row's prompt, and its GSM8K
    solution in the answer format (`solution_text`)."""
    from datasets import Dataset

    if n > len(train):
        raise RecipeError(f"warm_start_rows={n}: the train split has {len(train)} usable rows: use fewer")
    drawn = train.shuffle(seed=seed).select(range(n))
    answer = [[{"role": "assistant", "content": solution_text(answer_format, s)}] for s in drawn["solution"]]
    return Dataset.from_dict({"prompt": drawn["prompt"], "completion": answer})


def warm_started(train, run, training_args, model_args, answer_format, tokenizer) -> str:
    """The folder of the warm-started model, for GRPO to start from: built unless it holds what these settings make
    (its stamp). Every process trains (SFTTrainer shares the work as GRPOTrainer does); the main one writes, into a
    folder beside it renamed into place, so that a warm start cut short leaves no model that looks whole."""
    import datasets
    from accelerate import PartialState

    folder = Path(training_args.output_dir) / FOLDER
    data = examples(train, run.warm_start_rows, training_args.seed, answer_format)
    made_with = {
        "model": model_args.model_name_or_path,
        "rows": run.warm_start_rows,
        "learning_rate": run.warm_start_learning_rate,
        "seed": training_args.seed,
        "data_sha256": hashlib.sha256(json.dumps(data.to_list(), sort_keys=True).encode()).hexdigest(),  # the rows
        "first_completion": data[0]["completion"][0]["content"],  # one of them, to read
    }
    if read_json(folder / STAMP) == made_with:
        logger.info("Warm start: reusing %s (made with these settings)", folder)
        return str(folder)
    state = PartialState()
    part = folder.parent / f".{FOLDER}.part"
    state.wait_for_everyone()  # every process has read the stamp before the main one clears anything
    if state.is_main_process:
        shutil.rmtree(part, ignore_errors=True)
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # SFTTrainer's four passes over the rows: one bar each, for a few rows
    try:
        trainer = sft_trainer(data, run, training_args, model_args, tokenizer, part)
    finally:
        if shown:
            datasets.enable_progress_bars()
    steps = -(-len(data) // (BATCH_SIZE * state.num_processes))
    logger.info(
        "Warm start: %d GSM8K train solutions in the answer format, %d steps at lr %g, into %s",
        len(data), steps, run.warm_start_learning_rate, folder,
    )  # fmt: skip
    trainer.train()
    trainer.save_model(str(part))  # on every process: DeepSpeed gathers the weights; the main process writes
    if state.is_main_process:
        tokenizer.save_pretrained(part)
        (part / STAMP).write_text(json.dumps(made_with, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        part.rename(folder)
    del trainer
    gc.collect()
    state.wait_for_everyone()
    return str(folder)


def sft_trainer(data, run, training_args, model_args, tokenizer, output_dir: Path):
    """TRL's SFTTrainer on `data` with the run's precision, placement and seed: one epoch, no checkpoints, nothing
    reported (a line per step here; GRPO's run is the one in wandb)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTConfig, SFTTrainer

    args = training_args
    config = SFTConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=1,
        num_train_epochs=1,
        learning_rate=run.warm_start_learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=WARMUP,
        max_length=run.max_prompt_tokens + args.max_completion_length,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        bf16=args.bf16,
        fp16=args.fp16,
        use_cpu=args.use_cpu,
        activation_checkpointing=args.activation_checkpointing,
        # Every weight trains, also before a LoRA run: in a dtype that keeps AdamW's small updates (not pure bf16)
        model_init_kwargs={**(args.model_init_kwargs or {}), "dtype": full_fine_tuning_dtype(model_args)},
    )
    trainer = SFTTrainer(
        model=model_args.model_name_or_path, args=config, train_dataset=data, processing_class=tokenizer
    )
    for kind in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(kind)
    trainer.add_callback(StepLines())
    return trainer


def full_fine_tuning_dtype(model_args) -> str:
    """The dtype the warm start loads the weights in: the run's own for full fine-tuning (the recipe's `weights_dtype`:
    fp32 with bf16 autocast, bf16 under DeepSpeed, which keeps fp32 copies); for a LoRA run, whose frozen base is
    stored in bf16, what full fine-tuning would use instead."""
    from grpo_kit.models import zero_stage

    if not model_args.use_peft:
        return model_args.dtype
    return "bfloat16" if zero_stage() else "float32"


class StepLines(TrainerCallback):
    """One line per logged warm-start step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            logger.info("Warm start step %d/%d: loss %.3f", state.global_step, state.max_steps, logs["loss"])
