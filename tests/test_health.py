"""Training health: each condition fed as a stream of logged steps gives one finding with its remedy; healthy streams
(the demo's real log among them) give none; a non-finite gradient stops the run with a checkpoint to resume from."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_stopping import in_two_processes
from transformers import TrainerControl, TrainerState

import grpo_demo
from grpo_kit import health, layout

CORRECT, FORM = health.reward_roles(grpo_demo.REWARD_ROLES)
RECIPE = {  # the recipe's values of the settings the remedies name
    "max_completion_length": 786,
    "num_generations": 16,
    "gradient_accumulation_steps": 4,
    "steps_per_generation": 4,
    "loss_type": "dapo",
    "temperature": 0.9,
    "learning_rate": 5e-6,
    "beta": 0.0,
    "num_iterations": 1,
    "max_grad_norm": 0.1,
}
DATA = Path(__file__).parent / "data"
DEMO_LOG = DATA / "demo_log_history.json"  # `python grpo_demo.py --demo`'s, before its counting warm start
# `--demo --tiny_model llama3` on another machine, before the demo's warm start was made robust: accuracy 6.6 -> 4.7 %
FLAT_LOG = DATA / "llama_demo_flat_log_history.json"
DEMO = {**RECIPE, "max_completion_length": 72, "num_generations": 8, "gradient_accumulation_steps": 1}
DEMO["learning_rate"] = 3e-4


def healthy(step: int) -> dict:
    """One logged step of a run going well: formatted, a third correct at the start and more every step, some
    spread in most groups."""
    return {
        "step": step,
        "loss": 0.002,
        "grad_norm": 0.3,
        "reward": 3.0,
        "entropy": 0.4,
        "frac_reward_zero_std": 0.25,
        "completions/clipped_ratio": 0.02,
        "completions/mean_length": 200.0,
        **{key: 0.45 for key in FORM},
        **{key: min(1.8, 0.6 + 0.01 * step) for key in CORRECT},  # 30 % correct, a point more every 2 steps
    }


def run(steps: int, off=(), settings=RECIPE, **changes) -> tuple[health.Watcher, list[dict], list[dict]]:
    """Feed `steps` logged steps, `changes` replacing metrics (a value, or a function of the step) from step 1:
    (the watcher, every finding in order, each step's health metrics). No accuracy is measured: not_learning reads
    the correct share."""
    watcher = health.Watcher(SimpleNamespace(**settings), CORRECT, FORM, off=off)
    findings, marks = [], []
    for step in range(1, steps + 1):
        entry = healthy(step)
        for key, value in changes.items():
            entry[key.replace("__", "/")] = value(step) if callable(value) else value
        metrics, new = watcher.observe(entry)
        findings += new
        marks.append(metrics)
    return watcher, findings, marks


CORRECTNESS = next(iter(CORRECT)).replace("/", "__")


def test_the_rewards_are_told_apart_by_what_they_judge():
    assert CORRECT == {"rewards/correctness_reward_func/mean": 2.0}
    assert {
        f"rewards/{name}_reward_func/mean": 0.5 for name in ("xmlcount", "soft_format", "strict_format", "int")
    } == FORM


FLAT = ("not_learning",)  # off where a condition needs a correct share that does not rise (it is not learning too)


@pytest.mark.parametrize(
    ("check", "changes", "fired_at", "remedy", "off"),
    [
        ("truncation", {"completions__clipped_ratio": 0.7}, 3, "raise --max_completion_length (e.g. 1572)", ()),
        (
            "no_signal",
            {"frac_reward_zero_std": 1.0, CORRECTNESS: 0.2},
            5,
            "--num_generations 32 --gradient_accumulation_steps 8 (now 16 and 4) or --temperature 1.1 (now 0.9)",
            FLAT,
        ),
        (
            "format_only",
            {CORRECTNESS: 0.1},
            10,
            "--num_generations 32 --gradient_accumulation_steps 8 (now 16 and 4)",
            FLAT,
        ),
        (
            "length_runaway",
            {"completions__mean_length": lambda s: 200.0 if s <= 50 else 300.0, CORRECTNESS: 1.0},
            100,
            "--mask_truncated_completions true",
            FLAT,
        ),
        (
            "entropy_collapse",
            {"entropy": lambda s: 0.4 if s <= 5 else 0.02},
            10,
            "--learning_rate 2.5e-06 (now 5e-06), --temperature 1.1 (now 0.9); --beta 0.04",
            (),
        ),
        (
            "not_learning",
            {CORRECTNESS: 1.0},  # half right from the first step to the last: judged on 3 windows, held for 2
            49,
            "larger updates, --learning_rate 1e-05 (now 5e-06)",
            (),
        ),
        (
            "not_finite",
            {"loss": lambda s: math.nan if s == 7 else 0.002},
            7,
            "a new run with --learning_rate 5e-07 (now 5e-06)",
            (),
        ),
        ("not_finite", {"rewards__int_reward_func__mean": lambda s: None if s == 9 else 0.45}, 9, "returns NaN", ()),
    ],
)
def test_each_condition_held_long_enough_is_said_once_with_its_remedy(check, changes, fired_at, remedy, off):
    watcher, findings, marks = run(120, off=off, **changes)
    assert [(f["check"], f["step"]) for f in findings] == [(check, fired_at)]
    assert remedy in findings[0]["change"]
    # The metric per check: 1 on the steps where it holds, 0 elsewhere, the other checks 0 throughout.
    held = [step for step, m in enumerate(marks, 1) if m[f"health/{check}"] == 1.0]
    assert held[0] == fired_at
    assert all(m[f"health/{other}"] == 0.0 for m in marks for other in health.CHECKS if other not in (check, *off))


def test_a_finding_names_the_metric_and_its_values_over_the_window():
    _, findings, _ = run(4, completions__clipped_ratio=lambda s: [0.1, 0.6, 0.75, 1.0][s - 1])
    assert findings[0]["what"].startswith("completions/clipped_ratio 0.6, 0.75, 1 over the last 3 steps")
    assert "max_completion_length (786 tokens)" in findings[0]["what"]
    lengths = {"completions__mean_length": lambda s: 200.0 if s <= 50 else 300.0, CORRECTNESS: 1.0}
    _, findings, _ = run(100, off=FLAT, **lengths)
    assert findings[0]["what"] == (
        "completions/mean_length 200 -> 300 tokens (means of 50 steps) while the correct share moved +0.0 points: "
        "completions grow without earning more"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"completions__clipped_ratio": lambda s: 0.9 if s % 3 == 0 else 0.1},  # one step in three
        {"frac_reward_zero_std": lambda s: 1.0 if s % 5 else 0.5},  # four of five, never five running
        {"entropy": lambda s: 0.4 if s % 5 else 0.01},  # single dips
        {"loss": lambda s: -0.3 if s % 2 else 0.3},  # a loss of either sign, far from 0
        {"completions__mean_length": lambda s: 100.0 + 5 * s, CORRECTNESS: lambda s: min(1.9, 0.02 * s)},
    ],
    ids=["truncated-spikes", "no-signal-spikes", "entropy-dips", "loss-swings", "longer-and-better"],
)
def test_noise_and_healthy_change_make_no_finding(changes):
    assert run(120, **changes)[1] == []


def observed(entries: list[dict], settings=DEMO, measured=64) -> health.Watcher:  # the demo's eval_subset
    watcher = health.Watcher(SimpleNamespace(**settings), CORRECT, FORM, measured=measured)
    for entry in entries:
        watcher.observe(entry)
    return watcher


def test_the_demos_real_log_is_healthy():
    entries = json.loads(DEMO_LOG.read_text())
    assert sum("loss" in e for e in entries) == 40 and any("eval_accuracy_strict" in e for e in entries)
    assert observed(entries).findings == []
    assert observed([e for e in entries if "loss" in e], measured=0).findings == []  # by the correct share too


def test_the_demo_runs_nearest_the_threshold_are_healthy():
    """Of the 30 runs of benchmarks/demo_runs.py (every one healthy), the two whose accuracy stood least far above
    their start: Qwen2 from warm-start seed 42 with GRPO seed 3, and Llama from seed 12 with GRPO seed 42."""
    runs = json.loads((DATA / "demo_seed_runs_log_history.json").read_text())
    for entries in runs.values():
        assert any(e.get("step") == 0 and "eval_accuracy_strict" in e for e in entries)  # the start, measured
        assert observed(entries).findings == []
        assert observed([e for e in entries if "loss" in e], measured=0).findings == []


def test_a_demo_run_that_did_not_learn_is_said_with_its_likely_causes():
    """The recorded run whose watcher said "ok": accuracy 9.4 % at its first measurement, 4.7 % from step 25 on; 4 %
    of completions right and four groups in five scoring alike."""
    entries = json.loads(FLAT_LOG.read_text())
    findings = observed(entries).findings
    assert [(f["check"], f["step"]) for f in findings] == [("not_learning", 35)]
    what, change = findings[0]["what"], findings[0]["change"]
    assert what.startswith(
        "eval_accuracy_strict 9.4 % at step 5 -> 4.7 % (mean of steps 25-35), -4.7 points, +-4.5 by its noise: falling"
    )
    assert "few right answers to reinforce (4 % of completions correct)" in what
    assert "81 % of groups score all alike (advantage 0)" in what
    assert change.startswith("smaller updates: --learning_rate 0.00015 (now 0.0003); --beta 0.04")  # it fell
    assert change.count("--num_generations 16 --gradient_accumulation_steps 2 (now 8 and 1)") == 1  # said once
    assert "a supervised warm start" in change and "--temperature 1.1 (now 0.9)" in change
    # Without in-training accuracy the correct share is read: 64 completions a step at 6 % right swing +-4 points, so
    # windows of 10 steps cannot tell flat from 2 points; the windows grow with the run (a quarter of it), and the
    # same run repeated 8 times (320 steps) is said once they can.
    steps = [e for e in entries if "loss" in e]
    assert observed(steps, measured=0).findings == []
    longer = [{**e, "step": e["step"] + 40 * i} for i in range(8) for e in steps]
    findings = observed(longer, measured=0).findings
    assert [(f["check"], f["step"]) for f in findings] == [("not_learning", 244)]
    assert findings[0]["what"].startswith(
        "the share of completions the correctness reward pays 6.5 % over the first 61 steps -> 6.3 % over the last 61"
    )


def accuracy_run(values: list[float], every: int = 5, measured: int = 1319, **changes) -> list[dict]:
    """Healthy training steps with accuracy `values` on `measured` questions (the whole test split unless told) at
    steps 0, every, 2 x every..."""
    watcher = health.Watcher(SimpleNamespace(**DEMO), CORRECT, FORM, measured=measured)
    for step in range(0, every * (len(values) - 1) + 1):
        if step % every == 0:
            watcher.observe({"step": step, "eval_accuracy_strict": values[step // every]})
        if step:
            entry = healthy(step)
            for key, value in changes.items():
                entry[key.replace("__", "/")] = value(step) if callable(value) else value
            watcher.observe(entry)
    return [f for f in watcher.findings if f["check"] == "not_learning"]


@pytest.mark.parametrize(
    ("values", "measured", "fires_at"),
    [
        ([0.3, 0.301, 0.299, 0.3, 0.302, 0.3, 0.299, 0.3], 1319, 30),  # flat: judged at step 25, held at 30
        ([0.1, 0.12, 0.1, 0.08, 0.06, 0.05, 0.05, 0.05], 64, 30),  # falling, on the demo's 64 questions
        ([0.1, 0.1, 0.12, 0.09, 0.1, 0.11, 0.1, 0.1], 64, None),  # flat, but 64 questions' noise could hide 2 points
        ([0.1, 0.1, 0.1, 0.3, 0.6, 0.7, 0.7, 0.7, 0.7], 1319, None),  # rose late, then held: learnt
        ([0.1, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7], 1319, None),  # learnt fast, then a plateau
        ([0.1, 0.1, 0.11, 0.11, 0.12, 0.14, 0.15, 0.16], 1319, None),  # slow, but rising: 2 points and more
        ([0.95] * 8, 1319, None),  # solved from the start: nothing to rise to (no_signal says so)
    ],
    ids=["flat", "falling", "flat-in-noise", "late", "plateau", "slow", "solved"],
)
def test_not_learning_reads_accuracy_where_it_is_measured(values, measured, fires_at):
    findings = accuracy_run(values, measured=measured)
    assert [f["step"] for f in findings] == ([fires_at] if fires_at else [])


def binomial_run(seed: int, questions: int, start: float, per_measurement: float, measurements: int) -> list[float]:
    """Accuracy measured `measurements` times on `questions` questions, each drawn anew: noisier than a fixed subset
    measured again, whose questions a slowly changing model mostly answers alike."""
    draw = random.Random(seed)
    rates = [start + per_measurement * i for i in range(measurements)]
    return [sum(draw.random() < rate for _ in range(questions)) / questions for rate in rates]


def test_not_learning_stays_quiet_on_noisy_runs_that_learn_slowly():
    """200 runs rising a point per measurement (this recipe's strict accuracy rises tens of points: 1.7 -> 48.7 %
    published for Qwen2.5-1.5B), measured on 64 questions with binomial noise of +-6 points: at most one is said."""
    said = [seed for seed in range(200) if accuracy_run(binomial_run(seed, 64, 0.3, 0.01, 30), measured=64)]
    assert len(said) <= 1


def test_not_learning_says_a_flat_run_once_its_measurements_can_tell():
    """Flat at 30 %, each measurement the same questions but one more or one fewer right: on 200 questions most runs
    are said, on the whole test split every one, by the 7th measurement; a fall is said on any number."""

    def wobbling(seed, questions):
        draw = random.Random(seed)
        return [(round(0.3 * questions) + draw.choice((-1, 0, 1))) / questions for _ in range(8)]

    assert sum(bool(accuracy_run(wobbling(seed, 200), measured=200)) for seed in range(200)) >= 150
    assert all(accuracy_run(wobbling(seed, 1319))[0]["step"] == 30 for seed in range(200))
    falling = accuracy_run([0.3, 0.3, 0.28, 0.26, 0.24, 0.22, 0.2, 0.18], measured=200)
    assert [f["step"] for f in falling] == [30] and "falling" in falling[0]["what"]
    assert falling[0]["change"].startswith("smaller updates: --learning_rate 0.00015 (now 0.0003); --beta 0.04")


@pytest.mark.parametrize(
    ("changes", "says", "remedy"),
    [
        ({CORRECTNESS: 0.1}, "few right answers to reinforce (5 % of completions correct)", "a supervised warm start"),
        ({"frac_reward_zero_std": 0.7}, "70 % of groups score all alike", "--num_generations 16"),
        (
            {"completions__mean_length": lambda s: 200.0 if s <= 10 else 150.0},
            "completions shrink (200 -> 150 tokens)",
            "--beta 0.04 keeps the policy nearer the start and --learning_rate 0.00015 (now 0.0003)",
        ),
        (
            {"entropy": lambda s: 0.4 if s <= 5 else 0.15},
            "entropy 0.4 -> 0.15: sampling nearer greedy",
            "--learning_rate 0.00015 (now 0.0003), --temperature 1.1 (now 0.9)",
        ),
    ],
    ids=["few-correct", "groups-alike", "shrinking", "cold"],
)
def test_not_learning_names_each_likely_cause_with_its_remedy(changes, says, remedy):
    findings = accuracy_run([0.1] * 8, **changes)
    assert len(findings) == 1
    assert says in findings[0]["what"] and remedy in findings[0]["change"]
    others = [c for c in ("few right", "groups score", "completions shrink", "entropy") if c not in says]
    assert not any(other in findings[0]["what"] for other in others)  # only the causes the metrics show


def test_remedies_keep_the_temperature_sane_and_name_kl_only_where_it_is_off():
    hot = {**RECIPE, "temperature": 1.2, "beta": 0.04}
    _, findings, _ = run(12, settings=hot, entropy=lambda s: 0.4 if s <= 5 else 0.02, frac_reward_zero_std=1.0)
    changes = {f["check"]: f["change"] for f in findings}
    assert "--temperature" not in changes["no_signal"] and "--temperature" not in changes["entropy_collapse"]
    assert "--beta" not in changes["entropy_collapse"]
    warm = {**RECIPE, "temperature": 1.1}
    _, findings, _ = run(6, settings=warm, frac_reward_zero_std=1.0)
    assert "--temperature 1.2 (now 1.1)" in findings[0]["change"]


@pytest.mark.parametrize(
    ("correct", "solved"),
    [
        (lambda s: 1.96, True),
        (lambda s: 0.2 if s < 5 else 1.96, True),  # solved by the step the check fires at
        (lambda s: 1.96 if s < 5 else 0.2, False),  # solved no more: the groups are alike for want of right answers
    ],
    ids=["solved", "solved-now", "solved-before"],
)
def test_groups_that_all_solve_the_problem_say_so(correct, solved):
    _, findings, _ = run(5, frac_reward_zero_std=1.0, **{CORRECTNESS: correct})
    assert [(f["check"], f["step"]) for f in findings] == [("no_signal", 5)]
    assert findings[0]["change"].startswith("the training problems are solved") is solved
    assert findings[0]["change"].startswith("more varied groups: --num_generations 32") is not solved


def test_non_finite_values_stop_only_for_the_loss_and_gradient_norm():
    watcher = health.Watcher(SimpleNamespace(**RECIPE), CORRECT, FORM)
    for step, change, stops in [(1, {}, False), (2, {"reward": None}, False), (3, {"grad_norm": math.nan}, True)]:
        entry = {**healthy(step), **change}
        watcher.observe(entry)
        assert watcher.stops(entry) is stops
    assert [(f["check"], f["step"]) for f in watcher.findings] == [("not_finite", 2)]  # said once
    assert "reward None at this step (TRL logs a reward as None" in watcher.findings[0]["what"]
    assert health.Watcher(SimpleNamespace(**RECIPE), CORRECT, FORM, off=["not_finite"]).stops(entry) is False


def test_under_fp16s_gradient_scaler_only_the_loss_counts():
    """fp16's scaler makes infinite gradients on purpose while it finds its scale, and skips those steps itself."""
    watcher = health.Watcher(SimpleNamespace(**RECIPE), CORRECT, FORM, scaled=True)
    entry = {**healthy(1), "grad_norm": math.inf}
    watcher.observe(entry)
    assert not watcher.stops(entry) and watcher.findings == []
    assert watcher.stops({**healthy(2), "loss": math.nan})


def test_missing_renamed_or_odd_metrics_raise_nothing():
    watcher = health.Watcher(SimpleNamespace(**RECIPE), CORRECT, FORM)
    entries = [
        {"step": 1, "loss": 0.0},  # an older TRL: nothing else logged
        {"step": 2, "loss": 0.0, "entropy": "n/a", "completions/clipped_ratio": True, "frac_reward_zero_std": [1]},
        {"step": 3, "train/loss": 0.1, "train/reward": 2.0},  # another naming: not a training entry here
        {"step": 3, "eval_accuracy_strict": 0.5},  # an evaluation
        {},
    ]
    for _ in range(30):
        for entry in entries:
            watcher.observe(entry)
    assert watcher.findings == []
    assert watcher.observe({"step": 4, "eval_accuracy_strict": 0.5}) == ({}, [])


def test_checks_can_be_turned_off():
    _, findings, marks = run(10, off=["truncation"], completions__clipped_ratio=1.0, frac_reward_zero_std=1.0)
    assert [f["check"] for f in findings] == ["no_signal"]
    assert "health/truncation" not in marks[-1]
    _, findings, marks = run(10, off=["all"], completions__clipped_ratio=1.0, loss=math.nan)
    assert findings == [] and marks[-1] == {}


@pytest.mark.parametrize(
    ("settings", "says", "not_says"),
    [
        ({}, "stays near 0", "KL to the start model"),
        ({"beta": 0.04}, "beta 0.04: the loss holds beta x KL", "stays near 0"),
        ({"num_iterations": 2}, "Several optimizer steps per generation batch", "stays near 0"),
        ({"steps_per_generation": 8}, "Several optimizer steps per generation batch", "stays near 0"),
        ({"loss_type": "grpo"}, "stays near 0 and says nothing", "its sign says"),
    ],
)
def test_the_first_loss_is_explained_for_the_configuration(settings, says, not_says):
    text = health.loss_explanation(SimpleNamespace(**{**RECIPE, **settings}), 0.0003)
    assert says in text and not_says not in text
    assert "rewards/<name>/mean" in text and "eval accuracy" in text


# ----------------------------------------------------------------------------------------------------------------
# On a trainer: marks in the log, health.json, the stop on non-finite gradients


def fake_trainer(tmp_path: Path, callbacks: list | None = None):
    callbacks = [] if callbacks is None else callbacks
    return SimpleNamespace(
        accelerator=SimpleNamespace(is_main_process=True, device=torch.device("cpu"), wait_for_everyone=lambda: None),
        args=SimpleNamespace(output_dir=str(tmp_path), save_total_limit=3, **RECIPE),
        callback_handler=SimpleNamespace(callbacks=callbacks),
        add_callback=callbacks.append,
    )


NOTHING = {"reward": 0.0, "frac_reward_zero_std": 1.0, **{key.replace("/", "__"): 0.0 for key in {**FORM, **CORRECT}}}
WARM = "a supervised warm start on it first (--warm_start_rows 64"
LONGER = "a longer limit, --max_completion_length 1572"


@pytest.mark.parametrize(
    ("changes", "fired", "says", "not_says"),
    [
        ({**NOTHING, "completions__clipped_ratio": 0.0}, 1, [WARM], [LONGER]),  # it ends, but never in the format
        ({**NOTHING, "completions__clipped_ratio": 1.0}, 1, [LONGER, WARM], []),  # cut before any tag, or no tags
        ({**NOTHING, "reward": lambda s: 0.0 if s < 3 else 0.5}, 1, [WARM], []),  # said at once, not again later
        ({**NOTHING, "reward": lambda s: 0.5 if s == 1 else 0.0}, 5, ["more varied groups"], [WARM]),  # earned once
        ({**NOTHING, "reward": 0.5}, 5, ["more varied groups"], [WARM]),  # all alike, not all 0: the windowed check
    ],
    ids=["never-formatted", "all-cut", "from-the-start", "not-from-the-start", "alike-not-zero"],
)
def test_a_run_where_every_completion_earns_0_from_its_first_step_is_said_at_once(changes, fired, says, not_says):
    """The groups teach nothing from the start: waiting for a window of steps only spends them, and more generations
    or a warmer temperature would sample more of the same. The remedy fits the cause read off the steps so far."""
    _, findings, _ = run(6, **changes)
    no_signal = [f for f in findings if f["check"] == "no_signal"]
    assert [f["step"] for f in no_signal] == [fired]
    for text in says:
        assert text in no_signal[0]["change"]
    for text in not_says:
        assert text not in no_signal[0]["change"]


@pytest.mark.parametrize(("per_device", "accumulation", "fired"), [(16, 4, 1), (4, 4, 4), (2, 1, 32)])
def test_nothing_earned_is_said_once_enough_completions_earned_nothing(per_device, accumulation, fired):
    """64 completions all at 0 (a model writing the format once in 10 shows it in 64 with probability 0.999): the
    recipe's first step, or as many small steps as make 64. A step of a few completions all at 0 is no evidence."""
    settings = {**RECIPE, "per_device_train_batch_size": per_device, "gradient_accumulation_steps": accumulation}
    _, findings, _ = run(40, settings=settings, **NOTHING)
    assert [(f["check"], f["step"]) for f in findings if WARM in f["change"]] == [("no_signal", fired)]


def test_a_check_that_had_its_steps_but_not_its_metric_says_it_cannot_judge(tmp_path):
    """Rewards of the user's own, none of which the recipe reads as correctness: the checks that read the correct
    share cannot judge, and say so, rather than wait for steps that would not help."""
    trainer = fake_trainer(tmp_path)
    callback = health.HealthCallback(trainer, health.Watcher(SimpleNamespace(**RECIPE), {}, FORM))
    state, control = TrainerState(), TrainerControl()
    for step in range(1, 121):
        state.global_step = step
        callback.on_log(None, state, control, logs={k: v for k, v in healthy(step).items() if k != "step"})
    callback.on_train_end(None, state, control)
    record = json.loads((tmp_path / layout.HEALTH).read_text())
    assert record["too_few_steps"] == {} and record["status"] == "ok"
    assert sorted(record["cannot_judge"]) == ["format_only", "length_runaway", "not_learning"]
    assert callback.summary_line().startswith("Training health: ok (4 checks")
    assert "format_only: cannot judge: a metric it reads was not logged" in callback.summary_line()


@pytest.mark.parametrize(
    ("steps", "unjudged"),
    [
        (1, ["truncation", "no_signal", "format_only", "length_runaway", "entropy_collapse", "not_learning"]),
        (5, ["format_only", "length_runaway", "entropy_collapse", "not_learning"]),  # the 5-step windows judged
        (10, ["length_runaway", "not_learning"]),
        (30, ["length_runaway"]),  # not_learning reads 3 windows of 10 steps
        (100, []),
    ],
)
def test_a_run_shorter_than_a_checks_window_says_too_few_steps_for_it_never_ok(steps, unjudged, tmp_path):
    callback = health.watch(fake_trainer(tmp_path), [], grpo_demo.REWARD_ROLES)
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(None, state, control)
    for step in range(1, steps + 1):
        state.global_step = step
        callback.on_log(None, state, control, logs={k: v for k, v in healthy(step).items() if k != "step"})
    callback.on_train_end(None, state, control)
    record = json.loads((tmp_path / layout.HEALTH).read_text())
    assert list(record["too_few_steps"]) == unjudged
    assert record["status"] == ("too few steps" if unjudged else "ok") and record["findings"] == []
    line = callback.summary_line()
    assert ("too few steps to judge" in line) is bool(unjudged)
    assert line.startswith("Training health: ok (7 checks") is not unjudged


def test_the_watcher_runs_before_the_reporters_and_says_the_last_word(tmp_path):
    reporters = ["DefaultFlowCallback", "WandbCallback", "AccuracyCallback"]
    trainer = fake_trainer(tmp_path, list(reporters))
    callback = health.watch(trainer, [], grpo_demo.REWARD_ROLES)
    assert trainer.callback_handler.callbacks[0] is callback  # wandb sees its health/ metrics
    assert trainer.callback_handler.callbacks[1:-1] == reporters
    assert trainer.callback_handler.callbacks[-1].health is callback  # the end-of-run line after the final table


def test_each_log_is_marked_where_wandb_and_trainer_state_read_it(tmp_path, caplog):
    callback = health.watch(fake_trainer(tmp_path), [], grpo_demo.REWARD_ROLES)
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(None, state, control)
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        for step in range(1, 5):
            time.sleep(0.01)  # the training step
            state.global_step = step
            logs = {k: v for k, v in healthy(step).items() if k != "step"}
            logs["completions/clipped_ratio"] = 0.9
            state.log_history.append({**logs, "step": step})  # as Trainer.log stores a copy
            callback.on_log(None, state, control, logs=logs)
            assert logs["health/truncation"] == state.log_history[-1]["health/truncation"] == (step >= 3)
            if step == 3:  # written as the finding comes: a run that dies later still has it
                record = json.loads((tmp_path / layout.HEALTH).read_text())
                assert [(f["check"], f["step"]) for f in record["findings"]] == [("truncation", 3)]
        eval_logs = {"eval_accuracy_strict": 0.5}
        callback.on_log(None, state, control, logs=eval_logs)
        assert eval_logs == {"eval_accuracy_strict": 0.5}  # an evaluation's entry is left as it is
    assert caplog.text.count("first step's loss 0.002") == 1
    assert caplog.text.count("Training health, step 3: truncation") == 1
    callback.on_train_end(None, state, control)
    record = json.loads((tmp_path / layout.HEALTH).read_text())
    assert record["status"] == "findings" and [f["check"] for f in record["findings"]] == ["truncation"]
    cost = record["cost"]
    assert cost["logged_steps"] == 4 and 0 < cost["health_ms_per_step"] < cost["training_ms_per_step"]
    assert cost["training_ms_per_step"] >= 10  # the steps' time, measured
    assert "step 3: truncation -> raise --max_completion_length" in callback.summary_line()


def test_a_resumed_run_keeps_its_findings_without_saying_them_again(tmp_path, caplog):
    history = [{**healthy(s), "completions/clipped_ratio": 0.9} for s in range(1, 5)]
    callback = health.watch(fake_trainer(tmp_path), [], grpo_demo.REWARD_ROLES)
    state = TrainerState(global_step=4, log_history=history)
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        callback.on_train_begin(None, state, TrainerControl())
        state.global_step = 5
        callback.on_log(None, state, TrainerControl(), logs={**history[-1], "step": 5})
    assert [(f["check"], f["step"]) for f in callback.watcher.findings] == [("truncation", 3)]
    assert "Training health" not in caplog.text  # neither the finding nor the first-step explanation again


def nan_gradients_step(tmp_path, off=(), max_steps=10, log=True):
    """One optimizer step (the 7th) of a small model whose gradients are NaN, with the health callback as the
    trainer calls it: (the callback, the control after the step, weights before, weights after)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    trainer = fake_trainer(tmp_path)
    callback = health.watch(trainer, off, grpo_demo.REWARD_ROLES)
    state, control = TrainerState(global_step=6, max_steps=max_steps), TrainerControl()
    callback.on_train_begin(None, state, control)
    (model(torch.ones(3, 4)).sum() * math.nan).backward()
    before = [p.detach().clone() for p in model.parameters()]
    callback.on_pre_optimizer_step(None, state, control, model=model)
    optimizer.step()
    state.global_step += 1
    callback.on_step_end(None, state, control)
    if log:
        callback.on_log(None, state, control, logs={**healthy(7), "loss": math.nan, "grad_norm": math.nan})
    return callback, control, before, list(model.parameters())


def test_non_finite_gradients_skip_the_update_save_and_stop(tmp_path, caplog):
    callback, control, before, after = nan_gradients_step(tmp_path)
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))  # the update was skipped
    assert control.should_save and control.should_training_stop  # these weights are saved: safe to resume
    assert callback.stopped["step"] == 7
    assert callback.trainer.args.save_total_limit == 4  # the stop's checkpoint rotates no older one out
    assert [(f["check"], f["step"]) for f in callback.watcher.findings] == [("not_finite", 7)]  # said once
    record = json.loads((tmp_path / layout.HEALTH).read_text())
    assert record["status"] == "stopped" and record["stopped"]["saved"].startswith("checkpoint-7")
    with caplog.at_level(logging.ERROR, logger="grpo_demo"):
        assert callback.report() == health.EXIT_NOT_FINITE == 3
    assert "Stopped at step 7: the gradients are not finite" in caplog.text
    assert "--resume_from_checkpoint latest" in caplog.text


def test_with_the_check_off_non_finite_gradients_go_into_the_weights(tmp_path):
    callback, control, before, after = nan_gradients_step(tmp_path, off=["not_finite"])
    assert all(torch.isnan(a).all() for a in after)  # what the check prevents
    assert not control.should_training_stop and callback.stopped is None
    assert callback.report() is None  # no exit


def test_a_non_finite_loss_the_gradients_did_not_show_stops_without_saving(tmp_path):
    """Where the gradients cannot be seen (DeepSpeed keeps its own) the update has gone in: the step's weights are
    not saved, so the newest checkpoint stays the last good one."""
    callback = health.watch(fake_trainer(tmp_path), [], grpo_demo.REWARD_ROLES)
    state, control = TrainerState(global_step=8), TrainerControl(should_save=True)
    callback.on_train_begin(None, state, control)
    callback.on_log(None, state, control, logs={**healthy(8), "loss": math.inf})
    assert control.should_training_stop and not control.should_save
    assert callback.stopped["step"] == 8 and callback.stopped["saved"].startswith("nothing")
    assert callback.report() == 3


def test_finite_gradients_are_left_alone(tmp_path):
    model = torch.nn.Linear(4, 2)
    model(torch.ones(3, 4)).sum().backward()
    callback = health.watch(fake_trainer(tmp_path), [], grpo_demo.REWARD_ROLES)
    control = TrainerControl()
    callback.on_pre_optimizer_step(None, TrainerState(), control, model=model)
    assert all(p.grad is not None for p in model.parameters()) and callback.skipped_step is None


def test_processes_skip_the_update_together_when_one_has_non_finite_gradients(tmp_path):
    """Each process holds its own gradients (FSDP: its shard): a NaN in one skips the update in all, or the model's
    copies would part."""

    def skipped(rank: int):
        model = torch.nn.Linear(4, 2)
        (model(torch.ones(3, 4)).sum() * (math.nan if rank == 0 else 1.0)).backward()
        callback = health.watch(fake_trainer(tmp_path / str(rank)), [], grpo_demo.REWARD_ROLES)
        callback.on_pre_optimizer_step(None, TrainerState(global_step=6), TrainerControl(), model=model)
        return callback.skipped_step, [p.grad is None for p in model.parameters()]

    assert in_two_processes(skipped, tmp_path) == [(7, [True, True])] * 2


def test_a_stop_at_a_step_that_is_not_logged_is_said_and_logged(tmp_path):
    callback, control, _, _ = nan_gradients_step(tmp_path, log=False)
    assert control.should_log  # the step's NaN loss and gradient norm reach the log and wandb
    assert [(f["check"], f["step"]) for f in callback.watcher.findings] == [("not_finite", 7)]
    assert "this step's update was skipped" in callback.watcher.findings[0]["what"]


def test_non_finite_gradients_at_the_last_step_skip_it_and_finish(tmp_path):
    """Nothing is left to resume: the run ends as planned, with the weights before the skipped update."""
    callback, control, before, after = nan_gradients_step(tmp_path, max_steps=7)
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
    assert callback.stopped is None and not control.should_training_stop  # the trainer ends it: max_steps
    assert [f["check"] for f in callback.watcher.findings] == ["not_finite"]
    assert callback.report() is None  # a finished run: no exit code 3


def test_where_no_process_holds_gradients_every_step_is_logged_and_checked(tmp_path):
    """DeepSpeed keeps its gradients inside its engine: `param.grad` is None everywhere."""
    model = torch.nn.Linear(4, 2)
    callback = health.watch(fake_trainer(tmp_path), [], grpo_demo.REWARD_ROLES)
    state, control = TrainerState(global_step=0, max_steps=10), TrainerControl()
    callback.on_pre_optimizer_step(None, state, control, model=model)
    state.global_step = 1
    callback.on_step_end(None, state, control)
    assert control.should_log and callback.skipped_step is None


def test_under_fp16_a_non_finite_loss_stops_and_saves_what_the_scaler_kept(tmp_path):
    trainer = fake_trainer(tmp_path)
    trainer.accelerator.scaler = object()  # fp16: a gradient scaler
    callback = health.watch(trainer, [], grpo_demo.REWARD_ROLES)
    state, control = TrainerState(global_step=3, max_steps=10), TrainerControl(should_save=False)
    callback.on_train_begin(None, state, control)
    callback.on_log(None, state, control, logs={**healthy(3), "grad_norm": math.inf})  # the scaler's business
    assert callback.stopped is None
    callback.on_log(None, state, control, logs={**healthy(3), "loss": math.nan})
    assert control.should_training_stop and control.should_save and callback.stopped["step"] == 3
