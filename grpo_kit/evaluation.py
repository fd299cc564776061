"""GSM8K accuracy of a model, entered here alone: completions of the measured split (greedy, and sampled for
pass@k / maj@k) scored in a protocol (`grpo_kit.scoring`; lm-evaluation-harness's own tasks: `grpo_kit.harness`),
during a training run (`callback`: the trainer's own
model, no second copy), of a saved model (`evaluate_only`, `--eval_only`), and one sampled answer (`ask`).

Evaluation is collective: under `accelerate launch` every process generates its share of the questions, the
completions are gathered and the main process writes the report, so N processes evaluate N times faster. Each
process makes the same number of `generate` calls, which ZeRO-3 needs (its `generate` synchronises every token)."""

import gc
import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import Trainer, TrainerCallback

from grpo_kit import RecipeError, generation, harness, layout, models, reports, scoring
from grpo_kit.data import drop_long_prompts
from grpo_kit.generation import Generation, generate_greedy, generate_samples
from grpo_kit.layout import eval_name
from grpo_kit.reports import compare, write_report
from grpo_kit.scoring import build_protocol, score, summarize, summarize_samples

logger = logging.getLogger("grpo_demo")

# Logged during training under `eval_` names: the trainer's wandb integration shows them as `eval/accuracy_strict`...
LOGGED_METRICS = ("accuracy_strict", "accuracy_lenient", "format_rate", "mean_completion_tokens")


def shard(n: int, index: int, count: int) -> tuple[list[int], int]:
    """(the indices process `index` of `count` generates, how many are its own): every `count`-th question from `index`,
    then repeats of one up to ceil(n / count), so that each process makes as many completions (repeats dropped)."""
    own = list(range(index, n, count))
    return own + [own[-1] if own else 0] * (-(-n // count) - len(own)), len(own)


def generate_collectively(model, tokenizer, prompts: list, generate, desc: str, progress: bool = True, **settings):
    """`generate(model, tokenizer, prompts, desc=, progress=, **settings)` (`generation.generate_greedy` or
    `generate_samples`) of `prompts` in input order, run by every process on its share and gathered."""
    state = PartialState()
    indices, own = shard(len(prompts), state.process_index, state.num_processes)
    shown = dict(desc=desc, progress=progress and state.is_main_process)
    generations = generate(model, tokenizer, [prompts[i] for i in indices], **shown, **settings)
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
    progress: bool = True,
    vllm: tuple[list[Generation], list[list[Generation]] | None] | None = None,
) -> tuple[dict, list[dict]]:
    """Accuracy on `rows` (the recipe's: `question`, `prompt`, `answer`) under `protocol` (default: the recipe's):
    greedy, and with `samples` > 0 pass@k and maj@k of that many samples per question at `temperature`; `vllm`
    given (`generation.generate_vllm`'s completions), those are scored instead. Returns (summary, records), the same
    on every process: `scoring.summarize`'s rates with the measurement's terms (and `summarize_samples`' `sampling`),
    and each question's completion with `scoring.score`'s fields, its length and its `samples`."""
    protocol = protocol or build_protocol("recipe", answer_format)
    rows, started = list(rows), time.perf_counter()
    prompts = [protocol.prompt(row["question"]) for row in rows]
    processes = PartialState().num_processes if vllm is None else 1
    generations, sampled = vllm or (None, None)
    if vllm is None:
        warn_if_past_positions(model, tokenizer, prompts, max_new_tokens)
        lengths = dict(max_new_tokens=max_new_tokens, batch_size=batch_size)
        generations = generate_collectively(model, tokenizer, prompts, generate_greedy, desc, progress, **lengths)
        if samples > 0:
            own_seed = seed + PartialState().process_index  # each process samples its own share
            drawn = dict(samples=samples, temperature=temperature, seed=own_seed, **lengths)
            shown = f"{desc}, {samples} samples"
            sampled = generate_collectively(model, tokenizer, prompts, generate_samples, shown, progress, **drawn)
    seconds = time.perf_counter() - started
    records = scored_records(rows, generations, sampled, answer_format, protocol)
    summary = {
        **summarize(records),
        "protocol": protocol.name,
        **({"tags": list(answer_format.tags)} if protocol.judges_format else {}),  # the format asked for and read
        "model": model_name,
        "questions_sha256": scoring.questions_fingerprint(rows),
        "backend": "hf" if vllm is None else "vllm",
        "max_new_tokens": max_new_tokens,
        "processes": processes,
        "seconds": round(seconds, 2),
        "questions_per_second": round(len(records) / seconds, 2) if seconds else None,
    }
    if prompts:  # what the model saw, a chat template's own default system message included
        summary["first_prompt"] = tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
    if sampled is not None:
        terms = {"seed": seed, "processes": processes, "batch_size": batch_size}  # the samples depend on all three
        summary["sampling"] = summarize_samples(records, len(sampled[0]) if sampled else samples, temperature) | terms
    return summary, records


def scored_records(rows, generations: list[Generation], sampled, answer_format, protocol) -> list[dict]:
    """Each question's completion with `scoring.score`'s fields and its length, and its scored `samples`."""

    def scored(g: Generation, gold: str) -> dict:
        tokens = {"completion_tokens": g.tokens, "truncated": g.truncated}
        return {"completion": g.text, **score(g.text, gold, answer_format, protocol), **tokens}

    records = [
        {"question": row["question"], "gold": row["answer"], **scored(g, row["answer"])}
        for row, g in zip(rows, generations, strict=True)
    ]
    if sampled is not None:
        for record, own in zip(records, sampled, strict=True):
            record["samples"] = [scored(g, record["gold"]) for g in own]
    return records


def too_long(tokenizer, prompts: list, max_new_tokens: int, limit: int | None) -> int | None:
    """The longest prompt's length where it and `max_new_tokens` run past `limit` positions, else None."""
    longest = max((len(ids) for ids in generation.prompt_ids(tokenizer, prompts)), default=0) if limit else 0
    return longest if limit and longest + max_new_tokens > limit else None


def warn_if_past_positions(model, tokenizer, prompts: list, max_new_tokens: int) -> None:
    """Warn where a prompt and completion run past the model's trained positions: answers there are of unknown worth."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if (longest := too_long(tokenizer, prompts, max_new_tokens, limit)) is not None:
        logger.warning(
            "The longest prompt (%d tokens) and %d new tokens run past the model's %d positions: lower "
            "--max_completion_length for numbers that mean something",
            longest, max_new_tokens, limit,
        )  # fmt: skip


class AccuracyCallback(TrainerCallback):
    """Accuracy of the trainer's own model, as `plan` asks. `before_and_after`: the start model at the start of a new
    run (`eval/baseline/`) and the trained model after the last step (`eval/final/`), then `eval/comparison.json`, in
    each of its protocols, with pass@k and maj@k where its `sampling` asks. `every_steps` > 0: the first `subset` rows
    every `every_steps` optimizer steps, logged as `eval_` + LOGGED_METRICS. The model is unwrapped as for the
    trainer's rollouts (ZeRO-3 weights gathered, gradient checkpointing off) and run in its autocast (bf16 on a GPU)."""

    def __init__(self, trainer, rows, answer_format, plan: "Plan"):
        self.trainer, self.answer_format, self.plan = trainer, answer_format, plan
        self.rows = list(islice(rows or [], plan.limit))
        self.subset = self.rows[: plan.subset]
        self.protocols = list(plan.protocols) or [build_protocol("recipe", answer_format)]  # the recipe's first
        self.start_model = getattr(trainer.model, "name_or_path", None) or "start model"

    @contextmanager
    def unwrapped(self, **gather):
        """The trainer's model as for its rollouts (ZeRO-3 weights gathered, gradient checkpointing off); after, the
        memory generation took (KV caches, activations) back to the allocator's pool for training."""
        from trl.models import unwrap_model_for_generation

        trainer, args = self.trainer, self.trainer.args
        checkpointing = args.gradient_checkpointing_kwargs
        kwargs = dict(gradient_checkpointing_kwargs=checkpointing, **gather)
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, **kwargs) as model:
            yield model
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialised

    def measure(
        self, rows, model_name: str, desc: str, protocol=None, sampling=None, progress: bool = True
    ) -> tuple[dict, list[dict]]:
        args = self.trainer.args
        settings = dict(model_name=model_name, protocol=protocol, desc=desc, progress=progress, **(sampling or {}))
        settings.update(max_new_tokens=args.max_completion_length, batch_size=self.plan.batch_size)
        autocast = self.trainer.accelerator.autocast() if args.bf16 or args.fp16 else nullcontext()
        with self.unwrapped(gather_deepspeed3_params=args.ds3_gather_for_generation) as model, autocast:
            return evaluate(model, self.trainer.processing_class, rows, self.answer_format, **settings)

    def measure_harness(self, protocol, name: str, model_name: str) -> tuple[dict, list[dict]]:
        """`protocol` by lm-eval on the trainer's model (one process, no ZeRO-3: `checks`), unwrapped as for
        `measure`, in its own dtype as lm-eval loads the saved folder (no autocast), into `eval/<name>/`."""
        from lm_eval.models.huggingface import HFLM

        folder = layout.eval_dir(self.trainer.args.output_dir, name)
        with self.unwrapped() as model:
            training = model.training
            batch = self.plan.harness["batch_size"]
            lm = HFLM(pretrained=model, tokenizer=self.trainer.processing_class, batch_size=batch)
            # The folder lm-eval's command line reads: an adapter's on its base model, as `peft=`
            adapter = hasattr(model, "peft_config") and model_name != self.start_model
            saved = {"pretrained": self.start_model, "peft": model_name} if adapter else {"pretrained": model_name}
            settings = dict(model_name=model_name, saved_as=saved)
            result = harness.evaluate(lm, protocol, self.plan.dataset, folder, self.plan.harness, **settings)
            model.train(training)  # HFLM put it in eval mode
        return result

    def report(self, base: str, model_name: str) -> list[dict]:
        """`base` (baseline, final) in every protocol; returns the records of the first (the recipe's)."""
        first = None
        for protocol in self.protocols:
            name = eval_name(base, protocol.name)
            if isinstance(protocol, harness.Harness):
                summary, records = self.measure_harness(protocol, name, model_name)
            else:
                summary, records = self.measure(self.rows, model_name, f"GSM8K {name}", protocol, self.plan.sampling)
            summary |= self.plan.split | ({"start_model": self.start_model} if base == "final" else {})
            if self.trainer.accelerator.is_main_process:
                write_report(self.trainer.args.output_dir, name, summary, records, table=False)
            first = records if first is None else first
        return first

    @property
    def measured(self) -> int:
        """How many questions each in-training measurement asks (0: none is made)."""
        return len(self.subset) if self.plan.every_steps > 0 else 0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0:
            if self.plan.before_and_after and layout.read_summary(self.trainer.args.output_dir, "baseline"):
                logger.info(
                    "Resumed at step %d: eval/baseline is the start model's, from the run's start", state.global_step
                )
            elif self.plan.before_and_after:  # another folder's checkpoint continued here: its baseline is there
                logger.info(
                    "Resumed at step %d from another folder's checkpoint: no baseline here (its run's eval/ holds it)",
                    state.global_step,
                )
            return
        records = self.report("baseline", self.start_model) if self.plan.before_and_after else None
        if self.plan.every_steps > 0:  # the subset's accuracy at step 0, where the in-training curve starts
            subset = (
                records[: len(self.subset)]
                if records
                else self.measure(self.subset, self.start_model, "accuracy at step 0", progress=False)[1]
            )
            self.log_subset(summarize(subset), control)

    def on_step_end(self, args, state, control, **kwargs):
        if self.plan.every_steps <= 0 or state.global_step % self.plan.every_steps:
            return
        if control.should_training_stop and state.global_step < state.max_steps:
            return  # stopping early (grpo_kit/stopping.py): the checkpoint first, as a scheduler's grace is short
        desc = f"accuracy at step {state.global_step}"
        summary, _ = self.measure(self.subset, args.output_dir, desc, progress=False)  # the training bar's the one
        accuracy = [100 * summary[f"accuracy_{verdict}"] for verdict in ("strict", "lenient")]
        message = "Step %d: GSM8K accuracy %.1f %% strict, %.1f %% lenient on %d questions"
        logger.info(message, state.global_step, *accuracy, summary["n"])
        self.log_subset(summary, control)

    def log_subset(self, summary: dict, control) -> None:
        """The subset's accuracy in the log history and wandb, at this step. The base Trainer.log, not
        GRPOTrainer.log: that one would take the rewards pending for this step's log entry into this one and print
        the completion sample again. Logging clears `should_log`, which the trainer set for that entry: kept."""
        should_log = control.should_log
        Trainer.log(self.trainer, {f"eval_{key}": summary[key] for key in LOGGED_METRICS})
        control.should_log = should_log

    def finish_last_step(self, signals) -> bool:
        """Where the run resumes from its last step's checkpoint (stopped in or after its final evaluation, before its
        model was saved): that checkpoint's weights and state loaded and the run's end done, the final evaluation,
        with no step more (the trainer's loop takes one on any resume). False otherwise: the trainer trains."""
        from transformers import TrainerState

        trainer, checkpoint = self.trainer, self.trainer.args.resume_from_checkpoint
        step, end = layout.step_and_end(checkpoint, trainer.args.max_steps) if checkpoint else (0, 0)
        if not 0 < end <= step:
            return False
        if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
            raise RecipeError(
                f"{checkpoint} is the run's last step: under DeepSpeed or FSDP its weights load only as training "
                f"starts, which would train a step more. Evaluate it instead: --eval_only --model_name_or_path "
                f"{checkpoint} (python, not accelerate launch: one process)"
            )
        trainer._load_from_checkpoint(checkpoint)
        trainer.state = TrainerState.load_from_json(str(layout.path(checkpoint, layout.STATE)))
        trainer.state.is_local_process_zero = trainer.is_local_process_zero()
        trainer.state.is_world_process_zero = trainer.is_world_process_zero()
        signals.phase = "end"  # a stop signal now: the run finishes
        self.on_train_end(trainer.args, trainer.state, trainer.control)
        return True

    def on_train_end(self, args, state, control, **kwargs):
        if not self.plan.before_and_after:
            return
        if state.global_step < state.max_steps:  # stopped early (stopping.py): "final" measures a finished run
            logger.info("Stopped at step %d of %d: no final evaluation", state.global_step, state.max_steps)
            return
        self.report("final", args.output_dir)
        if self.trainer.accelerator.is_main_process:
            for protocol in self.protocols:
                compare(args.output_dir, protocol.name)


@dataclass(frozen=True)
class Plan:
    """What a run measures, built once from its settings (`measurement_plan`); the evaluation reads this alone."""

    protocols: tuple = ()  # built: the recipe's own (`scoring.Protocol`) and lm-eval's tasks (`harness.Harness`)
    split: dict = field(default_factory=lambda: {"split": "test"})  # the rows measured, as summaries record them
    dataset: str | None = None  # the GSM8K folder (lm-eval's tasks read it too); None: the Hub's
    limit: int | None = None  # the first N rows
    max_prompt_tokens: int = 256  # rows whose prompt is longer are dropped, as train rows are
    batch_size: int = 64
    sampling: dict = field(default_factory=dict)  # samples, temperature, seed: pass@k and maj@k; empty: greedy alone
    before_and_after: bool = True  # a training run's baseline and final evaluations
    every_steps: int = 0  # a training run's accuracy on `subset` rows every N steps
    subset: int = 0
    harness: dict = field(default_factory=dict)  # lm-eval's settings (`harness.run_settings`)


def measurement_plan(run, training_args, answer_format, *, training: bool) -> Plan:
    """The evaluation settings of `run` (RunArguments) and `training_args`, as one `Plan`."""
    return Plan(
        protocols=tuple(protocols(run, answer_format, training=training)),
        split=split_terms(run),
        dataset=run.dataset,
        limit=run.eval_limit,
        max_prompt_tokens=run.max_prompt_tokens,
        batch_size=run.eval_batch_size,
        sampling=sampling(run, training_args),
        before_and_after=run.final_eval,
        every_steps=run.eval_every_steps,
        subset=run.eval_subset,
        harness=harness.run_settings(run.eval_batch_size, run.eval_limit, run.eval_max_gen_toks),
    )


def protocols(run, answer_format, *, training: bool) -> list:
    """The protocols `run.eval_protocols` names (a training run's always the recipe's first), built: the recipe's
    own (`scoring.Protocol`) and lm-eval's tasks (`harness.Harness`)."""
    names = list(dict.fromkeys((["recipe"] if training else []) + list(run.eval_protocols)))
    return [harness.Harness(n) if harness.is_harness(n) else build_protocol(n, answer_format) for n in names]


def sampling(run, training_args) -> dict:
    """pass@k / maj@k settings for `evaluate` (none unless `eval_samples` > 0): the run's seed, the eval temperature."""
    temperature = training_args.temperature if run.eval_temperature is None else run.eval_temperature
    drawn = {"samples": run.eval_samples, "temperature": temperature, "seed": training_args.seed}
    return drawn if run.eval_samples > 0 else {}


def split_terms(run) -> dict:
    """The rows an evaluation measures, as its summary records them: the split, and how many train rows were held
    out where it is the validation split (another number holds out other rows)."""
    validation = {"validation_rows": run.validation_rows} if run.eval_split == "validation" else {}
    return {"split": run.eval_split, **validation}


def callback(trainer, test_rows, plan: Plan, answer_format) -> AccuracyCallback:
    """The accuracy measurements a training run's plan asks for (none when `test_rows` is None); rows whose prompt
    is over --max_prompt_tokens are dropped, as train rows are."""
    tokenizer, split = trainer.processing_class, plan.split["split"]
    measured = None if test_rows is None else drop_long_prompts(test_rows, tokenizer, plan.max_prompt_tokens, split)
    asked = plan.protocols if test_rows else ()
    ours = [p for p in asked if not isinstance(p, harness.Harness)]  # lm-eval's tasks: lm-eval's own prompts
    if measured is not None and plan.before_and_after:  # before the first step, not after the last
        rows = list(islice(measured, plan.limit))
        fit_positions(trainer.model, tokenizer, ours, rows, trainer.args.max_completion_length)
    measuring = test_rows is not None  # None: this run measures nothing
    before_and_after, every_steps = plan.before_and_after and measuring, plan.every_steps if measuring else 0
    plan = replace(plan, protocols=asked, before_and_after=before_and_after, every_steps=every_steps)
    return AccuracyCallback(trainer, measured, answer_format, plan)


def ask(question: str, model_args, training_args, answer_format) -> None:
    """Print a sampled answer of `--model_name_or_path` to `question`, in the recipe's prompt (in one process)."""
    tokenizer = models.load_tokenizer(model_args, training_args)
    model = models.load_for_inference(model_args, training_args)
    messages = answer_format.chat_prompt(question)
    print(f"{model_args.model_name_or_path} answers (sampled, seed {training_args.seed}):", flush=True)
    print(generation.sample(model, tokenizer, messages, training_args.max_completion_length, training_args.seed))


def evaluate_only(test_rows, plan: Plan, training_args, model_args, answer_format) -> list[dict]:
    """GSM8K accuracy of `--model_name_or_path` into `<output_dir>/eval/<name>/` (`settings.resolve` picks the
    folder), in each of `--eval_protocols`: `final`, `final-gsm8k`... of a folder a training run saved, `baseline`...
    of a start model; then the comparison. An evaluation of that name on other terms is kept, and this one written
    beside it (`final-2`, ...). With `--use_vllm` one vLLM engine does the recipe's protocols, and lm-eval's vLLM
    backend its tasks. Returns the summaries."""
    path, output_dir = model_args.model_name_or_path, training_args.output_dir
    max_new = training_args.max_completion_length
    # a run's model: final; a start model: baseline; a run's checkpoint: its own name, in the run's eval/
    trained = layout.path(path, layout.STATE).is_file()
    trained = Path(path).name if trained and layout.is_checkpoint(path) else trained
    tokenizer = models.load_tokenizer(model_args, training_args)
    kept = drop_long_prompts(test_rows, tokenizer, plan.max_prompt_tokens, plan.split["split"])  # as train rows are
    rows, drawn, asked = list(islice(kept, plan.limit)), plan.sampling, plan.protocols
    ours = [p for p in asked if not isinstance(p, harness.Harness)]  # lm-eval loads the model itself for its tasks
    model = None if training_args.use_vllm or not ours else models.load_for_inference(model_args, training_args)
    if model is not None:
        fit_positions(model, tokenizer, ours, rows, max_new)
    if training_args.use_vllm and ours:
        fits(tokenizer, ours, rows, training_args)
        engine = generation.vllm_engine(
            path,
            training_args.vllm_max_model_length,
            dtype=models.inference_dtype(model_args, training_args),
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
            gpu_memory_utilization=training_args.vllm_gpu_memory_utilization,
        )
    summaries, fingerprint = [], scoring.questions_fingerprint(rows)
    same_held_out_rows(path, plan, rows, fingerprint)
    for protocol in asked:
        if isinstance(protocol, harness.Harness):
            summaries.append(evaluate_harness(protocol, plan, training_args, model_args, trained))
            continue
        # What the summary will say of these, so that an evaluation of other terms is never written over:
        terms = dict(model=path, questions_sha256=fingerprint, max_new_tokens=max_new, protocol=protocol.name)
        terms.update(sampling=drawn or None, **plan.split)
        terms["tags"] = list(answer_format.tags) if protocol.judges_format else None
        name = reports.free_name(output_dir, eval_name(evaluated_as(trained), protocol.name), terms)
        settings = dict(max_new_tokens=max_new, batch_size=plan.batch_size, model_name=path, protocol=protocol)
        if training_args.use_vllm:  # vLLM's completions, scored instead of generating with `model`
            prompts = [protocol.prompt(row["question"]) for row in rows]
            settings["vllm"] = generation.generate_vllm(engine, tokenizer, prompts, max_new, **drawn)
        summary, records = evaluate(model, tokenizer, rows, answer_format, desc=f"GSM8K {name}", **settings, **drawn)
        summary |= plan.split | ({"start_model": reports.start_model_of(path)} if trained else {})
        if PartialState().is_main_process:
            write_report(output_dir, name, summary, records)
            compare(output_dir, protocol.name)
        summaries.append(summary)
    return summaries


def same_held_out_rows(model_path: str, plan: Plan, rows, fingerprint: str) -> None:
    """`--eval_split validation` of a model a run trained: the rows held out now must be those its run held out and
    measured (its eval/ summaries' questions), or a changed train file would have it measured on rows it trained on."""
    held_out, dataset = plan.split.get("validation_rows"), plan.dataset
    if plan.split["split"] != "validation" or not Path(model_path).is_dir():
        return
    folder = layout.run_of(model_path)
    trained_on = ((layout.read_record(folder) or {}).get("settings") or {}).get("run", {}).get("dataset")
    if trained_on != dataset and not (trained_on and dataset and Path(trained_on).resolve() == Path(dataset).resolve()):
        return  # another data set than its run's: its held-out rows say nothing of these
    for name in ("baseline", "final"):
        then = layout.read_summary(folder, name) or {}
        same_terms = then.get("split") == "validation" and then.get("validation_rows") == held_out
        if same_terms and then.get("n") == len(rows) and then.get("questions_sha256") not in (None, fingerprint):
            raise RecipeError(
                f"eval_split=validation: the {len(rows)} rows --validation_rows {held_out} holds out of "
                f"{dataset or 'the train split'} are not those {folder}'s run held out and measured (eval/{name}: "
                "other questions): its train data changed since, and the model trained on some of these. Measure "
                "the test split (--eval_split test), or use the train data it was trained on"
            )


def evaluated_as(trained: bool | str) -> str:
    """The name an evaluation of a model takes: a checkpoint's (`trained` holds it), final or baseline."""
    return trained if isinstance(trained, str) else "final" if trained else "baseline"


def evaluate_harness(protocol, plan: Plan, training_args, model_args, trained: bool | str) -> dict:
    """`protocol` by lm-eval on `--model_name_or_path`, loaded by lm-eval as its command line loads it (`hf`, or
    `vllm` with `--use_vllm`), into `eval/final-<protocol>` (`baseline-` of a start model); then the comparison."""
    path, output_dir = model_args.model_name_or_path, training_args.output_dir
    settings = dict(plan.harness)
    spec = harness.model_args(path, model_args.model_revision, training_args.trust_remote_code)
    if training_args.use_vllm:
        settings["backend"] = "vllm"
        spec |= {"lora_local_path": spec.pop("peft")} if "peft" in spec else {}  # lm-eval's vllm name for an adapter
        spec |= {"gpu_memory_utilization": training_args.vllm_gpu_memory_utilization}
        spec |= {"max_model_len": training_args.vllm_max_model_length} if training_args.vllm_max_model_length else {}
    # What the summary will say of it (the questions: the data set and limit its details name), as evaluate_only's:
    plain = eval_name(evaluated_as(trained), protocol.name)
    terms = dict(model=path, protocol=protocol.name, split="test", max_new_tokens=settings["max_gen_toks"] or 256)
    terms["protocol_details"] = harness.protocol_details(protocol, plan.dataset, settings)
    terms["questions_sha256"] = (layout.read_summary(output_dir, plain) or {}).get("questions_sha256")
    name = reports.free_name(output_dir, plain, terms)
    folder = layout.eval_dir(output_dir, name)
    lm = (settings.get("backend", "hf"), spec)
    summary, records = harness.evaluate(lm, protocol, plan.dataset, folder, settings, model_name=path, saved_as=spec)
    summary |= {"split": "test"} | ({"start_model": reports.start_model_of(path)} if trained else {})
    if PartialState().is_main_process:
        write_report(output_dir, name, summary, records)
        compare(output_dir, protocol.name)
    return summary


def fit_positions(model, tokenizer, protocols, rows, max_new_tokens: int) -> None:
    """Refuse, before anything is generated, a protocol whose longest prompt and `max_new_tokens` run past the
    model's trained positions (`max_position_embeddings`): its answers there would be noise, and a score of them a
    number that does not measure the model."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    too = []
    for protocol in protocols:
        prompts = [protocol.prompt(row["question"]) for row in rows]
        if (longest := too_long(tokenizer, prompts, max_new_tokens, limit)) is not None:
            too.append(f"{protocol.name} (its longest prompt {longest} tokens + {max_new_tokens} new)")
    if too:
        raise RecipeError(
            f"Cannot measure in {', '.join(too)}: past the model's {limit} positions, where its answers mean "
            "nothing. Choose another --eval_protocols, or shorten its prompts (fewer shots) or --max_completion_length"
        )


def fits(tokenizer, protocols, rows, training_args) -> None:
    """Stop before vLLM starts where a prompt and its completion would not fit `--vllm_max_model_length`: vLLM
    would refuse it midway."""
    limit, max_new = training_args.vllm_max_model_length, training_args.max_completion_length
    for protocol in protocols:
        prompts = [protocol.prompt(row["question"]) for row in rows]
        if (longest := too_long(tokenizer, prompts, max_new, limit)) is not None:
            raise RecipeError(
                f"The {protocol.name} protocol's longest prompt ({longest} tokens) and --max_completion_length "
                f"{max_new} exceed --vllm_max_model_length {limit}: raise it, or lower --max_completion_length"
            )
