"""A picture of a run, readable without wandb: `<output_dir>/curves.png`, drawn at the end of every run.

- Rewards: the mean of each reward and of their total per optimizer step (thin: as logged; thick: moving average).
- Completion length: mean tokens per completion; a model that learns to reason longer shows it here.
- Training-health findings (`health.json`): a dashed red line at the step where a check fired, named.
- Accuracy, where the run measured it: greedy accuracy on the test split during training (`eval_accuracy_*` in the
  log history, from `evaluation.AccuracyCallback`) and before/after (the `eval/baseline` and `eval/final` summaries).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from grpo_kit import health
from grpo_kit.folders import read_json
from grpo_kit.reports import read_summary

logger = logging.getLogger("grpo_demo")

FILE_NAME = "curves.png"
# Accuracy panel: (summary key, label, line style, line width); the in-training callback logs `eval_<key>`.
ACCURACY_LINES = (
    ("format_rate", "strict format", ":", 1.4),
    ("accuracy_lenient", "accuracy, lenient (last number)", "--", 1.2),
    ("accuracy_strict", "accuracy, strict (answer block)", "-", 2.2),
)
LENGTH_KEY = "completions/mean_length"


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of the finite values among the last `window` at each point (of fewer at the start); NaN where there
    are none. A NaN or None (TRL logs None for a reward that was NaN throughout a step) is a gap, not a poison."""
    out = []
    for i in range(len(values)):
        finite = [v for v in values[max(0, i - window + 1) : i + 1] if v is not None and math.isfinite(v)]
        out.append(sum(finite) / len(finite) if finite else math.nan)
    return out


def _measured(entry: dict, key: str) -> float | None:
    """An accuracy metric of a log entry, logged as `eval_<key>` (trainer state) or `eval/<key>` (trackers)."""
    for name in (f"eval_{key}", f"eval/{key}"):
        if name in entry:
            return entry[name]
    return None


def plot_curves(output_dir: str | Path, title: str | None = None) -> Path | None:
    """Draw `<output_dir>/curves.png` from its `trainer_state.json` and `eval/{baseline,final}/summary.json`.

    Returns the picture's path, or None (nothing drawn) when the folder holds no trainer state, or when drawing
    failed: a picture is never worth a run's end (it says why and goes on).
    """
    try:
        fig = curves_figure(output_dir, title)
        if fig is None:
            return None
        import matplotlib.pyplot as plt

        path = Path(output_dir) / FILE_NAME
        fig.savefig(path, dpi=90)
        plt.close(fig)
    except Exception as err:  # noqa: BLE001 - any failure to draw is reported, never raised
        logger.warning("No curves.png in %s: drawing failed (%s: %s)", output_dir, type(err).__name__, err)
        return None
    logger.info("Curves drawn in %s", path)
    return path


def curves_figure(output_dir: str | Path, title: str | None = None):
    """The curves as a matplotlib figure (one panel each: rewards, completion length where logged, accuracy where
    measured), or None when the folder holds no trainer state."""
    output_dir = Path(output_dir)
    state = read_json(output_dir / "trainer_state.json")
    if state is None:
        logger.info("No trainer_state.json in %s: no curves to draw", output_dir)
        return None
    history = state.get("log_history", [])
    steps = [e for e in history if "reward" in e and "step" in e]  # one entry per optimizer step
    measured = [e for e in history if any(_measured(e, key) is not None for key, *_ in ACCURACY_LINES)]
    before, after = (read_summary(output_dir, name) for name in ("baseline", "final"))
    findings = (read_json(output_dir / health.FILE_NAME) or {}).get("findings") or []
    last_step = state.get("global_step") or max((e["step"] for e in history if "step" in e), default=0)

    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, and no window opened where there is one
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = ["rewards"]
    if any(LENGTH_KEY in e for e in steps):
        panels.append("length")
    if measured or before or after:
        panels.append("accuracy")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for name, ax in zip(panels, axes[0], strict=True):
        if name == "rewards":
            _plot_rewards(ax, steps)
            _mark_findings(ax, findings)
        elif name == "length":
            _plot_smoothed(ax, steps, [(LENGTH_KEY, "mean", "tab:blue", 1.8)])
            ax.set(title="Completion length", xlabel="step", ylabel="tokens")
            _mark_findings(ax, findings)
        else:
            _plot_accuracy(ax, measured, before, after, last_step)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers, however few
    fig.suptitle(title or f"{output_dir.name}: GRPO training", fontsize=12)
    fig.tight_layout()
    return fig


def _plot_smoothed(ax, steps: list[dict], lines: list[tuple[str, str, str, float]]) -> int:
    """Each (key, label, color, width) per step: faint as logged, solid as a moving average; returns the window."""
    x = [e["step"] for e in steps]
    window = max(1, round(len(x) / 15))  # about 15 windows across the run, whatever its length
    for key, label, color, width in lines:
        values = [math.nan if e.get(key) is None else e[key] for e in steps]
        if window > 1:
            ax.plot(x, values, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(x, moving_average(values, window), color=color, linewidth=width, label=label)
    if not steps:
        ax.text(0.5, 0.5, "no training steps logged", ha="center", va="center", transform=ax.transAxes)
    return window


def _mark_findings(ax, findings: list[dict]) -> None:
    """A dashed red line at each step where a health check fired, its name beside it."""
    for finding in findings:
        step = finding.get("step")
        if isinstance(step, (int, float)):
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1, alpha=0.8)
            ax.annotate(
                finding.get("check", "health"),
                (step, 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3),
                textcoords="offset points",
                rotation=90,
                va="top",
                fontsize=7,
                color="tab:red",
            )


def _plot_rewards(ax, steps: list[dict]) -> None:
    keys = sorted({k for e in steps for k in e if k.startswith("rewards/") and k.endswith("/mean")})
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
    lines = [
        (key, key.removeprefix("rewards/").removesuffix("/mean").removesuffix("_reward_func"), color, 1.6)
        for key, color in zip(keys, colors * (1 + len(keys) // len(colors)), strict=False)
    ]
    window = _plot_smoothed(ax, steps, [*lines, ("reward", "total", "black", 2.4)])
    smoothing = f" (moving average of {window} steps)" if window > 1 else ""
    ax.set(title=f"Rewards: mean per step{smoothing}", xlabel="step", ylabel="reward")
    ax.legend(fontsize=8, loc="best")


def _plot_accuracy(ax, measured: list[dict], before: dict | None, after: dict | None, last_step: int) -> None:
    """Percentages per step during training, the before/after evaluations as large markers at both ends."""
    colors = {"format_rate": "tab:green", "accuracy_lenient": "tab:orange", "accuracy_strict": "tab:blue"}
    for key, label, style, width in ACCURACY_LINES:
        color = colors[key]
        points = [e for e in measured if _measured(e, key) is not None]
        if points:
            x, y = [e["step"] for e in points], [100 * _measured(e, key) for e in points]
            ax.plot(x, y, style, marker=".", color=color, linewidth=width, label=label)
            label = None  # one legend entry per metric
        for summary, step, marker, size, side in ((before, 0, "o", 8, 1), (after, last_step, "*", 13, -1)):
            if summary is None or key not in summary:
                continue
            value = 100 * summary[key]
            ax.plot(step, value, marker, color=color, markersize=size, label=label)
            label = None
            ax.annotate(
                f"{value:.0f}",
                (step, value),
                textcoords="offset points",
                xytext=(7 * side, 4),
                ha="left" if side > 0 else "right",
                fontsize=8,
                color=color,
            )
    headline = ""
    if before and after:
        headline = f": strict {100 * before['accuracy_strict']:.1f} % → {100 * after['accuracy_strict']:.1f} %"
    n = (after or before or {}).get("n")
    notes = ["lines: during training, on a subset"] if measured else []
    if before or after:
        notes.append("o / *: before / after training" + (f", {n} questions" if n else ""))
    ax.plot([], [], " ", label="\n".join(notes))  # no marker: a note in the legend
    ax.set(title=f"Greedy accuracy on the test split{headline}", xlabel="step", ylabel="%", ylim=(-3, 103))
    ax.legend(fontsize=8, loc="best")
