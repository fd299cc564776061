"""A supervised warm start before GRPO (`--warm_start_rows N`), for a model that never writes the answer format.

Where no completion writes the tags, every reward and advantage is 0 and GRPO learns nothing (a 135 M chat model
writes plain prose: docs/real_model.md). One epoch of SFT (TRL's SFTTrainer, loss on the completion only) on N GSM8K
train solutions in the format teaches enough of the form that some completions earn the format rewards. The rows are
a fixed draw of the training rows whose solution fits in --max_completion_length (a cut one would teach an answer that
never closes). Every weight trains, in fp32 (before a LoRA run too: about 16 bytes a parameter with AdamW), into
`<output_dir>/warm-start`, where GRPO starts; kept with the terms that made it and reused while they hold. A resumed
full fine-tuning needs none (its checkpoint holds every weight); a resumed LoRA run needs the base it trained on."""

import gc
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

from transformers import TrainerCallback

from grpo_kit import RecipeError, layout
from grpo_kit.layout import read_json

logger = logging.getLogger("grpo_demo")

BATCH_SIZE = 8  # rows per step, over every process: 64 rows are 8 steps at a constant learning rate
CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, `48/2=<<48/2=24>>24`: no model writes these


def solution_text(answer_format, gsm8k_solution: str) -> str:
    """A GSM8K solution (`reasoning ... #### 72`) in the answer format, without calculator annotations or a newline
    after the closing tag (the chat template ends the turn there)."""
    return answer_format.gsm8k_solution(CALCULATOR.sub("", gsm8k_solution)).rstrip("\n")


def examples(train, n: int, seed: int, answer_format, tokenizer=None, max_tokens: int | None = None):
    """`n` training rows, a fixed draw for `seed`, as prompt-completion chats (`solution_text`). With `tokenizer`,
    only rows whose solution and end of turn fit in `max_tokens` are drawn from."""
    from datasets import Dataset

    texts = [solution_text(answer_format, s) for s in train["solution"]]
    kept = list(range(len(texts)))
    if tokenizer is not None:
        lengths = [len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        kept = [i for i in kept if lengths[i] <= max_tokens]
        logger.info(
            "Warm start: %d of %d train solutions fit in %d tokens in the answer format (longer ones are not taught)",
            len(kept), len(texts), max_tokens,
        )  # fmt: skip
    if n > len(kept):
        raise RecipeError(
            f"warm_start_rows={n}: {len(kept)} train rows have a solution that fits in max_completion_length="
            f"{max_tokens} tokens: use fewer rows, or a longer --max_completion_length"
        )
    drawn = Dataset.from_dict({"i": kept}).shuffle(seed=seed).select(range(n))["i"]
    answer = [[{"role": "assistant", "content": texts[i]}] for i in drawn]
    return Dataset.from_dict({"prompt": [train[i]["prompt"] for i in drawn], "completion": answer})


def stamp(data, run, training_args, model_args, processes: int) -> dict:
    """What makes a warm start: kept beside it, and the warm start reused while it is the same."""
    return {
        "model": model_args.model_name_or_path,
        "revision": model_args.model_revision,
        "rows": run.warm_start_rows,
        "learning_rate": run.warm_start_learning_rate,
        "seed": training_args.seed,
        "dtype": full_fine_tuning_dtype(model_args),
        "bf16": training_args.bf16,
        "processes": processes,
        "data_sha256": hashlib.sha256(json.dumps(data.to_list(), sort_keys=True).encode()).hexdigest(),  # the rows
        "first_completion": data[0]["completion"][0]["content"],  # one of them, to read
    }


def warm_started(train, run, training_args, model_args, answer_format, tokenizer) -> str:
    """The folder GRPO starts from: the warm-started model, built unless its folder holds what these settings make
    (its stamp). Every process trains (SFTTrainer shares the work as GRPOTrainer does); the main one writes, into a
    folder beside it renamed into place, so that a warm start cut short leaves no model that looks whole."""
    import datasets
    from accelerate import PartialState

    state = PartialState()
    folder = layout.path(training_args.output_dir, layout.WARM_START).resolve()  # an adapter names its base by it
    data = examples(
        train, run.warm_start_rows, training_args.seed, answer_format, tokenizer, training_args.max_completion_length
    )
    made_with = stamp(data, run, training_args, model_args, state.num_processes)
    if read_json(layout.path(folder, layout.WARM_START_STAMP)) == made_with:
        logger.info("Warm start: reusing %s (made with these settings)", folder)
        return str(folder)
    if training_args.resume_from_checkpoint:
        if not model_args.use_peft:
            logger.info("Warm start: not needed to resume, the checkpoint holds every weight")
            return model_args.model_name_or_path
        raise RecipeError(
            f"Resuming a LoRA run needs the base its adapter was trained on, {folder}, which is gone or was made "
            "otherwise: a new warm start would be another base. Start a new run (another --output_dir)"
        )
    part = layout.part(folder)
    state.wait_for_everyone()  # every process has read the stamp before the main one clears anything
    if state.is_main_process:
        shutil.rmtree(part, ignore_errors=True)
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # SFTTrainer's four passes over the rows: one bar each, for a few rows
    try:
        trainer = sft_trainer(data, run, training_args, model_args, tokenizer, part, state.num_processes)
    finally:
        if shown:
            datasets.enable_progress_bars()
    steps = -(-len(data) // (trainer.args.per_device_train_batch_size * state.num_processes))
    logger.info(
        "Warm start: %d GSM8K train solutions in the answer format, %d steps at lr %g, into %s",
        len(data), steps, run.warm_start_learning_rate, folder,
    )  # fmt: skip
    trainer.train()
    trainer.save_model(str(part))  # the main process writes
    if state.is_main_process:
        tokenizer.save_pretrained(part)
        layout.path(part, layout.WARM_START_STAMP).write_text(json.dumps(made_with, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        part.rename(folder)
    del trainer
    gc.collect()
    state.wait_for_everyone()
    return str(folder)


def full_fine_tuning_dtype(model_args) -> str:
    """The dtype the warm start loads the weights in: the run's own for full fine-tuning (`models.weights_dtype`);
    fp32 for a LoRA run, whose frozen base is bf16 on a GPU (bf16 weights lose most of AdamW's small updates)."""
    return "float32" if model_args.use_peft else model_args.dtype


def sft_trainer(data, run, training_args, model_args, tokenizer, output_dir: Path, processes: int = 1):
    """TRL's SFTTrainer on `data` with the run's precision, placement and seed: one epoch at a constant learning rate
    (a few steps: a warmup would spend one of them at rate 0), BATCH_SIZE rows a step over every process, no
    checkpoints, nothing reported (a line per step here; GRPO's run is the one in wandb)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTConfig, SFTTrainer

    args = training_args
    config = SFTConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=max(1, BATCH_SIZE // processes),
        gradient_accumulation_steps=1,
        num_train_epochs=1,
        learning_rate=run.warm_start_learning_rate,
        lr_scheduler_type="constant",
        max_length=run.max_prompt_tokens + args.max_completion_length,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        bf16=args.bf16,
        fp16=args.fp16,
        use_cpu=args.use_cpu,
        activation_checkpointing=args.activation_checkpointing,
        model_init_kwargs={**(args.model_init_kwargs or {}), "dtype": full_fine_tuning_dtype(model_args)},
    )
    trainer = SFTTrainer(
        model=model_args.model_name_or_path, args=config, train_dataset=data, processing_class=tokenizer
    )
    for kind in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(kind)
    trainer.add_callback(StepLines())
    return trainer


class StepLines(TrainerCallback):
    """One line per logged warm-start step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            logger.info("Warm start step %d/%d: loss %.3f", state.global_step, state.max_steps, logs["loss"])
