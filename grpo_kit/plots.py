"""A picture of a run, readable without wandb: `<output_dir>/curves.png`, drawn at the end of every run.

The total and each reward in a small panel of its own, on its own scale (the four format rewards paying 0.5 alike never
hide one another), per optimizer step (thin: as logged; thick: moving average, its latest value in the title); the
mean completion length; greedy accuracy where the run measured it, during training (`eval_accuracy_*` in the log
history, from `evaluation.AccuracyCallback`) and before/after (the `eval/baseline` and `eval/final` summaries); and a
dashed red line, named, at the step where a training-health check fired (`health.json`)."""

import logging
import math
from pathlib import Path

from grpo_kit import layout
from grpo_kit.layout import read_json, read_summary

logger = logging.getLogger("grpo_demo")

# Accuracy panel: (summary key, label, line style, line width, color); the in-training callback logs `eval_<key>`.
ACCURACY_LINES = (
    ("format_rate", "strict format", ":", 1.4, "tab:green"),
    ("accuracy_lenient", "accuracy, lenient (last number)", "--", 1.2, "tab:orange"),
    ("accuracy_strict", "accuracy, strict (answer block)", "-", 2.2, "tab:blue"),
)
LENGTH_KEY = "completions/mean_length"
PANEL_SIZE = (5.2, 4.2)  # inches, the length and accuracy panels
REWARDS_WIDTH = 7.8  # inches, the rewards' small panels: three columns of two rows


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of the finite values among the last `window` at each point (of fewer at the start); NaN where there
    are none. A NaN or None (TRL logs None for a reward that was NaN throughout a step) is a gap, not a poison."""
    windows = [values[max(0, i - window + 1) : i + 1] for i in range(len(values))]
    finite = [[v for v in last if v is not None and math.isfinite(v)] for last in windows]
    return [sum(kept) / len(kept) if kept else math.nan for kept in finite]


def _measured(entry: dict, key: str) -> float | None:
    """An accuracy metric of a log entry, logged as `eval_<key>` (trainer state) or `eval/<key>` (trackers)."""
    return entry.get(f"eval_{key}", entry.get(f"eval/{key}"))


def plot_curves(output_dir: str | Path, title: str | None = None) -> Path | None:
    """Draw `<output_dir>/curves.png` (from trainer_state.json, eval/{baseline,final}/summary.json): its path, or None
    where there is no trainer state or drawing failed (said, not raised: a picture is not worth a run's end)."""
    try:
        if (fig := curves_figure(output_dir, title)) is None:
            return None
        path = layout.path(output_dir, layout.CURVES)
        fig.savefig(path, dpi=90)
    except Exception as err:  # noqa: BLE001 - any failure to draw is reported, never raised
        logger.warning("No curves.png in %s: drawing failed (%s: %s)", output_dir, type(err).__name__, err)
        return None
    logger.debug("Curves drawn in %s", path)  # the run's closing lines name it
    return path


def curves_figure(output_dir: str | Path, title: str | None = None):
    """The figure: rewards, completion length where logged, accuracy where measured; None without a trainer state."""
    output_dir = Path(output_dir)
    if (state := layout.read_state(output_dir)) is None:
        logger.info("No trainer_state.json in %s: no curves to draw", output_dir)
        return None
    history = state.get("log_history", [])
    steps = [e for e in history if "reward" in e and "step" in e]  # one entry per optimizer step
    measured = [e for e in history if any(_measured(e, key) is not None for key, *_ in ACCURACY_LINES)]
    before, after = (read_summary(output_dir, name) for name in ("baseline", "final"))
    findings = (read_json(layout.path(output_dir, layout.HEALTH)) or {}).get("findings") or []
    last_step = state.get("global_step") or max((e["step"] for e in history if "step" in e), default=0)

    from matplotlib.figure import Figure  # not pyplot's: a file, with no display and no window to open

    shown = {"length": any(LENGTH_KEY in e for e in steps), "accuracy": bool(measured or before or after)}
    panels = [name for name, show in shown.items() if show]
    fig = Figure(figsize=(REWARDS_WIDTH + PANEL_SIZE[0] * len(panels), PANEL_SIZE[1]), layout="constrained")
    widths = [REWARDS_WIDTH] + [PANEL_SIZE[0]] * len(panels)
    blocks = fig.subfigures(1, 1 + len(panels), squeeze=False, width_ratios=widths)[0]
    _plot_rewards(blocks[0], steps, findings)
    for name, block in zip(panels, blocks[1:], strict=True):
        ax = block.subplots()
        if name == "length":
            _plot_smoothed(ax, steps, LENGTH_KEY, "mean", "tab:blue")
            ax.set(xlabel="step", ylabel="tokens", title="Completion length")
            _mark_findings(ax, findings)
        else:
            _plot_accuracy(ax, measured, before, after, last_step)
        _grid(ax)
    for ax in fig.get_axes():  # every panel over the whole run: a reward logged last at step 37 ends there, at 37
        if ax.get_visible() and last_step:
            ax.set_xlim(-0.03 * last_step, 1.03 * last_step)  # a margin: the before/after markers sit at the ends
    settings = ((layout.read_record(output_dir) or {}).get("settings") or {}).get("training") or {}
    fig.suptitle(title or f"{output_dir.name}: {objective(settings)}", fontsize=12)
    return fig


def objective(training: dict) -> str:
    """What the run trained, from its recorded settings: `GSPO (loss grpo, beta 0)`, `GRPO (loss dapo, beta 0)`."""
    if not training:
        return "GRPO training"
    name = "GSPO" if training.get("importance_sampling_level") == "sequence" else "GRPO"
    name += ", GDPO's normalise-then-sum" if training.get("multi_objective_aggregation") == "normalize_then_sum" else ""
    terms = [f"loss {training.get('loss_type')}", f"beta {training.get('beta') or 0:g}"]
    if (scale := training.get("scale_rewards")) not in (None, "group"):
        terms.append(f"scale_rewards {scale}")
    return f"{name} training ({', '.join(terms)})"


def _plot_smoothed(ax, steps: list[dict], key: str, label: str, color: str) -> tuple[int, list[float]]:
    """`key` per step, faint as logged and solid as a moving average: (the window, the average)."""
    x = [e["step"] for e in steps]
    window = max(1, round(len(x) / 15))  # about 15 windows across the run, whatever its length
    values = [math.nan if e.get(key) is None else e[key] for e in steps]
    if window > 1:
        ax.plot(x, values, color=color, alpha=0.25, linewidth=0.8)
    smoothed = moving_average(values, window)
    few = len(x) <= 2  # a line through one point draws nothing: a run of one or two steps shows them as points
    ax.plot(x, smoothed, color=color, linewidth=1.8, label=label, marker="o" if few else None, markersize=5)
    if not steps:
        ax.text(0.5, 0.5, "no training steps logged", ha="center", va="center", transform=ax.transAxes)
    return window, smoothed


def _grid(ax) -> None:  # a light grid, and the steps as whole numbers, however few
    from matplotlib.ticker import MaxNLocator

    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _mark_findings(ax, findings: list[dict]) -> None:
    """A dashed red line at each step where a health check fired, its name beside it."""
    for finding in findings:
        step = finding.get("step")
        if isinstance(step, (int, float)):
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1, alpha=0.8)
            style = dict(xytext=(3, -3), textcoords="offset points", rotation=90, va="top", fontsize=7, color="tab:red")
            ax.annotate(finding.get("check", "health"), (step, 1), xycoords=("data", "axes fraction"), **style)


def _plot_rewards(block, steps: list[dict], findings: list[dict]) -> None:
    """The total and each logged reward in small panels of their own (two rows), each from 0 to its highest value."""
    keys = ["reward", *sorted({k for e in steps for k in e if k.startswith("rewards/") and k.endswith("/mean")})]
    rows = 2 if len(keys) > 2 else 1
    axes = block.subplots(rows, math.ceil(len(keys) / rows), sharex=True, squeeze=False).flatten()
    for i, (ax, key) in enumerate(zip(axes, keys, strict=False)):
        label = "total" if i == 0 else key.removeprefix("rewards/").removesuffix("/mean").removesuffix("_reward_func")
        window, smoothed = _plot_smoothed(ax, steps, key, label, "black" if i == 0 else f"C{i - 1}")
        latest = smoothed[-1] if smoothed else math.nan  # the title: its latest smoothed value
        ax.set_title(f"{label}: {latest:.2f}" if math.isfinite(latest) else label, fontsize=9)
        top = max((e[key] for e in steps if isinstance(e.get(key), (int, float)) and math.isfinite(e[key])), default=1)
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), max(top, 1e-3) * 1.15)
        ax.tick_params(labelsize=7)
        _grid(ax)
        if i == 0:
            _mark_findings(ax, findings)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    smoothing = f", moving average of {window} steps" if window > 1 else ""
    block.suptitle(f"Rewards: mean per step{smoothing}", fontsize=10)
    block.supxlabel("step", fontsize=9)


def _plot_accuracy(ax, measured: list[dict], before: dict | None, after: dict | None, last_step: int) -> None:
    """Percentages per step during training, the before/after evaluations as large markers at both ends."""
    for key, label, style, width, color in ACCURACY_LINES:
        points = [(e["step"], 100 * _measured(e, key)) for e in measured if _measured(e, key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), style, marker=".", color=color, linewidth=width, label=label)
            label = None  # one legend entry per metric
        for summary, step, marker, size, side in ((before, 0, "o", 8, 1), (after, last_step, "*", 13, -1)):
            if summary and key in summary:
                value = 100 * summary[key]
                ax.plot(step, value, marker, color=color, markersize=size, label=label)
                label = None
                where = dict(xytext=(7 * side, 4), textcoords="offset points", ha="left" if side > 0 else "right")
                ax.annotate(f"{value:.0f}", (step, value), fontsize=8, color=color, **where)
    headline = ""
    if before and after:
        headline = f": strict {100 * before['accuracy_strict']:.1f} % → {100 * after['accuracy_strict']:.1f} %"
    n = (after or before or {}).get("n")
    notes = ["lines: during training, on a subset"] if measured else []
    if before or after:
        notes.append("o / *: before / after training" + (f", {n} questions" if n else ""))
    ax.plot([], [], " ", label="\n".join(notes))  # no marker: a note in the legend
    ax.set(xlabel="step", ylabel="%", ylim=(-3, 103))
    ax.set_title(f"Greedy accuracy{headline}", fontsize=10)
    ax.legend(fontsize=8, loc="best")
