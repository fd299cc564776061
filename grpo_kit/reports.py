"""Where evaluations are written and how they read: `<output_dir>/eval/<name>/` and the printed tables."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from grpo_kit import stats
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


# What makes two evaluations of one name the same measurement (an older summary without a protocol was the recipe's);
# `sampling` holds the samples' terms: samples, temperature, seed.
TERMS = ("model", "questions_sha256", "max_new_tokens", "protocol", "protocol_details", "sampling")
SAMPLING_TERMS = ("samples", "temperature", "seed")
# The accuracy rows' labels where a protocol reads answers otherwise than the recipe's.
ACCURACY_LABELS = {
    "kshot": {"accuracy_strict": "accuracy, strict (#### N)", "accuracy_lenient": "accuracy, flexible (last number)"},
    "chat": {"accuracy_strict": "accuracy, strict (\\boxed{})", "accuracy_lenient": "accuracy, boxed else last number"},
}


def eval_name(base: str, protocol: str = "recipe") -> str:
    """The folder an evaluation of `protocol` is written to: `baseline`, `final` for the recipe's; `baseline-kshot`,
    `final-chat`... for the others."""
    return base if protocol == "recipe" else f"{base}-{protocol}"


def comparison_file(protocol: str = "recipe") -> str:
    return COMPARISON if protocol == "recipe" else f"comparison-{protocol}.json"


def _term(summary: dict, key: str):
    if key == "protocol":
        return summary.get(key, "recipe")
    if key == "sampling":
        return sampling_terms(summary.get("sampling"))
    return summary.get(key)


def sampling_terms(sampling: dict | None) -> dict | None:
    """What makes two sets of samples alike (a summary's `sampling`, or the settings of one), None for none."""
    return {key: sampling.get(key) for key in SAMPLING_TERMS} if sampling else None


def free_name(output_dir: str | Path, name: str, terms: dict) -> str:
    """`name`, or `name-2`, `name-3`... when an evaluation of that name exists on other `terms` (model, questions,
    length): a new measurement never replaces a different one."""
    candidate, number = name, 1
    while (old := read_summary(output_dir, candidate)) is not None and any(
        _term(old, k) != (sampling_terms(terms[k]) if k == "sampling" else terms[k]) for k in TERMS
    ):
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
    if _term(old, "protocol") != _term(new, "protocol"):
        return f"they were measured in different protocols: {_term(old, 'protocol')} vs {_term(new, 'protocol')}"
    if old.get("protocol_details") != new.get("protocol_details"):
        details = old.get("protocol_details"), new.get("protocol_details")
        return f"their {_term(old, 'protocol')} prompts differ: {details[0]} vs {details[1]}"
    for key, label in (("questions_sha256", "questions"), ("max_new_tokens", "max_new_tokens")):
        if old.get(key) != new.get(key):
            shown = (old.get("n"), new.get("n")) if key == "questions_sha256" else (old.get(key), new.get(key))
            return f"they were measured on different {label}: {shown[0]} vs {shown[1]}"
    return None


def _cell(value, percent: bool, change: bool = False, interval=None) -> str:
    """A table cell: a rate as a percentage (a change of one in points) with its 95 % interval where given, a count
    as is, a mean to one decimal; "-" where not measured."""
    if value is None:
        return "-"
    sign = "+" if change else ""
    if percent:
        shown = f"{100 * value:{sign}.1f} {'pp' if change else '%'}"
        return shown + (f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else "")
    return f"{value:{sign}.1f}" if isinstance(value, float) else f"{value:{sign}d}"


def _rows(summary: dict) -> list[tuple[str, str, object, bool, list | None]]:
    """(key, label, value, as a percentage, interval) of each table row a summary has: the greedy rates and counts,
    then pass@k and maj@k where samples were drawn."""
    labels = ACCURACY_LABELS.get(_term(summary, "protocol"), {})
    rows = [
        (key, labels.get(key, label), summary.get(key), pct, summary.get(INTERVALS.get(key, "")))
        for key, label, pct in TABLE_ROWS
    ]
    sampling = summary.get("sampling") or {}
    for verdict in ("strict", "lenient"):
        for metric, value in (sampling.get(verdict) or {}).items():
            label = f"{metric}, {verdict} ({sampling['samples']} samples, T {sampling['temperature']})"
            rows.append((f"{verdict}/{metric}", label, value["value"], True, value["interval"]))
    return [row for row in rows if row[2] is not None]


INTERVALS = {"accuracy_strict": "interval_strict", "accuracy_lenient": "interval_lenient"}


def write_report(output_dir: str | Path, name: str, summary: dict, records: list[dict]) -> Path:
    """`eval/<name>/summary.json` and `completions.jsonl` (one record a line) in `output_dir`; prints a table."""
    folder = eval_dir(output_dir, name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with (folder / COMPLETIONS).open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    protocol = summary.get("protocol", "recipe")
    protocol += (
        " protocol, validation split (held out of train)" if summary.get("split") == "validation" else " protocol"
    )
    lines = [
        f"GSM8K {name}: {summary['model']}, {protocol}, {summary['n']} questions, {summary['seconds']} s",
        "| metric | value [95 % interval] |",
        "| --- | --- |",
        *(f"| {label} | {_cell(value, pct, interval=iv)} |" for _, label, value, pct, iv in _rows(summary)),
    ]
    print("\n".join(lines), flush=True)
    logger.info("Evaluation written to %s", folder)
    return folder


def read_records(output_dir: str | Path, name: str) -> list[dict]:
    path = eval_dir(output_dir, name) / COMPLETIONS
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def paired_changes(old_records: list[dict], new_records: list[dict]) -> dict:
    """Per verdict (strict, lenient): the questions that flipped each way and the exact McNemar test (counts,
    p-value, verdict); and, for the strict verdict, each flipped question with both completions."""
    out = {}
    for verdict in ("strict", "lenient"):
        key = f"correct_{verdict}"
        result = stats.paired([r[key] for r in old_records], [r[key] for r in new_records])
        out[verdict] = {
            "gained": len(result["gained"]),
            "lost": len(result["lost"]),
            "p_value": result["p_value"],
            "verdict": result["verdict"],
            "test": "exact McNemar (two-sided binomial on the questions that changed)",
        }
        if verdict == "strict":
            out["flipped"] = {
                way: [
                    {
                        "question": new_records[i]["question"],
                        "gold": new_records[i]["gold"],
                        "before": old_records[i]["completion"],
                        "after": new_records[i]["completion"],
                    }
                    for i in result[way]
                ]
                for way in ("gained", "lost")
            }
    return out


def compare(output_dir: str | Path, protocol: str = "recipe") -> dict | None:
    """`eval/comparison.json` (`comparison-<protocol>.json` for the others) in `output_dir`: the baseline and final
    summaries of `protocol` side by side with their changes, the paired test per verdict and the questions that
    flipped, and a printed table; None (nothing written, and an older comparison removed) unless both evaluations
    exist and measured comparable things: the start model of the trained one, the same questions, length and
    protocol."""
    before, after = eval_name("baseline", protocol), eval_name("final", protocol)
    path = eval_dir(output_dir) / comparison_file(protocol)
    old, new = read_summary(output_dir, before), read_summary(output_dir, after)
    if old is None or new is None:
        return None
    reason = why_not_comparable(old, new)
    old_records, new_records = read_records(output_dir, before), read_records(output_dir, after)
    if not reason and not (len(old_records) == len(new_records) == old["n"]):
        reason = f"their completions.jsonl hold {len(old_records)} and {len(new_records)} of {old['n']} questions"
    if reason:
        logger.warning("No comparison of %s and %s in %s: %s", before, after, eval_dir(output_dir), reason)
        path.unlink(missing_ok=True)  # an older one would no longer be true
        return None
    old_rows = {key: (label, value, pct, iv) for key, label, value, pct, iv in _rows(old)}
    if _term(old, "sampling") != _term(new, "sampling"):  # pass@k of other samples is another quantity
        if _term(old, "sampling") and _term(new, "sampling"):
            logger.warning(
                "%s and %s drew other samples (%s vs %s): their pass@k and maj@k are not compared",
                before,
                after,
                _term(old, "sampling"),
                _term(new, "sampling"),
            )
        old_rows = {key: row for key, row in old_rows.items() if "@" not in key}
    new_rows = {key: (value, iv) for key, _, value, _, iv in _rows(new)}
    changes = {key: new_rows[key][0] - row[1] for key, row in old_rows.items() if key in new_rows}
    paired = paired_changes(old_records, new_records)
    comparison = {before: old, after: new, "change": changes, "paired": paired}
    path.write_text(json.dumps(comparison, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [
        f"GSM8K, {before} vs {after} ({_term(old, 'protocol')} protocol, {old['n']} / {new['n']} questions)",
        f"| metric | {before} [95 % interval] | {after} | change |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {_cell(value, pct, interval=iv)} | {_cell(new_rows[key][0], pct, interval=new_rows[key][1])}"
            f" | {_cell(changes[key], pct, True)} |"
            for key, (label, value, pct, iv) in old_rows.items()
            if key in changes
        ),
        *(
            f"Paired, {verdict}: {paired[verdict]['gained']} questions gained, {paired[verdict]['lost']} lost; "
            f"exact McNemar p = {paired[verdict]['p_value']:.3g}: {paired[verdict]['verdict']}"
            for verdict in ("strict", "lenient")
        ),
        f"The questions that flipped, with both completions: {path} (paired.flipped)",
    ]
    print("\n".join(lines), flush=True)
    return comparison
