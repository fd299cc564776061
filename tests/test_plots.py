"""The run's picture: drawn from trainer_state.json (and the before/after evaluations when there are some)."""

from __future__ import annotations

import json
import math
import struct

import pytest
from conftest import REWARD_NAMES

from grpo_kit import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_state(folder, steps: int = 30, accuracy_every: int = 0) -> None:
    """A trainer_state.json as GRPOTrainer writes it: one entry per step, accuracy entries when measured."""
    history = []
    for step in range(1, steps + 1):
        rewards = {f"rewards/{name}/mean": 0.5 * (1 - math.exp(-step / 10)) for name in REWARD_NAMES}
        rewards[f"rewards/{REWARD_NAMES[-1]}/mean"] = 2.0 * step / steps  # correctness climbs
        lengths = {"completions/mean_length": 20.0 + step}
        history.append({"step": step, "loss": 0.01, "reward": sum(rewards.values()), **lengths, **rewards})
        if accuracy_every and step % accuracy_every == 0:
            history.append(
                {
                    "step": step,
                    "eval_accuracy_strict": step / steps,
                    "eval_accuracy_lenient": min(1.0, step / steps + 0.1),
                    "eval_format_rate": 0.95,
                    "eval_mean_completion_tokens": 16.0,
                }
            )
    history.append({"step": steps, "train_runtime": 12.5, "train_loss": 0.01})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": steps, "log_history": history}))


def write_summary(folder, name: str, accuracy: float) -> None:
    summary = {"n": 256, "accuracy_strict": accuracy, "accuracy_lenient": accuracy, "format_rate": 0.97}
    (folder / "eval" / name).mkdir(parents=True)
    (folder / "eval" / name / "summary.json").write_text(json.dumps(summary))


def panels(path) -> int:
    """How many panels a curves.png has beside the rewards' block: the block is 7.8 inches wide, each panel 5.2 x
    4.2, at 90 dpi."""
    width, height = png_size(path)
    assert height == round(4.2 * 90)
    beside = (width - round(7.8 * 90)) / round(5.2 * 90)
    assert beside == round(beside), width
    return round(beside)


def axes_titled(fig) -> dict:
    """The figure's visible panels by title, a reward's title without its latest value ("correctness: 1.18")."""
    return {ax.get_title().split(":")[0]: ax for ax in fig.axes if ax.get_visible()}


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's header; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_run_with_accuracy_and_before_after(tmp_path):
    write_state(tmp_path, steps=40, accuracy_every=10)
    write_summary(tmp_path, "baseline", 0.2)
    write_summary(tmp_path, "final", 0.6)
    path = plots.plot_curves(tmp_path)
    assert path == tmp_path / "curves.png"
    assert panels(path) == 2  # beside the rewards: completion length, accuracy
    assert 20_000 < path.stat().st_size < 200_000  # drawn, and small enough for the README


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_the_curves_are_the_logged_values(tmp_path):
    """Each panel draws what the run logged: rewards and their total (moving average), length, accuracy."""
    write_state(tmp_path, steps=30, accuracy_every=10)
    write_summary(tmp_path, "baseline", 0.2)
    write_summary(tmp_path, "final", 0.6)
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    steps = [e for e in history if "reward" in e]
    panels = axes_titled(plots.curves_figure(tmp_path))
    length, accuracy = panels.pop("Completion length"), panels.pop("Greedy accuracy")
    assert set(panels) == {"total", "xmlcount", "soft_format", "strict_format", "int", "correctness"}

    window = 2  # 30 steps / 15
    for label, key in (("total", "reward"), ("correctness", f"rewards/{REWARD_NAMES[-1]}/mean")):
        drawn = lines_by_label(panels[label])[label]
        assert list(drawn.get_xdata()) == [e["step"] for e in steps]
        assert drawn.get_ydata() == pytest.approx(plots.moving_average([e[key] for e in steps], window))
    # Each reward on a scale of its own, from 0 to above its highest value: four rewards of 0.5 never hide each other.
    for label in ("xmlcount", "soft_format", "strict_format", "int"):
        highest = max(e[f"rewards/{label}_reward_func/mean"] for e in steps)
        low, high = panels[label].get_ylim()
        assert low == 0 and highest < high < 1.2 * highest
        value = plots.moving_average([e[f"rewards/{label}_reward_func/mean"] for e in steps], window)[-1]
        assert panels[label].get_title() == f"{label}: {value:.2f}"  # its latest value, read off directly
    assert lines_by_label(length)["mean"].get_ydata() == pytest.approx(
        plots.moving_average([e["completions/mean_length"] for e in steps], window)
    )
    strict = lines_by_label(accuracy)["accuracy, strict (answer block)"]
    assert list(strict.get_xdata()) == [10, 20, 30]
    assert strict.get_ydata() == pytest.approx([100 / 3, 200 / 3, 100])
    markers = [(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in accuracy.get_lines()]
    assert ((0,), (20.0,)) in markers and ((30,), (60.0,)) in markers  # before (step 0) and after (last step)


@pytest.mark.parametrize("with_summaries", [False, True])
def test_run_without_accuracy_metrics(tmp_path, with_summaries):
    """A run with no in-training accuracy (eval_every_steps 0) still gets its reward curves."""
    write_state(tmp_path, steps=5)
    if with_summaries:  # before/after only: drawn as two points
        write_summary(tmp_path, "baseline", 0.1)
        write_summary(tmp_path, "final", 0.3)
    assert panels(plots.plot_curves(tmp_path)) == (2 if with_summaries else 1)  # accuracy only where measured


def test_a_trainer_state_without_training_steps_gets_a_picture_that_says_so(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 0, "log_history": []}))
    assert panels(plots.plot_curves(tmp_path)) == 0  # the rewards' block alone
    fig = axes_titled(plots.curves_figure(tmp_path))
    assert [t.get_text() for t in fig["total"].texts] == ["no training steps logged"]


def test_folder_without_trainer_state_draws_nothing(tmp_path):
    assert plots.plot_curves(tmp_path) is None
    assert not (tmp_path / "curves.png").exists()


def test_run_logged_by_a_tracker_under_slash_names(tmp_path):
    """`eval/accuracy_strict` (as wandb names it) is read like the trainer state's `eval_accuracy_strict`."""
    write_state(tmp_path, steps=10, accuracy_every=5)
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    for entry in state["log_history"]:
        for key in [k for k in entry if k.startswith("eval_")]:
            entry["eval/" + key.removeprefix("eval_")] = entry.pop(key)
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert panels(plots.plot_curves(tmp_path)) == 2


def test_moving_average():
    assert plots.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert plots.moving_average([2.0, 4.0], 1) == [2.0, 4.0]


def test_health_findings_are_marked_at_their_steps(tmp_path):
    write_state(tmp_path, steps=30)
    findings = [{"check": "truncation", "step": 12}, {"check": "no_signal", "step": 20}]
    (tmp_path / "health.json").write_text(json.dumps({"status": "findings", "findings": findings}))
    fig = axes_titled(plots.curves_figure(tmp_path))
    for ax in (fig["total"], fig["Completion length"]):
        vertical = [line.get_xdata() for line in ax.lines if list(line.get_xdata()) in ([12, 12], [20, 20])]
        assert len(vertical) == 2
        assert {t.get_text() for t in ax.texts} >= {"truncation", "no_signal"}
    write_state(tmp_path / "healthy", steps=30)
    assert not any(
        t.get_text() == "truncation" for ax in plots.curves_figure(tmp_path / "healthy").axes for t in ax.texts
    )


def test_a_reward_logged_as_none_is_a_gap_and_a_failed_drawing_never_ends_a_run(tmp_path, monkeypatch, caplog):
    write_state(tmp_path, steps=20)
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    state["log_history"][5][f"rewards/{REWARD_NAMES[0]}/mean"] = None  # TRL's mean of a reward NaN all step long
    state["log_history"][6]["reward"] = math.nan
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert plots.moving_average([1.0, None, math.nan, 3.0], 2) == [1.0, 1.0, pytest.approx(math.nan, nan_ok=True), 3.0]
    assert panels(plots.plot_curves(tmp_path)) == 1

    def broken(*args, **kwargs):
        raise ValueError("a font is missing")

    monkeypatch.setattr(plots, "curves_figure", broken)
    assert plots.plot_curves(tmp_path) is None
    assert "No curves.png in" in caplog.text and "ValueError: a font is missing" in caplog.text


def test_the_title_names_the_objective_and_every_panel_spans_the_run(tmp_path):
    """A GSPO run's curves say GSPO; rewards logged last before the run's end (a generation serving several steps)
    are drawn on the same steps as accuracy, 0 to the last step."""
    write_state(tmp_path, steps=40, accuracy_every=10)
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    state["log_history"] = [e for e in state["log_history"] if "reward" not in e or e["step"] <= 37]
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    training = {"importance_sampling_level": "sequence", "loss_type": "grpo", "beta": 0.0, "scale_rewards": "group"}
    (tmp_path / "run_record.json").write_text(json.dumps({"settings": {"training": training}}))
    fig = plots.curves_figure(tmp_path)
    assert fig._suptitle.get_text() == f"{tmp_path.name}: GSPO training (loss grpo, beta 0)"
    assert {ax.get_xlim() for ax in fig.axes if ax.get_visible()} == {(-1.2, 41.2)}  # 0 to 40, a margin
    training = {"loss_type": "dr_grpo", "beta": 0.04, "scale_rewards": "none"}
    assert plots.objective(training) == "GRPO training (loss dr_grpo, beta 0.04, scale_rewards none)"


@pytest.mark.parametrize(("steps", "marked"), [(1, True), (2, True), (3, False)])
def test_a_run_of_one_or_two_steps_shows_its_points(tmp_path, steps, marked):
    """A line through one point draws nothing: a one-step run's reward and length panels would be empty."""
    write_state(tmp_path, steps=steps)
    fig = plots.curves_figure(tmp_path)
    drawn = [line for ax in fig.get_axes() for line in ax.get_lines() if len(line.get_xdata()) == steps]
    assert drawn and all((line.get_marker() not in (None, "None", "")) is marked for line in drawn)
