"""What a run prints, for a person to read: its settings, one progress bar (in a terminal) that log lines print
above, a compact line per logged step, the health findings, and at the end the accuracy table, the paired verdict
and where everything was written. The completions table goes to `<output_dir>/completions/` and wandb, and to the
console with `--show_completions true`. Warnings of the libraries that this recipe triggers and cannot act on are
filtered here by their exact text, each with the reason; nothing else is silenced."""

import logging
import sys
import warnings
from pathlib import Path

from grpo_kit import layout, patches
from grpo_kit.models import zero_stage

logger = logging.getLogger("grpo_demo")

# (logger, start of the message), why above each: informational lines of libraries that read like faults here
LIBRARY_LINES = (
    # Checkpoints are ordered by step when their mtimes tie (a copy, a network filesystem): nothing to do.
    ("transformers.trainer_utils", "mtime may not be reliable on this filesystem"),
    # Tied embeddings (Qwen2.5, Llama 3.2 and the tiny models): lm_head shares embed_tokens' weights, which were
    # loaded. The trainer's own check lists it as missing from the checkpoint; a checkpoint lacking another key is said.
    ("transformers.trainer", "There were missing keys in the checkpoint model loaded: ['lm_head.weight']."),
    # A training run's baseline and final hand lm-eval the trainer's own model, in one process (several processes
    # and ZeRO-3 are refused at start): lm-eval warns of exactly that, twice, at each evaluation.
    ("lm_eval.models.huggingface", "`pretrained` model kwarg is not of type `str`."),
    ("lm_eval.models.huggingface", "Passed an already-initialized model through `pretrained`"),
)


class _Drop(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def quiet_libraries() -> None:
    """Filter the library warnings this recipe triggers and cannot act on, each by its text; turn off the
    libraries' own bars (loading and writing weights), so that the training bar is the one."""
    # TRL 1.16's unwrap_model_for_generation reads transformers' deprecated `is_gradient_checkpointing` at every
    # rollout and evaluation: the rename is TRL's to make (the recipe sets activation_checkpointing itself). It turns
    # checkpointing off for each rollout and on again after it, by transformers' deprecated names too
    # (trl/models/utils.py, `_unwrap_model_for_generation`; transformers 5.24 warns at each call).
    for name in ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable"):
        warnings.filterwarnings("ignore", message=f"`{name}` is deprecated", category=FutureWarning)
    for name, start in LIBRARY_LINES:
        target = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.start == start for f in target.filters):
            target.addFilter(_Drop(start))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


class TqdmHandler(logging.StreamHandler):
    """A log handler that writes above the progress bar (tqdm.write) instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's own contract: a failing handler reports, never raises
            self.handleError(record)


def _show(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def step_line(step: int, max_steps: int, logs: dict, correct: dict[str, float], rollout: int | None = None) -> str:
    """One logged training step: `step 3/40  reward 1.23  correct 45 %  length 61 (12 % cut)  lr 3e-04  0.9 s/step`.
    `correct`: {logged reward mean: its full marks} of the correctness rewards (health.reward_roles). A step that
    sampled nothing (one generation batch serving several: steps_per_generation) names the one that did, `rollout`."""
    trained = f"lr {_show(logs.get('learning_rate'), '.2g')}  {_show(logs.get('step_time'), '.2f')} s/step"
    if "reward" not in logs and rollout is not None:
        return f"step {step}/{max_steps}  on the completions sampled at step {rollout}  {trained}"
    shares = [logs[key] / top for key, top in correct.items() if isinstance(logs.get(key), (int, float))]
    share = 100 * sum(shares) / len(shares) if shares else None
    clipped = logs.get("completions/clipped_ratio")
    cut = f" ({_show(100 * clipped, '.0f')} % cut)" if isinstance(clipped, (int, float)) else ""
    length = _show(logs.get("completions/mean_length"), ".0f")
    reward = _show(logs.get("reward"), ".3f")
    return f"step {step}/{max_steps}  reward {reward}  correct {_show(share, '.0f')} %  length {length}{cut}  {trained}"


def install(trainer, correct: dict[str, float], show_completions: bool = False) -> None:
    """Replace the trainer's bar and printed log dicts by one bar and `step_line`s; the completions table printed
    only with `show_completions` (TRL still writes it to completions/ and wandb)."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for kind in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(kind)
    _SHOWN["table"] = show_completions
    patches.completions_table_only_when(lambda: _SHOWN["table"])

    class Console(TrainerCallback):
        bar, rollout = None, None  # the bar; the last step that sampled completions

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:  # a bar in a terminal only: none in a log file
                self.bar = tqdm(total=state.max_steps, initial=state.global_step, unit="step", disable=None)

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)
                if state.global_step >= state.max_steps:  # closed before the final evaluation prints its table
                    self.on_train_end(args, state, control)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and ("loss" in logs or "reward" in logs):
                self.rollout = state.global_step if "reward" in logs else self.rollout
                tqdm.write(step_line(state.global_step, state.max_steps, logs, correct, self.rollout), file=sys.stdout)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    trainer.add_callback(Console())


_SHOWN = {"table": False}  # whether the run in this process prints the completions table (`install`)


def settings_summary(run, training_args, model_args, rows: int) -> str:
    """The lines a run opens with: model, objective, precision, batch arithmetic, output folder."""
    args = training_args
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    prompts = per_step // max(args.num_generations, 1)
    compute = "bf16 autocast" if args.bf16 else "fp16 autocast" if args.fp16 else "fp32"
    if zero_stage() and (args.bf16 or args.fp16):  # accelerate turns on no autocast: DeepSpeed computes in its dtype
        compute = f"{'bf16' if args.bf16 else 'fp16'} (DeepSpeed ZeRO-{zero_stage()}'s weights, no autocast)"
    adapter = ""
    if model_args.use_peft:
        adapter = f", LoRA r {model_args.lora_r}" + (" on a 4-bit base" if model_args.load_in_4bit else "")
    steps = f"{args.max_steps} steps" if args.max_steps > 0 else f"{args.num_train_epochs:g} epoch(s)"
    warm = f", warm-started on {run.warm_start_rows} solutions" if getattr(run, "warm_start_rows", 0) else ""
    objective = f"loss {args.loss_type}, scale_rewards {args.scale_rewards}, beta {args.beta:g}"
    if args.importance_sampling_level != "token":
        objective += f", importance sampling per {args.importance_sampling_level}"
    lines = [
        f"GRPO on GSM8K: {model_args.model_name_or_path}{warm} -> {args.output_dir}",
        f"  objective  {objective}, lr {args.learning_rate:g}",
        f"  precision  weights {model_args.dtype}, compute {compute}{adapter}",
        f"  batch      {prompts} prompts x {args.num_generations} generations = {per_step} completions per step "
        f"({args.per_device_train_batch_size} per device x {args.gradient_accumulation_steps} accumulation x "
        f"{args.world_size} process{'es' if args.world_size > 1 else ''}), up to {args.max_completion_length} "
        f"tokens each",
        f"  length     {steps} on {rows} prompts; checkpoints every {args.save_steps:g} steps",
        f"  decoding   rollouts at temperature {args.temperature:g}, top_p {args.top_p:g}, top_k {args.top_k or 0}, "
        f"min_p {args.min_p or 0:g}, repetition_penalty {args.repetition_penalty:g}; evaluations greedy; the "
        "model's generation_config.json for its end tokens only",
    ]
    accumulation = max(args.gradient_accumulation_steps, 1)
    reuse = (getattr(args, "steps_per_generation", None) or args.gradient_accumulation_steps) // accumulation
    if reuse > 1:  # TRL samples a generation batch once and trains `reuse` optimizer steps on its slices
        lines.insert(4, f"  rollouts   one generation batch serves {reuse} optimizer steps (steps_per_generation)")
    return "\n".join(lines)


def where_written(output_dir: str | Path, saved_model: bool, ask: str | None = None) -> str:
    """The closing lines: where the model, curves, evaluations, completions and run record are; `ask`: the command
    that asks the saved model a question."""
    folder = Path(output_dir)
    found = [
        ("model", folder if saved_model else None),
        ("curves", layout.path(folder, layout.CURVES)),
        ("evaluations", layout.comparison(folder)),
        ("completions", layout.path(folder, layout.COMPLETIONS)),
        ("health", layout.path(folder, layout.HEALTH)),
        ("run record", layout.path(folder, layout.RECORD)),
    ]
    lines = [f"Written to {folder}:"]
    lines += [f"  {name:<12} {path}" for name, path in found if path is not None and Path(path).exists()]
    return "\n".join(lines + ([f"Ask it: {ask}"] if ask and saved_model else []))
