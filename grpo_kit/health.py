"""Training health: the few ways a GRPO run goes wrong, said while it goes wrong, with the setting to change.

TRL already logs every signal needed; the watcher reads them at each logged step. When a condition holds for its
whole window of logged steps (never on one noisy step), it says once what it sees (the metric and its values over
those steps) and what to change (a setting and a value):

| check | reads | holds when |
| --- | --- | --- |
| truncation | completions/clipped_ratio | half the completions or more hit max_completion_length, 3 steps running |
| no_signal | frac_reward_zero_std | 90 % of groups or more score all alike (advantage 0), 5 steps running |
| format_only | rewards/<name>/mean | every format reward at >= 90 % of its maximum, < 10 % correct, 10 steps |
| length_runaway | completions/mean_length | mean length up 30 % on the 10 steps before, correct share not up 2 points |
| entropy_collapse | entropy | below a tenth of the run's first 5 steps, 5 steps running |
| not_finite | loss, grad_norm, reward | any of them NaN or infinite, once |

Findings go to the console, to the log as `health/<check>` (1 on the steps where it holds, 0 elsewhere: wandb draws
when it fired), to `<output_dir>/health.json` and to the end-of-run line; `curves.png` marks them.

A non-finite gradient stops the run: the update is skipped (every process agrees), the step is saved as a checkpoint
that `--resume_from_checkpoint latest` continues from, and the run exits with code `EXIT_NOT_FINITE`. Where the
gradients cannot be seen (DeepSpeed keeps its own), a non-finite loss or gradient norm in the log stops the run
without saving the damaged weights, and the newest checkpoint is the one to resume from.

The watcher reads only what is logged and raises nothing on a metric it does not find (another TRL version may name
it otherwise): that check then stays silent. `--health_checks_off NAME ...` (or `all`) turns checks off.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from pathlib import Path

from transformers import TrainerCallback

from grpo_kit.stopping import EXIT_NOT_FINITE, EarlyStop

logger = logging.getLogger("grpo_demo")

FILE_NAME = "health.json"

# Thresholds, one reason each. Windows count logged steps (one per optimizer step at logging_steps=1); a condition
# must hold on every step of its window, so one noisy step never fires a check.
TRUNCATED_SHARE = 0.5  # half the completions cut: they have no answer block, so they cannot earn correctness
TRUNCATED_WINDOW = 3  # short: a cut completion is wasted at once, and half of them three steps running is no noise
NO_SIGNAL_SHARE = 0.9  # a group whose completions all score alike has advantage 0: it teaches nothing
NO_SIGNAL_WINDOW = 5  # 20 groups at the recipe's 4 prompts per step: unlikely all alike by chance
FORMAT_CEILING_SHARE = 0.9  # every format reward at 90 % of its maximum: the format is learned...
FORMAT_CORRECT_RATE = 0.1  # ...while fewer than 1 completion in 10 is right: rewarded for the form alone
FORMAT_WINDOW = 10  # 640 completions at the recipe's batch: a correct share under 10 % that long is real
SOLVED_RATE = 0.9  # a correct share this high: groups that score alike do so because they are all right
LENGTH_GROWTH = 1.3  # mean length 30 % above the window before it...
LENGTH_GAIN = 0.02  # ...with the share of correct completions up by less than 2 points: longer, not better
LENGTH_WINDOW = 50  # 200 prompts at the recipe's batch: GSM8K's solution lengths vary ~50 %, so shorter windows
# compare problems, not the model (the mean of 200 moves ~3.5 %, far below the 30 % this asks)
ENTROPY_SHARE = 0.1  # a tenth of the run's starting entropy: sampling close to greedy, groups stop differing
ENTROPY_WINDOW = 5  # the start's mean and the last steps alike: a dip of one step is not a collapse
TEMPERATURE_CAP = 1.2  # the highest temperature the remedies suggest: above it, sampling turns to noise

CHECKS = ("truncation", "no_signal", "format_only", "length_runaway", "entropy_collapse", "not_finite")
CLIPPED, ZERO_STD = "completions/clipped_ratio", "frac_reward_zero_std"
LENGTH, ENTROPY = "completions/mean_length", "entropy"
NOT_FINITE_KEYS = ("loss", "grad_norm", "reward")  # and each rewards/<name>/mean: TRL logs None for NaN rewards
RESUME_NOTE = (
    "a changed setting takes effect in a new run (another --output_dir); resuming keeps the run's settings and "
    "schedule unless --allow_changed_settings true"
)
TRAINING_KEYS = ("loss", "reward")  # a logged entry with either is a training step (not an evaluation)


def reward_roles(reward_funcs, answer_format) -> tuple[dict[str, float], dict[str, float]]:
    """({logged key: maximum} of the correctness rewards, the same of the format rewards), found by scoring one
    perfect completion in the recipe's own format against its gold answer and against another: a reward that
    changes with the gold judges correctness, one that does not judges form. A reward that fails on the probe, or
    earns nothing on a perfect completion, is left out (no check reads it)."""
    completion = answer_format.solution_template.format(reasoning="2 + 2 = 4", answer="4")
    prompts = [answer_format.chat_prompt("What is 2 + 2?")]
    completions = [[{"role": "assistant", "content": completion}]]
    correct, form = {}, {}
    for func in reward_funcs:
        name = getattr(func, "__name__", None)
        try:
            right, wrong = (float(func(prompts=prompts, completions=completions, answer=[g])[0]) for g in ("4", "5"))
        except Exception:  # noqa: BLE001 - a user's reward of another shape: not one the checks can read
            continue
        if name and math.isfinite(right) and right > 0:
            (correct if right != wrong else form)[f"rewards/{name}/mean"] = right
    return correct, form


def _finite(value) -> bool:
    """A logged number that is finite; None (TRL's NaN average) is not; anything else is not a number to judge."""
    number = _number(value)
    return number is None and value is not None or number is not None and math.isfinite(number)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


class Watcher:
    """The checks over a stream of logged entries, independent of any trainer: `observe` one entry at a time.

    `settings` holds the values the remedies name (`SETTINGS`); `scaled`: an fp16 run, whose gradient scaler makes
    and skips infinite gradients on purpose, so only the loss counts as not finite.
    """

    def __init__(self, settings: dict, correct: dict[str, float], form: dict[str, float], off=(), scaled=False):
        self.settings, self.correct, self.form, self.scaled = settings, correct, form, scaled
        self.enabled = [name for name in CHECKS if name not in off and "all" not in off]
        self.series: dict[str, list[float]] = defaultdict(list)
        self.findings: list[dict] = []
        self.fired: set[str] = set()
        self.entropy_start: float | None = None

    def observe(self, entry: dict) -> tuple[dict[str, float], list[dict]]:
        """Take one logged entry: ({`health/<check>`: 1.0 where it holds now, else 0.0}, the findings it makes
        first). An entry of no training step (an evaluation's) gives ({}, [])."""
        if not any(key in entry for key in TRAINING_KEYS):
            return {}, []
        step = entry.get("step")
        for key, value in entry.items():
            number = _number(value)
            if number is not None and math.isfinite(number):  # a NaN is the not_finite check's, not a trend
                self.series[key].append(number)
        self.series["_correct_rate"].append(self._correct_rate(entry))
        if self.entropy_start is None and len(self.series[ENTROPY]) >= ENTROPY_WINDOW:
            self.entropy_start = _mean(self.series[ENTROPY][:ENTROPY_WINDOW])
        metrics, new = {}, []
        for name in self.enabled:
            seen = getattr(self, f"_{name}")(entry)
            metrics[f"health/{name}"] = 1.0 if seen else 0.0
            if seen and name not in self.fired:
                new.append(self.record(name, step, *seen))
        return metrics, new

    def record(self, check: str, step, what: str, change: str) -> dict:
        """A finding, kept (a check fires once by itself; a stop records its own whenever it happens)."""
        self.fired.add(check)
        finding = {"check": check, "step": step, "what": what, "change": change}
        self.findings.append(finding)
        return finding

    # ---- the checks: each returns (what it sees, what to change) while its condition holds, else None

    def _last(self, key: str, n: int) -> list[float] | None:
        values = self.series.get(key, [])
        return values[-n:] if len(values) >= n else None

    def _correct_rate(self, entry: dict) -> float | None:
        """The share of completions the correctness rewards gave full marks this step, None where not logged."""
        rates = [_number(entry.get(key)) for key in self.correct]
        if not rates or any(r is None for r in rates):
            return None
        return _mean([rate / self.correct[key] for rate, key in zip(rates, self.correct, strict=True)])

    def _truncation(self, entry):
        last = self._last(CLIPPED, TRUNCATED_WINDOW)
        if last is None or min(last) < TRUNCATED_SHARE:
            return None
        n = self.settings.get("max_completion_length")
        return (
            f"{CLIPPED} {_fmt(last)} over the last {TRUNCATED_WINDOW} steps: most completions are cut at "
            f"max_completion_length ({n} tokens), and a cut completion has no answer to earn the correctness reward",
            f"raise --max_completion_length (e.g. {2 * n if n else 'double it'}); completions that never end may "
            "also mean the model's end-of-turn token is not the tokenizer's EOS (read the completions table)",
        )

    def _no_signal(self, entry):
        last = self._last(ZERO_STD, NO_SIGNAL_WINDOW)
        if last is None or min(last) < NO_SIGNAL_SHARE:
            return None
        what = (
            f"{ZERO_STD} {_fmt(last)} over the last {NO_SIGNAL_WINDOW} steps: in most groups every completion earns "
            "the same reward, so its advantages are 0 and it teaches nothing"
        )
        rate = self.series["_correct_rate"][-1]
        if rate is not None and rate >= SOLVED_RATE:
            return what, "the training problems are solved: more steps teach little; stop here or use harder ones"
        return what, f"more varied groups: {self._more_generations()}{self._warmer(' or ')}"

    def _more_generations(self) -> str:
        """Twice the generations per prompt, with twice the accumulation: the prompts per step stay, and the
        completions per step stay a multiple of the group (GRPO's batch rule)."""
        g, gas = self.settings.get("num_generations"), self.settings.get("gradient_accumulation_steps")
        if not g or not gas:
            return "raise --num_generations"
        return f"--num_generations {2 * g} --gradient_accumulation_steps {2 * gas} (now {g} and {gas})"

    def _warmer(self, joint: str) -> str:
        t = self.settings.get("temperature")
        if not t or t >= TEMPERATURE_CAP:
            return ""
        return f"{joint}--temperature {min(round(t + 0.2, 2), TEMPERATURE_CAP):g} (now {t:g})"

    def _format_only(self, entry):
        if not self.correct or not self.form:
            return None
        shares = [self._last(key, FORMAT_WINDOW) for key in self.form]
        rates = self._last("_correct_rate", FORMAT_WINDOW)
        if any(s is None for s in shares) or rates is None or any(r is None for r in rates):
            return None
        formed = [min(s) / self.form[key] for s, key in zip(shares, self.form, strict=True)]
        if min(formed) < FORMAT_CEILING_SHARE or max(rates) >= FORMAT_CORRECT_RATE:
            return None
        return (
            f"the format rewards are at {100 * min(formed):.0f} % or more of their maximum while "
            f"{100 * max(rates):.0f} % of completions or fewer are correct, over the last {FORMAT_WINDOW} steps: "
            "the model is rewarded for the form alone",
            "read the completions table (gold vs extracted): a grading problem shows there; else "
            f"{self._more_generations()} so that a group more often holds a correct answer to learn from, or start "
            "from a stronger model",
        )

    def _length_runaway(self, entry):
        lengths = self._last(LENGTH, 2 * LENGTH_WINDOW)
        rates = self._last("_correct_rate", 2 * LENGTH_WINDOW)
        if lengths is None or rates is None or any(r is None for r in rates):
            return None
        before, now = _mean(lengths[:LENGTH_WINDOW]), _mean(lengths[LENGTH_WINDOW:])
        gain = _mean(rates[LENGTH_WINDOW:]) - _mean(rates[:LENGTH_WINDOW])
        if now < LENGTH_GROWTH * before or gain >= LENGTH_GAIN:
            return None
        n = self.settings.get("max_completion_length")
        return (
            f"{LENGTH} {before:.0f} -> {now:.0f} tokens (means of {LENGTH_WINDOW} steps) while the correct share "
            f"moved {100 * gain:+.1f} points: completions grow without earning more",
            "read the completions for repetition or padding; --mask_truncated_completions true keeps cut ones out "
            f"of the loss, and a lower --max_completion_length (now {n}) caps the growth",
        )

    def _entropy_collapse(self, entry):
        last = self._last(ENTROPY, ENTROPY_WINDOW)
        start = self.entropy_start
        if last is None or start is None or len(self.series[ENTROPY]) < 2 * ENTROPY_WINDOW:
            return None
        if max(last) >= ENTROPY_SHARE * start:
            return None
        lr, beta = self.settings.get("learning_rate"), self.settings.get("beta")
        change = f"--learning_rate {lr / 2:g} (now {lr:g})" if lr else "a lower --learning_rate"
        change += self._warmer(", ")
        if not beta:
            change += "; --beta 0.04 (the reference's KL) keeps the policy nearer the start"
        return (
            f"{ENTROPY} {_fmt(last)} over the last {ENTROPY_WINDOW} steps, from {start:.3g} at the start: the policy "
            "samples close to greedily, so its groups stop differing",
            change,
        )

    def _not_finite(self, entry):
        keys = [key for key in NOT_FINITE_KEYS if not (self.scaled and key == "grad_norm")]
        keys += [key for key in entry if key.startswith("rewards/") and key.endswith("/mean")]
        bad = {key: entry[key] for key in keys if key in entry and not _finite(entry[key])}
        if not bad:
            return None
        rewards = [key for key in bad if key.startswith("rewards/") or key == "reward"]
        return (
            ", ".join(f"{key} {value}" for key, value in bad.items())
            + " at this step"
            + (" (TRL logs a reward as None when it returned None or NaN for every completion)" if rewards else ""),
            self.not_finite_remedy(),
        )

    def not_finite_remedy(self) -> str:
        lr, clip = self.settings.get("learning_rate"), self.settings.get("max_grad_norm")
        lower = f"--learning_rate {lr / 10:g} (now {lr:g})" if lr else "a lower --learning_rate"
        return (
            "--resume_from_checkpoint latest goes on past the step (a passing bad batch may not return); if it "
            f"recurs, a new run with {lower} and --max_grad_norm above 0 (now {clip}); a reward function that "
            "returns NaN shows as its rewards/<name>/mean"
        )

    def stops(self, entry: dict) -> bool:
        """Whether this entry's loss or gradient norm is not finite (and the check is on): the run must stop. Under
        fp16's gradient scaler only the loss counts (it skips infinite gradients itself)."""
        keys = ("loss",) if self.scaled else ("loss", "grad_norm")
        return "not_finite" in self.enabled and any(key in entry and not _finite(entry[key]) for key in keys)


def loss_explanation(settings: dict, loss: float) -> str:
    """What the loss at the first logged step means in this configuration, and which curves show learning."""
    beta, iterations = settings.get("beta") or 0.0, settings.get("num_iterations") or 1
    fresh = (settings.get("steps_per_generation") or 1) <= (settings.get("gradient_accumulation_steps") or 1)
    lines = [f"Training health: first step's loss {loss:.4g}."]
    if beta == 0 and iterations == 1 and fresh:
        token_level = settings.get("loss_type", "dapo") not in ("grpo", "sapo")
        lines.append(
            "With no KL term (beta 0) and one iteration per generation batch (num_iterations 1), each completion is "
            "scored by the policy that sampled it: the probability ratio is 1, the loss is minus the advantage-"
            "weighted tokens, and a group's advantages sum to 0. So it stays near 0"
            + (" (its sign says whether the longer completions were the better ones)" if token_level else "")
            + " and says nothing about learning."
        )
    else:
        if iterations > 1 or not fresh:
            lines.append("Several optimizer steps per generation batch: later ones move the ratio off 1 and the loss.")
        if beta > 0:
            lines.append(f"beta {beta}: the loss holds beta x KL to the start model, 0 at first, growing as it moves.")
    lines.append(
        "Learning shows in reward and rewards/<name>/mean rising, eval accuracy, and completions/mean_length; "
        "health checks watch the rest (grpo_kit/health.py)."
    )
    return " ".join(lines)


class HealthCallback(EarlyStop):
    """The watcher on a trainer: marks each log with `health/<check>`, says findings as they come, writes
    `health.json`, and stops the run on non-finite gradients (see the module docstring; the stop is the one every
    early stop takes, grpo_kit/stopping.py)."""

    exit_code = EXIT_NOT_FINITE
    level = logging.ERROR

    def __init__(self, trainer, watcher: Watcher):
        super().__init__(trainer)
        self.watcher = watcher
        self.path = Path(trainer.args.output_dir) / FILE_NAME
        self.skipped_step: int | None = None  # the step whose update was skipped: its gradients were not finite
        self.seen_finite_step: int | None = None  # the last step whose gradients were seen, and finite
        self.explained = False
        self.seconds, self.observed, self.started = 0.0, 0, time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()
        self.explained = state.global_step > 0
        for entry in state.log_history:  # a resumed run: what it logged before, quietly (each finding said once)
            self.watcher.observe(entry)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if "not_finite" not in self.watcher.enabled or model is None or self.watcher.scaled:
            return  # fp16's scaler skips non-finite steps itself
        started = time.perf_counter()
        finite = self._gradients_finite(model)
        if finite is False:
            for param in model.parameters():
                param.grad = None  # the optimizer leaves a parameter without a gradient as it is: no update
            self.skipped_step = state.global_step + 1
        elif finite:
            self.seen_finite_step = state.global_step + 1
        self.seconds += time.perf_counter() - started

    def _gradients_finite(self, model) -> bool | None:
        """Whether every process's gradients are finite (one reduction, so that every process skips alike); None
        where no process holds them (DeepSpeed keeps its own)."""
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # a sharded (FSDP) gradient
        device = grads[0].device if grads else self.trainer.accelerator.device
        # [finite, seen]: reduced with MIN, then MAX of "seen" is read as "some process saw gradients"
        finite = torch.stack([g.sum(dtype=torch.float32) for g in grads]).sum().isfinite() if grads else True
        flags = torch.tensor([float(finite), -float(bool(grads))], device=device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
        finite, seen = flags.tolist()
        return bool(finite) if seen < 0 else None

    def on_step_end(self, args, state, control, **kwargs):
        if self.watcher.scaled or "not_finite" not in self.watcher.enabled:
            return
        if self.skipped_step == state.global_step:
            self._skipped(args, state, control)
        elif self.seen_finite_step != state.global_step:
            control.should_log = True  # gradients unseen (DeepSpeed): the logged loss and norm are the check

    def _skipped(self, args, state, control) -> None:
        """The update of this step was skipped: say so; before the last step, save its checkpoint and stop."""
        step, last = state.global_step, state.global_step >= state.max_steps
        what = "the gradients are not finite: this step's update was skipped"
        finding = self.watcher.record("not_finite", step, what, self.watcher.not_finite_remedy())
        self._say(finding)
        control.should_log = True  # the step's loss and gradient norm, as they were
        if last:  # the run ends here anyway, with the weights before this update: a finished model
            return
        self._keep_older_checkpoints()
        self.stop_here(  # the weights before this step's update: safe to resume from
            state,
            control,
            reason="the gradients are not finite",
            save=True,
            saved=f"checkpoint-{step}, holding the weights before this step's update",
        )

    def _keep_older_checkpoints(self) -> None:
        """The stop's checkpoint repeats the weights of the one before: it rotates no older one out."""
        if self.trainer.args.save_total_limit:
            self.trainer.args.save_total_limit += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        started = time.perf_counter()
        entry = {**(logs or {}), "step": state.global_step}
        metrics, new = self.watcher.observe(entry)
        if metrics:
            self.observed += 1
            logs.update(metrics)  # before the reporters (wandb) read it
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(metrics)  # the trainer stored a copy: trainer_state.json
        if not self.explained and _number(entry.get("loss")) is not None:
            self.explained = True
            if self.main:
                logger.info(loss_explanation(self.watcher.settings, entry["loss"]))
        for finding in new:
            self._say(finding)
        handled = state.global_step in (self.skipped_step, self.seen_finite_step)
        if self.stopped is None and not handled and self.watcher.stops(entry):
            # The gradients were not seen: the update went in, or (fp16) the scaler skipped it.
            scaler_skipped = self.watcher.scaled
            self.stop_here(
                state,
                control,
                reason="the logged loss or gradient norm is not finite",
                save=scaler_skipped,
                saved=f"checkpoint-{state.global_step} (the gradient scaler skipped the update)"
                if scaler_skipped
                else "nothing: this step's weights may not be finite; the newest checkpoint is the last good one",
            )
            if scaler_skipped:
                self._keep_older_checkpoints()
        if new or self.stopped:
            self.write(state)
        self.seconds += time.perf_counter() - started

    def _say(self, finding: dict) -> None:
        if self.main:
            logger.warning(
                "Training health, step %s: %s (%s).\n  Change: %s\n  (%s)",
                finding["step"],
                finding["check"],
                finding["what"],
                finding["change"],
                RESUME_NOTE,
            )

    def on_train_end(self, args, state, control, **kwargs):
        self.write(state)

    def status(self) -> str:
        return "stopped" if self.stopped else "findings" if self.watcher.findings else "ok"

    def write(self, state) -> None:
        if not self.main:
            return
        elapsed = time.perf_counter() - self.started
        record = {
            "status": self.status(),
            "stopped": self.stopped,
            "findings": self.watcher.findings,
            "checks": {name: name in self.watcher.enabled for name in CHECKS},
            "cost": {
                "logged_steps": self.observed,
                "health_ms_per_step": round(1000 * self.seconds / max(self.observed, 1), 4),
                "training_ms_per_step": round(1000 * elapsed / max(self.observed, 1), 1),
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def summary_line(self) -> str:
        if not self.watcher.findings and not self.stopped:
            return f"Training health: ok ({len(self.watcher.enabled)} checks, {self.path})"
        lines = [f"Training health: {self.status()} ({self.path})"]
        lines += [f"  step {f['step']}: {f['check']} -> {f['change']}" for f in self.watcher.findings]
        if self.stopped:
            stop = self.stopped
            lines.append(f"  stopped at step {stop['step']}: {stop['reason']}; saved {stop['saved']}")
        return "\n".join(lines)

    @property
    def then(self) -> str:
        """What to do next, said when the run stops (`EarlyStop.exit_if_stopped`)."""
        return self.watcher.not_finite_remedy()


class _EndOfRunLine(TrainerCallback):
    """The health line, after everything else the end of training prints (the final evaluation's table)."""

    def __init__(self, health: HealthCallback):
        self.health = health

    def on_train_end(self, args, state, control, **kwargs):
        if self.health.main:
            print(self.health.summary_line(), flush=True)


SETTINGS = (
    "max_completion_length",
    "num_generations",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "temperature",
    "learning_rate",
    "beta",
    "num_iterations",
    "loss_type",
    "max_grad_norm",
)


def watch(trainer, off, reward_funcs, answer_format) -> HealthCallback:
    """Put the health checks on `trainer` (all but those in `off`; `all` for none) and return them."""
    settings = {name: getattr(trainer.args, name, None) for name in SETTINGS}
    scaled = getattr(trainer.accelerator, "scaler", None) is not None  # fp16 with a gradient scaler
    watcher = Watcher(settings, *reward_roles(reward_funcs, answer_format), off=off, scaled=scaled)
    health = HealthCallback(trainer, watcher)
    trainer.callback_handler.callbacks.insert(0, health)  # before the reporters: wandb logs its health/ metrics
    trainer.add_callback(_EndOfRunLine(health))
    return health
