"""GSM8K accuracy of a model: completions of the test split (greedy, and sampled for pass@k / maj@k), scored in an
evaluation protocol (`grpo_kit.protocols`: the recipe's own format by default).

Evaluation is collective: under `accelerate launch` every process generates its share of the questions, the
completions are gathered, and the main process writes the report, so N processes evaluate N times faster and none
waits alone for another. Each process makes the same number of `generate` calls, which DeepSpeed ZeRO-3 needs
(its `generate` synchronises every token across processes).

During training the trainer's own model is measured (`AccuracyCallback`): the start model before the first step,
a fixed subset every `eval_every_steps` steps, the trained model after the last step. No second copy is loaded.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext
from functools import partial
from itertools import islice

from transformers import Trainer, TrainerCallback

from grpo_kit.generation import Generation, generate_greedy, generate_samples
from grpo_kit.protocols import build as build_protocol
from grpo_kit.reports import compare, eval_name, write_report
from grpo_kit.scoring import score, summarize, summarize_samples

logger = logging.getLogger("grpo_demo")

# Logged during training under `eval_` names: the trainer's wandb integration shows them as `eval/accuracy_strict`...
LOGGED_METRICS = ("accuracy_strict", "accuracy_lenient", "format_rate", "mean_completion_tokens")


def measures(run) -> bool:
    """Whether a run measures accuracy at all (and so needs the test split)."""
    return bool(run.eval_only or run.final_eval or run.eval_every_steps > 0)


def shard(n: int, index: int, count: int) -> tuple[list[int], int]:
    """(the question indices process `index` of `count` generates, how many of them are its own).

    Every `count`-th question from `index`, then repeats of one question up to ceil(n / count), so that every
    process generates as many completions as every other (the repeats are dropped).
    """
    own = list(range(index, n, count))
    return own + [own[-1] if own else 0] * (-(-n // count) - len(own)), len(own)


def generate_collectively(model, tokenizer, prompts: list, generate, desc: str):
    """`generate(model, tokenizer, prompts, desc=..., progress=...)` of `prompts` in input order, run by every
    process on its share and gathered (`generation.generate_greedy` or `generate_samples`, arguments bound)."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    state = PartialState()
    indices, own = shard(len(prompts), state.process_index, state.num_processes)
    generations = generate(model, tokenizer, [prompts[i] for i in indices], desc=desc, progress=state.is_main_process)
    mine = list(zip(indices[:own], generations[:own], strict=True))
    by_index = dict(gather_object(mine) if state.num_processes > 1 else mine)
    return [by_index[i] for i in range(len(prompts))]


def evaluate(
    model,
    tokenizer,
    rows,
    answer_format,
    *,
    max_new_tokens: int,
    batch_size: int,
    model_name: str,
    protocol=None,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    desc: str = "GSM8K",
    generations: list[Generation] | None = None,
    sampled: list[list[Generation]] | None = None,
) -> tuple[dict, list[dict]]:
    """Accuracy on `rows` (the recipe's rows: `question`, `prompt`, `answer`) under `protocol` (default: the
    recipe's; `grpo_kit.protocols`): greedy, and with `samples` > 0 also pass@k and maj@k of that many samples per
    question at `temperature`.

    Returns (summary, records), the same on every process: the summary holds `scoring.summarize`'s rates and
    intervals, `protocol`, `model`, `backend`, `max_new_tokens`, `processes`, `seconds`, `questions_per_second` and,
    with samples, `sampling` (`scoring.summarize_samples`); a record holds the question, gold answer, completion,
    `scoring.score`'s fields, `completion_tokens`, `truncated` and, with samples, `samples` (each scored alike).
    `generations` (and `sampled`) given, vLLM's, are scored instead of generating with `model`.
    """
    from accelerate import PartialState

    protocol = protocol or build_protocol("recipe", answer_format)
    rows = list(rows)
    started = time.perf_counter()
    backend = "vllm" if generations is not None else "hf"
    prompts = [protocol.prompt(row["question"]) for row in rows]
    if generations is None:
        warn_if_past_positions(model, tokenizer, prompts, max_new_tokens)
        greedy = partial(generate_greedy, max_new_tokens=max_new_tokens, batch_size=batch_size)
        generations = generate_collectively(model, tokenizer, prompts, greedy, desc)
        if samples > 0:
            sample = partial(
                generate_samples,
                samples=samples,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                batch_size=batch_size,
                seed=seed + PartialState().process_index,  # each process samples its own share
            )
            sampled = generate_collectively(model, tokenizer, prompts, sample, f"{desc}, {samples} samples")
    seconds = time.perf_counter() - started

    def scored(g: Generation, gold: str) -> dict:
        return {
            "completion": g.text,
            **score(g.text, gold, answer_format, protocol),
            "completion_tokens": g.tokens,
            "truncated": g.truncated,
        }

    records = [
        {"question": row["question"], "gold": row["answer"], **scored(g, row["answer"])}
        for row, g in zip(rows, generations, strict=True)
    ]
    if sampled is not None:
        for record, own in zip(records, sampled, strict=True):
            record["samples"] = [scored(g, record["gold"]) for g in own]
    summary = {
        **summarize(records),
        "protocol": protocol.name,
        **({"protocol_details": protocol.details} if protocol.details else {}),
        "model": model_name,
        "questions_sha256": questions_fingerprint(rows),
        "backend": backend,
        "max_new_tokens": max_new_tokens,
        "processes": PartialState().num_processes if backend == "hf" else 1,
        "seconds": round(seconds, 2),
        "questions_per_second": round(len(records) / seconds, 2) if seconds else None,
    }
    if prompts:  # what the model saw, a chat template's own default system message included
        summary["first_prompt"] = tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
    if sampled is not None:
        summary["sampling"] = {
            **summarize_samples(records, len(sampled[0]) if sampled else samples, temperature),
            "seed": seed,  # each process samples its share with seed + its index: results depend on both
            "processes": PartialState().num_processes if backend == "hf" else 1,
            "batch_size": batch_size,
        }
    return summary, records


def longest_prompt(tokenizer, prompts: list) -> int:
    from grpo_kit.generation import prompt_ids

    return max((len(ids) for ids in prompt_ids(tokenizer, prompts)), default=0)


def warn_if_past_positions(model, tokenizer, prompts: list, max_new_tokens: int) -> None:
    """Say so where a prompt and its completion run past the positions the model was trained on (k-shot prompts are
    long): it generates there, but nobody knows what its answers are worth."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = longest_prompt(tokenizer, prompts)
    if limit and longest + max_new_tokens > limit:
        logger.warning(
            "The longest prompt (%d tokens) and %d new tokens run past the model's %d positions: lower --eval_shots "
            "or --max_completion_length for numbers that mean something",
            longest,
            max_new_tokens,
            limit,
        )


def questions_fingerprint(rows) -> str:
    """sha256 over the questions and gold answers evaluated, in order: two evaluations compare only on the same."""
    import hashlib
    import json

    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps([row["question"], row["answer"]], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def release_memory() -> None:
    """Give the memory generation took (KV caches, activations) back to the allocator's pool for training."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class AccuracyCallback(TrainerCallback):
    """Accuracy of the trainer's own model, generated by every process in shares:

    - `before_and_after`: the start model at the start of a new run (`eval/baseline/`, not on resume: the run's
      start model was measured when it started) and the trained model after the last step (`eval/final/`), then
      `eval/comparison.json` (paired test, flipped questions); in each of `protocols` (the recipe's, then
      `baseline-kshot`, ...), with pass@k and maj@k where `sampling` asks;
    - `every_steps` > 0: the first `subset` rows every `every_steps` optimizer steps, logged as
      `eval_accuracy_strict`, `eval_accuracy_lenient`, `eval_format_rate` and `eval_mean_completion_tokens` in
      `trainer_state.json`'s log history, and as `eval/...` in wandb.

    The model is unwrapped as the trainer unwraps it for its own rollouts (TRL's `unwrap_model_for_generation`:
    ZeRO-3 weights gathered, gradient checkpointing off), run in eval mode with the KV cache and the trainer's
    autocast (bf16 on a GPU, as in training), then put back.
    """

    def __init__(
        self,
        trainer,
        rows,
        answer_format,
        *,
        before_and_after,
        every_steps,
        subset,
        batch_size,
        limit,
        protocols=(),
        sampling=None,
        split="test",
    ):
        self.trainer = trainer
        self.rows = list(islice(rows or [], limit))
        self.subset = self.rows[:subset]
        self.answer_format = answer_format
        self.protocols = list(protocols) or [build_protocol("recipe", answer_format)]  # the recipe's first
        self.sampling = sampling or {}  # samples, temperature, seed: pass@k and maj@k before and after
        self.split = split  # the rows measured: "test", or "validation" (held out of train, --eval_split)
        self.before_and_after = before_and_after
        self.every_steps = every_steps
        self.batch_size = batch_size
        self.start_model = getattr(trainer.model, "name_or_path", None) or "start model"

    def measure(self, rows, model_name: str, desc: str, protocol=None, sampling=None) -> tuple[dict, list[dict]]:
        from trl.models import unwrap_model_for_generation

        trainer, args = self.trainer, self.trainer.args
        unwrapped = unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        )
        with unwrapped as model, trainer.accelerator.autocast() if args.bf16 or args.fp16 else nullcontext():
            result = evaluate(
                model,
                trainer.processing_class,
                rows,
                self.answer_format,
                max_new_tokens=args.max_completion_length,
                batch_size=self.batch_size,
                model_name=model_name,
                protocol=protocol,
                desc=desc,
                **(sampling or {}),
            )
        release_memory()
        return result

    def report(self, base: str, model_name: str) -> None:
        """`base` (baseline, final) in every protocol asked for, with the sampling metrics where asked."""
        for protocol in self.protocols:
            name = eval_name(base, protocol.name)
            summary, records = self.measure(self.rows, model_name, f"GSM8K {name}", protocol, self.sampling)
            summary["split"] = self.split
            if base == "final":
                summary["start_model"] = self.start_model
            if self.trainer.accelerator.is_main_process:
                write_report(self.trainer.args.output_dir, name, summary, records)

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.before_and_after:
            return
        if state.global_step == 0:
            self.report("baseline", self.start_model)
        else:
            logger.info(
                "Resumed at step %d: eval/baseline is the start model's, from the run's start", state.global_step
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_steps <= 0 or state.global_step % self.every_steps:
            return
        if control.should_training_stop and state.global_step < state.max_steps:
            return  # stopping early (grpo_kit/stopping.py): the checkpoint first, as a scheduler's grace is short
        summary, _ = self.measure(self.subset, args.output_dir, f"accuracy at step {state.global_step}")
        logger.info(
            "Step %d: GSM8K accuracy %.1f %% strict, %.1f %% lenient on %d questions",
            state.global_step,
            100 * summary["accuracy_strict"],
            100 * summary["accuracy_lenient"],
            summary["n"],
        )
        # The base Trainer.log, not GRPOTrainer.log: that one would take the rewards pending for this step's log
        # entry into this one and print the completion sample again. Logging clears `should_log`, which the
        # trainer set for that entry: keep it.
        should_log = control.should_log
        Trainer.log(self.trainer, {f"eval_{key}": summary[key] for key in LOGGED_METRICS})
        control.should_log = should_log

    def on_train_end(self, args, state, control, **kwargs):
        if not self.before_and_after:
            return
        if state.global_step < state.max_steps:  # stopped early (stopping.py): "final" measures a finished run
            logger.info("Stopped at step %d of %d: no final evaluation", state.global_step, state.max_steps)
            return
        self.report("final", args.output_dir)
        if self.trainer.accelerator.is_main_process:
            for protocol in self.protocols:
                compare(args.output_dir, protocol.name)


def protocols(run, answer_format, test_rows, train_rows, *, training: bool) -> list:
    """The protocols `run.eval_protocols` names (a training run's baseline and final always include the recipe's,
    first), built: k-shot examples from the whole train split `train_rows`, never a question of the whole test split
    `test_rows`. Stops with a message where k-shot has too few examples to show."""
    names = list(dict.fromkeys((["recipe"] if training else []) + list(run.eval_protocols)))
    questions = {row["question"] for row in test_rows or []}
    try:
        return [
            build_protocol(
                name,
                answer_format,
                train_rows=train_rows,
                test_questions=questions,
                shots=run.eval_shots,
                seed=SHOTS_SEED,
            )
            for name in names
        ]
    except ValueError as err:
        sys.exit(f"--eval_protocols kshot: {err}: lower --eval_shots, or give a train split with more (--dataset)")


SHOTS_SEED = 1234  # the k-shot examples' draw, fixed whatever the training seed (the value lm-eval seeds its with)


def reads_train(run) -> bool:
    """Whether a run needs the train split: to train, to show k-shot examples from it, or to measure the rows it
    holds out for validation."""
    return not run.eval_only or "kshot" in run.eval_protocols or run.eval_split == "validation"


def sampling(run, training_args) -> dict:
    """pass@k / maj@k settings for `evaluate`: none unless `eval_samples` > 0; the training temperature unless
    `eval_temperature` is given; the run's seed."""
    if run.eval_samples <= 0:
        return {}
    temperature = run.eval_temperature if run.eval_temperature is not None else training_args.temperature
    return {"samples": run.eval_samples, "temperature": temperature, "seed": training_args.seed}


def callback(trainer, test_rows, run, answer_format, train_rows=None) -> AccuracyCallback:
    """The accuracy measurements a training run's settings ask for (none when `test_rows` is None)."""
    return AccuracyCallback(
        trainer,
        test_rows,
        answer_format,
        before_and_after=run.final_eval and test_rows is not None,
        every_steps=run.eval_every_steps if test_rows is not None else 0,
        subset=run.eval_subset,
        batch_size=run.eval_batch_size,
        limit=run.eval_limit,
        protocols=protocols(run, answer_format, test_rows, train_rows, training=True) if test_rows else (),
        sampling=sampling(run, trainer.args),
        split=run.eval_split,
    )
