"""Where evaluations are written and how they read: `<output_dir>/eval/<name>/` and the printed tables."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from grpo_kit.folders import read_json

logger = logging.getLogger("grpo_demo")

SUMMARY, COMPLETIONS, COMPARISON = "summary.json", "completions.jsonl", "comparison.json"
# Rows of the printed tables: (summary key, label, shown as a percentage).
TABLE_ROWS = (
    ("accuracy_strict", "accuracy, strict (answer block)", True),
    ("accuracy_lenient", "accuracy, lenient (last number)", True),
    ("format_rate", "strict format", True),
    ("soft_format_rate", "soft format", True),
    ("mean_completion_tokens", "mean completion tokens", False),
    ("truncated", "truncated (hit max_new_tokens)", False),
)


def eval_dir(output_dir: str | Path, name: str | None = None) -> Path:
    """The evaluation folder of a run (`<output_dir>/eval`), or of one evaluation in it (`.../eval/<name>`)."""
    folder = Path(output_dir) / "eval"
    return folder / name if name else folder


def read_summary(output_dir: str | Path, name: str) -> dict | None:
    return read_json(eval_dir(output_dir, name) / SUMMARY)


TERMS = ("model", "questions_sha256", "max_new_tokens")  # what makes two evaluations of one name the same measurement


def free_name(output_dir: str | Path, name: str, terms: dict) -> str:
    """`name`, or `name-2`, `name-3`... when an evaluation of that name exists on other `terms` (model, questions,
    length): a new measurement never replaces a different one."""
    candidate, number = name, 1
    while (old := read_summary(output_dir, candidate)) is not None and any(old.get(k) != terms[k] for k in TERMS):
        number += 1
        candidate = f"{name}-{number}"
    if candidate != name:
        logger.warning("%s holds an evaluation of other terms: this one is %s", eval_dir(output_dir, name), candidate)
    return candidate


def start_model_of(run_dir: str | Path) -> str | None:
    """The model a training run in `run_dir` started from, as its run record says (None without one)."""
    from grpo_kit.record import read_run_record

    return ((read_run_record(run_dir) or {}).get("settings") or {}).get("model", {}).get("model_name_or_path")


def why_not_comparable(old: dict, new: dict) -> str | None:
    """Why a baseline and a final evaluation cannot be set side by side, None when they can."""
    if new.get("start_model") is not None and old.get("model") != new["start_model"]:
        return f"the baseline measured {old.get('model')}, and the trained model started from {new['start_model']}"
    for key, label in (("questions_sha256", "questions"), ("max_new_tokens", "max_new_tokens")):
        if old.get(key) != new.get(key):
            shown = (old.get("n"), new.get("n")) if key == "questions_sha256" else (old.get(key), new.get(key))
            return f"they were measured on different {label}: {shown[0]} vs {shown[1]}"
    return None


def _cell(value, percent: bool, change: bool = False) -> str:
    """A table cell: a rate as a percentage (a change of one in points), a count as is, a mean to one decimal."""
    sign = "+" if change else ""
    if percent:
        return f"{100 * value:{sign}.1f} {'pp' if change else '%'}"
    return f"{value:{sign}.1f}" if isinstance(value, float) else f"{value:{sign}d}"


def write_report(output_dir: str | Path, name: str, summary: dict, records: list[dict]) -> Path:
    """`eval/<name>/summary.json` and `completions.jsonl` (one record a line) in `output_dir`; prints a table."""
    folder = eval_dir(output_dir, name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with (folder / COMPLETIONS).open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    lines = [
        f"GSM8K {name}: {summary['model']}, {summary['n']} questions, {summary['seconds']} s",
        "| metric | value |",
        "| --- | --- |",
        *(f"| {label} | {_cell(summary[key], percent)} |" for key, label, percent in TABLE_ROWS),
    ]
    print("\n".join(lines), flush=True)
    logger.info("Evaluation written to %s", folder)
    return folder


def compare(output_dir: str | Path, before: str = "baseline", after: str = "final") -> dict | None:
    """`eval/comparison.json` in `output_dir`: the `before` and `after` summaries side by side with their changes,
    and a printed table; None (nothing written, and an older comparison removed) unless both evaluations exist and
    measured comparable things: the start model of the trained one, the same questions and length."""
    old, new = read_summary(output_dir, before), read_summary(output_dir, after)
    if old is None or new is None:
        return None
    reason = why_not_comparable(old, new)
    if reason:
        logger.warning("No comparison of %s and %s in %s: %s", before, after, eval_dir(output_dir), reason)
        (eval_dir(output_dir) / COMPARISON).unlink(missing_ok=True)  # an older one would no longer be true
        return None
    keys = [key for key, _, _ in TABLE_ROWS]
    comparison = {before: old, after: new, "change": {key: new[key] - old[key] for key in keys}}
    (eval_dir(output_dir) / COMPARISON).write_text(json.dumps(comparison, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"GSM8K, {before} vs {after} ({old['n']} / {new['n']} questions)",
        f"| metric | {before} | {after} | change |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {_cell(old[key], pct)} | {_cell(new[key], pct)} | {_cell(new[key] - old[key], pct, True)} |"
            for key, label, pct in TABLE_ROWS
        ),
    ]
    print("\n".join(lines), flush=True)
    return comparison
