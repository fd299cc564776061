"""Training health: the few ways a GRPO run goes wrong, said while it goes wrong, with the setting to change.

The checks (`CHECKS`) read what TRL logs at each logged step, with the thresholds below
(README.md's "Training health" tables them). A check whose condition holds over its whole window of logged steps
says once what it sees and what to change: to the console, to the log as `health/<check>` (1 while it holds, else 0:
wandb draws when it fired), to `<output_dir>/health.json`, to the end-of-run line and as a mark in `curves.png`. A
metric not logged (another TRL version may name it otherwise) leaves its check silent. A non-finite gradient skips
its update and stops the run with the step's checkpoint, exit code `EXIT_NOT_FINITE`. `--health_checks_off NAME ...`
(or `all`) turns checks off."""

import json
import logging
import math
import time
from collections import defaultdict

import torch
from transformers import TrainerCallback

from grpo_kit import layout, runs
from grpo_kit.stopping import EXIT_NOT_FINITE, EarlyStop

logger = logging.getLogger("grpo_demo")

# Thresholds, one reason each. Windows count logged steps (one per optimizer step at logging_steps=1).
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
NOT_LEARNING_MEASUREMENTS = 5  # accuracy measurements after the first before judging: each of 30 healthy demo runs
# had risen by step 10 (its third; benchmarks/demo_runs.py), and a real run's are 50 steps apart, its strict accuracy
# rising tens of points as the format is learnt (published, Qwen2.5-1.5B: 1.7 -> 48.7 %); step 0's is the start
NOT_LEARNING_RECENT = 3  # the latest measurements averaged as "now"
NOT_LEARNING_WINDOW = 10  # logged steps: the correct share's windows (a quarter of the run once that is longer)
NOT_LEARNING_RISE = 0.02  # a rise under 2 points is flat...
NOT_LEARNING_Z = 2.5  # ...when even its upper bound (rise + 2.5 standard errors) is under it: the noise the signal
# shows (the spread of its successive values) cannot be hiding a rise; a bound under 0 is a fall
NOT_LEARNING_HOLD = 2  # judgments running before it is said: measurements, or windows of the correct share
STUCK_GROUPS = 0.5  # a cause: half the groups or more score all alike, so half of every batch teaches nothing
FEW_CORRECT = 0.1  # a cause: under 1 completion in 10 right, a group of 8-16 rarely holds one to reinforce
SHRINKING = 0.85  # a cause: completions 15 % shorter than at the start, the reasoning cut back
COLD = 0.5  # a cause: entropy half the start's, sampling nearer greedy, groups differ less

CHECKS = ("truncation", "no_signal", "format_only", "length_runaway", "entropy_collapse", "not_learning", "not_finite")
# What each check needs before it can say anything, ok included (not_learning: `Watcher.unjudged`). A run
# that ends sooner says "too few steps to judge" for it: a check that never looked is not a check that passed.
NEEDS = {
    "truncation": TRUNCATED_WINDOW,
    "no_signal": NO_SIGNAL_WINDOW,
    "format_only": FORMAT_WINDOW,
    "length_runaway": 2 * LENGTH_WINDOW,
    "entropy_collapse": 2 * ENTROPY_WINDOW,
    "not_learning": 3 * NOT_LEARNING_WINDOW,  # of the correct share; where accuracy is measured, measurements instead
    "not_finite": 1,
}  # logged steps
NOTHING_EARNED = 64  # completions all at 0 before no_signal says so at once: a model that writes the format once in
# 10 completions shows it in 64 with probability 0.999; at the recipe's batch (64 a step), the first step
UNJUDGED = "unjudged"  # what a check returns while it has too few steps to judge
CLIPPED, ZERO_STD = "completions/clipped_ratio", "frac_reward_zero_std"
ACCURACY = "eval_accuracy_strict"  # greedy accuracy on a subset, logged by the evaluation during training
LENGTH, ENTROPY = "completions/mean_length", "entropy"
RESUME_NOTE = (
    "a changed setting takes effect in a new run (another --output_dir); resuming keeps the run's settings and "
    "schedule unless --allow_changed_settings true"
)


def reward_roles(declared: dict[str, tuple[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """({logged key: maximum} of the correctness rewards, and of the format rewards), from the recipe's declaration
    ({reward name: ("correct" or "format", maximum)}, `REWARD_ROLES`)."""
    correct, form = {}, {}
    for name, (role, top) in declared.items():
        (correct if role == "correct" else form)[f"rewards/{name}/mean"] = top
    return correct, form


def _finite(value) -> bool:
    """A logged number that is finite; None (TRL's NaN average) is not; anything else is not a number to judge."""
    return value is not None and ((number := _number(value)) is None or math.isfinite(number))


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


class Watcher:
    """The checks over a stream of logged entries, independent of any trainer: `observe` one entry at a time. `args`:
    the training settings the remedies name; `scaled`: an fp16 run, whose gradient scaler makes and skips infinite
    gradients on purpose, so only the loss counts as not finite; `measured`: the questions each in-training accuracy
    measurement asks (not_learning reads it), 0 where none is made (not_learning reads the correct share)."""

    def __init__(self, args, correct: dict[str, float], form: dict[str, float], off=(), scaled=False, measured=0):
        self.args, self.correct, self.form, self.scaled, self.measured = args, correct, form, scaled, measured
        self.stop_keys = ("loss",) if scaled else ("loss", "grad_norm")  # not finite: the run stops
        self.accuracy: list[tuple[int, float]] = []  # (step, greedy accuracy) of each measurement during training
        self.enabled = [name for name in CHECKS if name not in off and "all" not in off]
        self.series: dict[str, list[float | None]] = defaultdict(list)
        self.findings: list[dict] = []
        self.entropy_start: float | None = None  # the mean of the first ENTROPY_WINDOW steps' entropy
        self._judged: tuple = (0, 0, None)  # not_learning: (values judged, judgments held running, its finding)
        self.steps = 0  # training steps observed
        self.judged: set[str] = set()  # the checks that have had enough steps to judge

    def observe(self, entry: dict) -> tuple[dict[str, float], list[dict]]:
        """Take one logged entry: ({`health/<check>`: 1.0 where it holds now, else 0.0}, the findings it makes
        first). An entry of no training step (an evaluation's) gives ({}, []); its accuracy is kept for not_learning."""
        step = entry.get("step")
        if "loss" not in entry and "reward" not in entry:  # not a training step: an evaluation
            if _number(accuracy := entry.get(ACCURACY)) is not None and math.isfinite(accuracy):
                self.accuracy.append((step, float(accuracy)))
            return {}, []
        self.steps += 1
        for key, value in entry.items():
            if _number(value) is not None and math.isfinite(value):  # a NaN is the not_finite check's, not a trend
                self.series[key].append(float(value))
        self.series["_correct_rate"].append(self._correct_rate(entry))
        if self.entropy_start is None and len(self.series[ENTROPY]) >= ENTROPY_WINDOW:
            self.entropy_start = _mean(self.series[ENTROPY][:ENTROPY_WINDOW])
        metrics, new = {}, []
        for name in self.enabled:
            if (seen := getattr(self, f"_{name}")(entry)) == UNJUDGED:
                seen = None
            else:
                self.judged.add(name)
            metrics[f"health/{name}"] = 1.0 if seen else 0.0
            if seen and all(finding["check"] != name for finding in self.findings):
                new.append(self.record(name, step, *seen))
        return metrics, new

    def record(self, check: str, step, what: str, change: str) -> dict:
        """A finding, kept (a check fires once by itself; a stop records its own whenever it happens)."""
        self.findings.append(finding := {"check": check, "step": step, "what": what, "change": change})
        return finding

    # ---- the checks: each returns (what it sees, what to change) while its condition holds, else None

    def _last(self, key: str, n: int) -> list[float] | None:
        """The last `n` values of `key`, None while fewer were logged (or, of the correct share, one was not)."""
        values = self.series.get(key, [])[-n:]
        return values if len(values) == n and None not in values else None

    def _correct_rate(self, entry: dict) -> float | None:
        """The share of completions the correctness rewards gave full marks this step, None where not logged."""
        rates = [_number(entry.get(key)) for key in self.correct]
        if not rates or None in rates:
            return None
        return _mean([rate / top for rate, top in zip(rates, self.correct.values(), strict=True)])

    def unjudged(self, cannot: bool = False) -> dict[str, str]:
        """{check: what it needs} of the enabled checks that have had too few steps to judge; `cannot`: {check: why}
        of those that had their steps and still could not judge (a metric not logged, or no correctness reward)."""
        found = {}
        for name in (n for n in self.enabled if n not in self.judged):
            if name == "not_learning" and self.measured:
                need, had, what = NOT_LEARNING_MEASUREMENTS + 1, len(self.accuracy), "accuracy measurements"
            else:
                need, had, what = NEEDS[name], self.steps, "logged steps"
            found[name] = f"needs {need} {what}" if had < need else "cannot judge: a metric it reads was not logged"
        return {name: need for name, need in found.items() if need.startswith("cannot") == cannot}

    def _truncation(self, entry):
        if (last := self._last(CLIPPED, TRUNCATED_WINDOW)) is None:
            return UNJUDGED
        if min(last) < TRUNCATED_SHARE:
            return None
        n = self.args.max_completion_length
        return (
            f"{CLIPPED} {_fmt(last)} over the last {TRUNCATED_WINDOW} steps: most completions are cut at "
            f"max_completion_length ({n} tokens), and a cut completion has no answer to earn the correctness reward",
            f"raise --max_completion_length (e.g. {2 * n if n else 'double it'}); completions that never end may "
            "also mean the model's end-of-turn token is not the tokenizer's EOS (read the completions table)",
        )

    def _no_signal(self, entry):
        if (nothing := self._nothing_earned()) is not None:  # every completion at 0 so far
            return self._nothing_earned_remedy() if nothing else UNJUDGED  # said once NOTHING_EARNED show it
        if (last := self._last(ZERO_STD, NO_SIGNAL_WINDOW)) is None:
            return UNJUDGED
        if min(last) < NO_SIGNAL_SHARE:
            return None
        what = f"{ZERO_STD} {_fmt(last)} over the last {NO_SIGNAL_WINDOW} steps: in most groups every completion earns "
        what += "the same reward, so its advantages are 0 and it teaches nothing"
        rate = self.series["_correct_rate"][-1]
        if rate is not None and rate >= SOLVED_RATE:
            return what, "the training problems are solved: more steps teach little; stop here or use harder ones"
        return what, f"more varied groups: {self._more_generations()}{self._warmer(' or ')}"

    def _nothing_earned(self) -> bool | None:
        """Where every completion has earned exactly 0 at every step (no advantage is non-zero: waiting for a window
        of steps would only spend them): whether that is NOTHING_EARNED completions or more; else None."""
        zero_std, rewards = self.series.get(ZERO_STD, []), self.series.get("reward", [])
        if not (len(zero_std) == len(rewards) == self.steps and min(zero_std) >= 1.0 and max(map(abs, rewards)) == 0):
            return None
        # the completions one optimizer step samples over every process, where the settings say
        sizes = [getattr(self.args, n, None) for n in ("per_device_train_batch_size", "gradient_accumulation_steps")]
        known = all(isinstance(n, int) for n in sizes)
        per_step = math.prod(sizes) * (getattr(self.args, "world_size", 1) or 1) if known else None
        return self.steps * (per_step or NOTHING_EARNED) >= NOTHING_EARNED

    def _nothing_earned_remedy(self) -> tuple[str, str]:
        """What is wrong when nothing has earned a reward, read off the steps so far, and what fits each cause: more
        generations or a warmer temperature would only sample more of the same."""
        n, steps = self.args.max_completion_length, self.steps
        what = f"every completion of every group has earned 0 in all {steps} step(s) so far ({ZERO_STD} 1, reward 0)"
        what += ": every advantage is 0, so nothing is learned"
        causes, remedies = [], []
        cut = self.series.get(CLIPPED, [])
        if cut and _mean(cut) >= TRUNCATED_SHARE:
            causes.append(f"{100 * _mean(cut):.0f} % of completions are cut at max_completion_length ({n} tokens)")
            remedies.append(f"a longer limit, --max_completion_length {2 * n if n else 'doubled'}")
        formed = [max(self.series[key]) for key in self.form if self.series.get(key)]
        if formed and max(formed) == 0.0:
            causes.append("no completion writes a tag of the answer format (every format reward 0)")
            remedies.append(
                "a model that writes the format at least sometimes: a supervised warm start on it first "
                '(--warm_start_rows 64: README, "A small model on a CPU"), or a stronger model'
            )
        what += f"; {'; '.join(causes)}" if causes else ""
        remedies = remedies or ["read the completions table (gold vs extracted): a reward paying nothing shows there"]
        return what, "; or ".join(remedies)

    def _more_generations(self) -> str:
        """Twice the generations per prompt, with twice the accumulation: the prompts per step stay, and the
        completions per step stay a multiple of the group (GRPO's batch rule)."""
        g, gas = self.args.num_generations, self.args.gradient_accumulation_steps
        if not g or not gas:
            return "raise --num_generations"
        return f"--num_generations {2 * g} --gradient_accumulation_steps {2 * gas} (now {g} and {gas})"

    def _warmer(self, joint: str) -> str:
        t = self.args.temperature
        if not t or t >= TEMPERATURE_CAP:
            return ""
        return f"{joint}--temperature {min(round(t + 0.2, 2), TEMPERATURE_CAP):g} (now {t:g})"

    def _format_only(self, entry):
        shares = [self._last(key, FORMAT_WINDOW) for key in self.form]
        rates = self._last("_correct_rate", FORMAT_WINDOW)  # None without a correctness reward
        if rates is None or not shares or None in shares:
            return UNJUDGED
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
        lengths, rates = self._last(LENGTH, 2 * LENGTH_WINDOW), self._last("_correct_rate", 2 * LENGTH_WINDOW)
        if lengths is None or rates is None:
            return UNJUDGED
        before, now = _mean(lengths[:LENGTH_WINDOW]), _mean(lengths[LENGTH_WINDOW:])
        gain = _mean(rates[LENGTH_WINDOW:]) - _mean(rates[:LENGTH_WINDOW])
        if now < LENGTH_GROWTH * before or gain >= LENGTH_GAIN:
            return None
        n = self.args.max_completion_length
        return (
            f"{LENGTH} {before:.0f} -> {now:.0f} tokens (means of {LENGTH_WINDOW} steps) while the correct share "
            f"moved {100 * gain:+.1f} points: completions grow without earning more",
            "read the completions for repetition or padding; --mask_truncated_completions true keeps cut ones out "
            f"of the loss, and a lower --max_completion_length (now {n}) caps the growth",
        )

    def _entropy_collapse(self, entry):
        last, start = self._last(ENTROPY, ENTROPY_WINDOW), self.entropy_start
        if start is None or len(self.series[ENTROPY]) < 2 * ENTROPY_WINDOW:
            return UNJUDGED
        if max(last) >= ENTROPY_SHARE * start:
            return None
        change = (self._scaled_lr(0.5) or "a lower --learning_rate") + self._warmer(", ")
        if not self.args.beta:
            change += "; --beta 0.04 (the reference's KL) keeps the policy nearer the start"
        what = f"{ENTROPY} {_fmt(last)} over the last {ENTROPY_WINDOW} steps, from {start:.3g} at the start: "
        return what + "the policy samples close to greedily, so its groups stop differing", change

    def _not_learning(self, entry):
        """The signal that should rise (accuracy where measured, else the correct share) no higher than at the start
        beyond its noise, judged again as data come and said once it held NOT_LEARNING_HOLD judgments running, with
        the likely causes read from the last steps' other metrics."""
        if self.measured:  # judged at each measurement: (start, now, standard error of their difference)
            values, judged = [v for _, v in self.accuracy], len(self.accuracy) > NOT_LEARNING_MEASUREMENTS
            start, recent = values[:1], values[-NOT_LEARNING_RECENT:]
            every, floor = 1, 1 / self.measured  # a noise of at least one question
        else:  # judged at each step, windows of the correct share growing with the run
            values, judged = self.series["_correct_rate"], len(self.series["_correct_rate"]) >= 3 * NOT_LEARNING_WINDOW
            window = max(NOT_LEARNING_WINDOW, len(values) // 4)
            start, recent = values[:window], values[-window:]
            every, floor = NOT_LEARNING_WINDOW, 0.01
        if not judged or None in values:
            return UNJUDGED
        if len(values) == self._judged[0]:
            return self._judged[2] if self._judged[1] >= NOT_LEARNING_HOLD * every else None
        spread = math.sqrt(_mean([(b - a) ** 2 for a, b in zip(values[:-1], values[1:], strict=True)]) / 2)  # no trend
        error = max(spread, floor) * math.sqrt(1 / len(start) + 1 / len(recent))
        rise = _mean(recent) - _mean(start)
        held = _mean(start) < SOLVED_RATE and rise + NOT_LEARNING_Z * error < NOT_LEARNING_RISE
        self._judged = (len(values), self._judged[1] + 1 if held else 0, None)
        if self._judged[1] < NOT_LEARNING_HOLD * every:
            return None
        falling = rise + NOT_LEARNING_Z * error < 0
        if self.measured:
            steps = self.accuracy[0][0], self.accuracy[-len(recent)][0], self.accuracy[-1][0]
            signal = f"{ACCURACY} {100 * start[0]:.1f} % at step {steps[0]} -> {100 * _mean(recent):.1f} % (mean of "
            signal += f"steps {steps[1]}-{steps[2]})"
        else:
            signal = f"the share of completions the correctness reward pays {100 * _mean(start):.1f} % over the first "
            signal += f"{len(start)} steps -> {100 * _mean(recent):.1f} % over the last {len(recent)}"
        signal += f", {100 * rise:+.1f} points, +-{100 * NOT_LEARNING_Z * error:.1f} by its noise: "
        causes = self._why_not_learning()
        what = signal + ("falling" if falling else "not rising")
        what += f"; likely {'; '.join(c for c, _ in causes)}" if causes else ""
        # Each remedy once: the groups' is within the right answers' one.
        remedies = [remedy for i, (_, remedy) in enumerate(causes) if not any(remedy in r for _, r in causes[:i])]
        if falling:  # moving away from what it could do: smaller steps, or a tether to the start
            kl = "" if self.args.beta else "; --beta 0.04 (a KL to the start model)"
            remedies.insert(0, f"smaller updates: {self._scaled_lr(0.5)}{kl}")
        larger = f"the groups differ and sampling is free, yet nothing rises: larger updates, {self._scaled_lr(2)}, or "
        larger += "read the completions table (gold vs extracted) for answers the reward does not read"
        self._judged = (*self._judged[:2], (what, "; ".join(remedies or [larger])))
        return self._judged[2]

    def _why_not_learning(self) -> list[tuple[str, str]]:
        """(cause, remedy) for each metric of the last NOT_LEARNING_WINDOW logged steps that explains a flat signal."""
        n, causes = NOT_LEARNING_WINDOW, []
        more = f"more varied groups: {self._more_generations()}{self._warmer(' or ')}"
        rates, stuck, entropy = (self._last(key, n) for key in ("_correct_rate", ZERO_STD, ENTROPY))
        if rates is not None and _mean(rates) < FEW_CORRECT:
            few = f"few right answers to reinforce ({100 * _mean(rates):.0f} % of completions correct)"
            stronger = ", or a start model that solves more of these problems (a supervised warm start)"
            causes.append((few, more + stronger))
        if stuck is not None and _mean(stuck) >= STUCK_GROUPS:
            causes.append((f"{100 * _mean(stuck):.0f} % of groups score all alike (advantage 0)", more))
        lengths = self.series.get(LENGTH, [])
        if len(lengths) >= 2 * n:
            before, now = _mean(lengths[:n]), _mean(lengths[-n:])
            if now <= SHRINKING * before:
                shrink = f"completions shrink ({before:.0f} -> {now:.0f} tokens): the reasoning is cut back"
                kl = "" if self.args.beta else "--beta 0.04 keeps the policy nearer the start"
                why = "read the completions: a reward that pays as well without reasoning pulls them shorter; "
                causes.append((shrink, why + kl + self._scaled_lr(0.5, " and ")))
        if entropy is not None and self.entropy_start and max(entropy) <= COLD * self.entropy_start:
            cold = f"entropy {self.entropy_start:.3g} -> {_mean(entropy):.3g}: sampling nearer greedy"
            causes.append((cold, self._scaled_lr(0.5) + self._warmer(", ")))
        return causes

    def _scaled_lr(self, factor: float, joint: str = "") -> str:
        lr = self.args.learning_rate
        return f"{joint}--learning_rate {lr * factor:g} (now {lr:g})" if lr else ""

    def _not_finite(self, entry):
        keys = [*self.stop_keys, "reward"]  # and each rewards/<name>/mean: TRL logs None for NaN rewards
        keys += [key for key in entry if key.startswith("rewards/") and key.endswith("/mean")]
        if not (bad := {key: entry[key] for key in keys if key in entry and not _finite(entry[key])}):
            return None
        what = ", ".join(f"{key} {value}" for key, value in bad.items()) + " at this step"
        if set(bad) - {"loss", "grad_norm"}:  # a reward
            what += " (TRL logs a reward as None when it returned None or NaN for every completion)"
        return what, self.not_finite_remedy()

    def not_finite_remedy(self) -> str:
        lr, clip = self.args.learning_rate, self.args.max_grad_norm
        lower = f"--learning_rate {lr / 10:g} (now {lr:g})" if lr else "a lower --learning_rate"
        return (
            f"{runs.resume_command()} goes on past the step (a passing bad batch may not return); if it "
            f"recurs, a new run with {lower} and --max_grad_norm above 0 (now {clip}); a reward function that "
            "returns NaN shows as its rewards/<name>/mean"
        )

    def stops(self, entry: dict) -> bool:
        """Whether this entry's loss (or, but under fp16's scaler, its gradient norm) is not finite: the run stops."""
        return "not_finite" in self.enabled and any(key in entry and not _finite(entry[key]) for key in self.stop_keys)


def loss_explanation(args, loss: float) -> str:
    """What the loss at the first logged step means in the configuration `args`, and which curves show learning."""
    beta, iterations = args.beta or 0.0, args.num_iterations or 1
    fresh = (args.steps_per_generation or 1) <= (args.gradient_accumulation_steps or 1)  # one update per generation
    lines = [f"Training health: first step's loss {loss:.4g}."]
    if beta == 0 and iterations == 1 and fresh:
        token_level = args.loss_type not in ("grpo", "sapo")
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
    `health.json`, and stops the run on non-finite gradients (the stop every early stop takes, stopping.py)."""

    exit_code = EXIT_NOT_FINITE
    level = logging.ERROR

    def __init__(self, trainer, watcher: Watcher):
        super().__init__(trainer)
        self.watcher, self.path = watcher, layout.path(trainer.args.output_dir, layout.HEALTH)
        self.then = watcher.not_finite_remedy()  # what to do next, said when the run stops (`EarlyStop.report`)
        self.skipped_step: int | None = None  # the step whose update was skipped: its gradients were not finite
        self.seen_finite_step: int | None = None  # the last step whose gradients were seen, and finite
        self.seconds, self.observed, self.started, self.explained = 0.0, 0, time.perf_counter(), False

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.explained = time.perf_counter(), state.global_step > 0
        for entry in state.log_history:  # a resumed run: what it logged before, quietly (each finding said once)
            self.watcher.observe(entry)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if "not_finite" not in self.watcher.enabled or self.watcher.scaled:
            return  # fp16's scaler skips non-finite steps itself
        started = time.perf_counter()
        # Whether every process's gradients are finite, in one reduction so that every process skips alike: [finite,
        # -seen] reduced with MIN, "seen" read as "some process holds gradients" (under DeepSpeed none does)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # a sharded (FSDP) gradient
        device = grads[0].device if grads else self.trainer.accelerator.device
        sums = [g.sum(dtype=torch.float32).to(device) for g in grads]  # a model spread over GPUs sums on each
        finite = torch.stack(sums).sum().isfinite() if grads else True
        flags = torch.tensor([float(finite), -float(bool(grads))], device=device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
        finite, seen = flags.tolist()
        if seen < 0 and not finite:
            for param in model.parameters():
                param.grad = None  # the optimizer leaves a parameter without a gradient as it is: no update
            self.skipped_step = state.global_step + 1
        elif seen < 0:
            self.seen_finite_step = state.global_step + 1
        self.seconds += time.perf_counter() - started

    def on_step_end(self, args, state, control, **kwargs):
        if self.watcher.scaled or "not_finite" not in self.watcher.enabled:
            return
        step = state.global_step
        if step != self.seen_finite_step:  # the step's loss and gradient norm logged: where the gradients were unseen
            control.should_log = True  # (DeepSpeed) they are the check; where not finite, they show what was skipped
        if step != self.skipped_step:
            return
        # This step's update was skipped: said; before the last step (after which the run ends anyway), saved, stopped
        what = "the gradients are not finite: this step's update was skipped"
        self._say(self.watcher.record("not_finite", step, what, self.watcher.not_finite_remedy()))
        if step < state.max_steps:
            self._keep_older_checkpoints()
            saved = f"{layout.checkpoint_name(step)}, holding the weights before this step's update"
            self.stop_here(state, control, reason="the gradients are not finite", save=True, saved=saved)

    def _keep_older_checkpoints(self) -> None:
        """The stop's checkpoint repeats the weights of the one before: it rotates no older one out."""
        if self.trainer.args.save_total_limit:
            self.trainer.args.save_total_limit += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        started, entry = time.perf_counter(), {**logs, "step": state.global_step}
        metrics, new = self.watcher.observe(entry)
        if metrics:
            self.observed += 1
            logs.update(metrics)  # before the reporters (wandb) read it
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(metrics)  # the trainer stored a copy: trainer_state.json
        if not self.explained and _number(entry.get("loss")) is not None:
            self.explained = True
            if self.main:
                logger.info(loss_explanation(self.watcher.args, entry["loss"]))
        for finding in new:
            self._say(finding)
        handled = state.global_step in (self.skipped_step, self.seen_finite_step)
        if self.stopped is None and not handled and self.watcher.stops(entry):
            # The gradients were not seen: the update went in, or (fp16) the scaler skipped it.
            kept = self.watcher.scaled
            saved = "nothing: this step's weights may not be finite; the newest checkpoint is the last good one"
            if kept:
                saved = f"{layout.checkpoint_name(state.global_step)} (the gradient scaler skipped the update)"
                self._keep_older_checkpoints()
            reason = "the logged loss or gradient norm is not finite"
            self.stop_here(state, control, reason=reason, save=kept, saved=saved)
        if new or self.stopped:
            self.write()
        self.seconds += time.perf_counter() - started

    def _say(self, finding: dict) -> None:
        if self.main:
            said = (finding[key] for key in ("step", "check", "what", "change"))
            logger.warning("Training health, step %s: %s (%s).\n  Change: %s\n  (%s)", *said, RESUME_NOTE)

    def on_train_end(self, args, state, control, **kwargs):
        self.write()

    def status(self) -> str:
        """stopped, findings, ok (every check on judged, none fired) or "too few steps" (none fired, some could not
        judge: the run was shorter than their windows)."""
        if self.stopped or self.watcher.findings:
            return "stopped" if self.stopped else "findings"
        return "too few steps" if self.watcher.unjudged() else "ok"

    def write(self) -> None:
        if not self.main:
            return
        per_step = 1000 / max(self.observed, 1)  # seconds to milliseconds per logged step
        cost = {"logged_steps": self.observed, "health_ms_per_step": round(per_step * self.seconds, 4)}
        cost["training_ms_per_step"] = round(per_step * (time.perf_counter() - self.started), 1)
        record = {"status": self.status(), "stopped": self.stopped, "findings": self.watcher.findings}
        record.update(checks={name: name in self.watcher.enabled for name in CHECKS}, cost=cost)
        record["too_few_steps"] = self.watcher.unjudged()  # check: what it needs to judge (the run had fewer)
        record["cannot_judge"] = self.watcher.unjudged(cannot=True)  # check: why, though the run had its steps
        measured = self.watcher.measured  # what not_learning judges
        record["not_learning_reads"] = f"{ACCURACY} ({measured} questions)" if measured else "the correct share"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def summary_line(self) -> str:
        unjudged, enabled = self.watcher.unjudged(), len(self.watcher.enabled)
        if self.watcher.findings or self.stopped:
            lines = [f"Training health: {self.status()} ({self.path})"]
        elif unjudged:  # never "ok" for a check that could not look
            lines = [f"Training health: no finding, but too few steps to judge {len(unjudged)} of {enabled} checks "
                     f"({self.watcher.steps} logged) ({self.path})"]  # fmt: skip
        else:
            judged = enabled - len(self.watcher.unjudged(cannot=True))
            lines = [f"Training health: ok ({judged} checks, {self.path})"]
        lines += [f"  step {f['step']}: {f['check']} -> {f['change']}" for f in self.watcher.findings]
        if self.stopped:
            lines.append("  stopped at step {step}: {reason}; saved {saved}".format(**self.stopped))
        if unjudged:
            lines.append("  too few steps to judge: " + ", ".join(f"{name} {n}" for name, n in unjudged.items()))
        if cannot := self.watcher.unjudged(cannot=True):
            lines.append("  " + "; ".join(f"{name}: {why}" for name, why in cannot.items()))
        return "\n".join(lines)


class _EndOfRunLine(TrainerCallback):
    """The health line, after everything else the end of training prints (the final evaluation's table)."""

    def __init__(self, health: HealthCallback):
        self.health = health

    def on_train_end(self, args, state, control, **kwargs):
        if self.health.main:
            print(self.health.summary_line(), flush=True)


def watch(trainer, off, declared: dict[str, tuple[str, float]], measured: int = 0) -> HealthCallback:
    """Put the health checks on `trainer` (all but those in `off`; `all` for none) and return them; `declared`: what
    each reward judges and pays at most (`reward_roles`; checked with the settings: `checks.reward_roles`);
    `measured`: the questions each in-training accuracy measurement asks, 0 for none."""
    scaled = getattr(trainer.accelerator, "scaler", None) is not None  # fp16 with a gradient scaler
    roles = reward_roles(declared)
    health = HealthCallback(trainer, Watcher(trainer.args, *roles, off=off, scaled=scaled, measured=measured))
    trainer.callback_handler.callbacks.insert(0, health)  # before the reporters: wandb logs its health/ metrics
    if "not_finite" in health.watcher.enabled and getattr(trainer, "generation_config", None) is not None:
        # An update that diverged (a learning rate far too high) can leave finite weights whose logits overflow:
        # sampling would then stop in torch.multinomial with a traceback before any loss shows it. With inf and NaN
        # logits replaced, the batch is sampled, its loss is not finite, and the check stops the run (exit 3).
        # (transformers' generate only: with vLLM, TRL builds no generation_config.)
        trainer.generation_config.remove_invalid_values = True
    trainer.add_callback(_EndOfRunLine(health))
    return health
