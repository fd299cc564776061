"""Where evaluations are written and how they read: `<output_dir>/eval/<name>/` and the printed tables."""

import json
import logging
from pathlib import Path

from grpo_kit import layout
from grpo_kit.layout import EVAL_COMPLETIONS, SUMMARY, eval_dir, eval_name, part, read_record, read_summary
from grpo_kit.scoring import paired

logger = logging.getLogger("grpo_demo")

MCNEMAR = "exact McNemar (two-sided binomial on the questions that changed)"
TABLE_ROWS = (  # the printed tables' rows: (summary key, label, shown as a percentage)
    ("accuracy_strict", "accuracy, strict (answer block)", True),
    ("accuracy_lenient", "accuracy, lenient (last number)", True),
    ("format_rate", "strict format", True),
    ("soft_format_rate", "soft format", True),
    ("mean_completion_tokens", "mean completion tokens", False),
    ("truncated", "truncated (hit max_new_tokens)", False),
)
INTERVALS = {"accuracy_strict": "interval_strict", "accuracy_lenient": "interval_lenient"}


# What makes two evaluations of one name the same measurement (an older summary without a protocol was the recipe's,
# without a split the test split's): the model, the questions and their split, the prompt (protocol and, where it
# asks for and reads the recipe's format, its tags), the length, the samples.
TERMS = (
    "model", "questions_sha256", "split", "validation_rows", "max_new_tokens", "protocol", "protocol_details", "tags",
    "sampling",
)  # fmt: skip
SAMPLING_TERMS = ("samples", "temperature", "seed")
ACCURACY_LABELS = {  # the accuracy rows' labels where a protocol reads answers otherwise than the recipe's
    **{
        name: {"accuracy_strict": "exact_match, strict-match", "accuracy_lenient": "exact_match, flexible-extract"}
        for name in ("gsm8k", "gsm8k-chat", "gsm8k_cot", "gsm8k_cot-chat")
    },
    "chat": {"accuracy_strict": "accuracy, strict (\\boxed{})", "accuracy_lenient": "accuracy, boxed else last number"},
}


def _term(summary: dict, key: str):
    if key == "protocol":
        return summary.get(key, "recipe")
    if key == "split":
        return summary.get(key, "test")
    if key == "sampling":  # what makes two sets of samples alike
        return {k: sampling.get(k) for k in SAMPLING_TERMS} if (sampling := summary.get(key)) else None
    return summary.get(key)


def free_name(output_dir: str | Path, name: str, terms: dict) -> str:
    """`name`, or `name-2`, `name-3`... when an evaluation of that name exists on other `terms` (TERMS of the
    summary to come: model, questions, length...): a new measurement never replaces a different one."""
    candidate, number = name, 1
    while (old := read_summary(output_dir, candidate)) is not None and any(
        _term(old, k) != _term(terms, k) for k in TERMS
    ):
        number += 1
        candidate = f"{name}-{number}"
    if candidate != name:
        logger.warning("%s holds an evaluation of other terms: this one is %s", eval_dir(output_dir, name), candidate)
    return candidate


def start_model_of(run_dir: str | Path) -> str | None:
    """The model a training run in `run_dir` started from, as its run record says (None without one)."""
    return ((read_record(run_dir) or {}).get("settings") or {}).get("model", {}).get("model_name_or_path")


def why_not_comparable(old: dict, new: dict) -> str | None:
    """Why a baseline and a final evaluation cannot be set side by side, None when they can."""
    if new.get("start_model") is not None and old.get("model") != new["start_model"]:
        return f"the baseline measured {old.get('model')}, and the trained model started from {new['start_model']}"
    if _term(old, "protocol") != _term(new, "protocol"):
        return f"they were measured in different protocols: {_term(old, 'protocol')} vs {_term(new, 'protocol')}"
    if old.get("protocol_details") != new.get("protocol_details"):
        details = old.get("protocol_details"), new.get("protocol_details")
        return f"their {_term(old, 'protocol')} prompts differ: {details[0]} vs {details[1]}"
    if None not in (tags := (old.get("tags"), new.get("tags"))) and tags[0] != tags[1]:  # None: recorded before
        return f"they were asked for and read in other tags: {' '.join(tags[0])} vs {' '.join(tags[1])}"
    for key, label in (("split", "splits"), ("questions_sha256", "questions"), ("max_new_tokens", "max_new_tokens")):
        if _term(old, key) != _term(new, key):
            shown = (old.get("n"), new.get("n")) if key == "questions_sha256" else (_term(old, key), _term(new, key))
            return f"they were measured on different {label}: {shown[0]} vs {shown[1]}"
    return None


def _cell(value, percent: bool, interval=None, change: bool = False) -> str:
    """A table cell: a rate as a percentage (a change of one in points) with its 95 % interval where given, a count
    as is, a mean to one decimal; "-" where not measured."""
    if value is None:
        return "-"
    sign = "+" if change else ""
    if percent:
        shown = f"{100 * value:{sign}.1f} {'pp' if change else '%'}"
        return shown + (f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else "")
    return f"{value:{sign}.1f}" if isinstance(value, float) else f"{value:{sign}d}"


def _rows(summary: dict) -> dict[str, tuple[str, object, bool, list | None]]:
    """{key: (label, value, as %, interval)} of a summary's rows: greedy rates and counts, then pass@k and maj@k."""
    labels = ACCURACY_LABELS.get(_term(summary, "protocol"), {})
    rows = {
        key: (labels.get(key, label), summary.get(key), pct, summary.get(INTERVALS.get(key, "")))
        for key, label, pct in TABLE_ROWS
    }
    sampling = summary.get("sampling") or {}
    for verdict in ("strict", "lenient"):
        for metric, value in (sampling.get(verdict) or {}).items():
            label = f"{metric}, {verdict} ({sampling['samples']} samples, T {sampling['temperature']})"
            rows[f"{verdict}/{metric}"] = (label, value["value"], True, value["interval"])
    return {key: row for key, row in rows.items() if row[1] is not None}


def write_report(output_dir: str | Path, name: str, summary: dict, records: list[dict], table: bool = True) -> Path:
    """`eval/<name>/summary.json` and `completions.jsonl` (one record a line) in `output_dir`; prints a table, or
    with `table` false (a training run's, whose comparison prints the table at its end) one line."""
    folder = eval_dir(output_dir, name)
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    for file, text in ((EVAL_COMPLETIONS, lines), (SUMMARY, json.dumps(summary, indent=2) + "\n")):
        part_file = part(folder / file)  # whole or not at all: a stop while writing leaves the older file
        part_file.write_text(text, encoding="utf-8")
        part_file.replace(folder / file)
    protocol = _term(summary, "protocol") + " protocol"
    protocol += ", validation split (held out of train)" if summary.get("split") == "validation" else ""
    if not table:
        rates = ", ".join(f"{100 * summary[f'accuracy_{v}']:.1f} % {v}" for v in ("strict", "lenient"))
        logger.info("GSM8K %s (%s, %d questions): %s, written to %s", name, protocol, summary["n"], rates, folder)
        return folder
    lines = [
        f"GSM8K {name}: {summary['model']}, {protocol}, {summary['n']} questions, {summary['seconds']} s",
        "| metric | value [95 % interval] |",
        "| --- | --- |",
        *(f"| {label} | {_cell(*cells)} |" for label, *cells in _rows(summary).values()),
    ]
    print("\n".join(lines), flush=True)
    logger.info("Evaluation written to %s", folder)
    return folder


RECORD_KEYS = ("question", "gold", "completion", "correct_strict", "correct_lenient")  # what a comparison reads


def read_records(output_dir: str | Path, name: str) -> list[dict] | None:
    """The records of `eval/<name>/completions.jsonl` ([] without one); None where a line is damaged (cut short)."""
    path = eval_dir(output_dir, name) / EVAL_COMPLETIONS
    try:
        lines = path.read_text(encoding="utf-8").split("\n") if path.is_file() else []
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError):
        return None
    return records if all(isinstance(r, dict) and all(k in r for k in RECORD_KEYS) for r in records) else None


def paired_changes(old: list[dict], new: list[dict]) -> dict:
    """Per verdict (strict, lenient): the questions that flipped each way and the exact McNemar test (counts,
    p-value, verdict); and, for the strict verdict, each flipped question with both completions."""
    out = {}
    for verdict in ("strict", "lenient"):
        result = paired([r[f"correct_{verdict}"] for r in old], [r[f"correct_{verdict}"] for r in new])
        counts = {way: len(result[way]) for way in ("gained", "lost")}
        out[verdict] = {**counts, "p_value": result["p_value"], "verdict": result["verdict"], "test": MCNEMAR}
        if verdict == "strict":
            out["flipped"] = {way: [_flipped(old[i], new[i]) for i in result[way]] for way in ("gained", "lost")}
    return out


def _flipped(old: dict, new: dict) -> dict:
    return {"question": new["question"], "gold": new["gold"], "before": old["completion"], "after": new["completion"]}


def compare(output_dir: str | Path, protocol: str = "recipe") -> dict | None:
    """`eval/comparison.json` (`comparison-<protocol>.json` for the others): the baseline and final summaries of
    `protocol` side by side with their changes, the paired test per verdict and the questions that flipped, and a
    printed table; None (and an older comparison removed) unless both exist and are comparable."""
    before, after = eval_name("baseline", protocol), eval_name("final", protocol)
    path = layout.comparison(output_dir, protocol)
    old, new = read_summary(output_dir, before), read_summary(output_dir, after)
    if old is None or new is None:
        return None
    reason = why_not_comparable(old, new)
    old_records, new_records = read_records(output_dir, before), read_records(output_dir, after)
    damaged = [(name, summary) for name, summary, records in ((before, old, old_records), (after, new, new_records))
               if records is None]  # fmt: skip
    if not reason and damaged:
        name, summary = damaged[0]
        reason = (
            f"{eval_dir(output_dir, name) / EVAL_COMPLETIONS} cannot be read (cut short?): measure {name} again, with "
            f"the settings it was measured with: --eval_only --model_name_or_path {summary.get('model')} --output_dir "
            f"{output_dir}"
        )
    elif not reason and not (len(old_records) == len(new_records) == old["n"]):
        reason = f"their completions.jsonl hold {len(old_records)} and {len(new_records)} of {old['n']} questions"
    if reason:
        logger.warning("No comparison of %s and %s in %s: %s", before, after, eval_dir(output_dir), reason)
        path.unlink(missing_ok=True)  # an older one would no longer be true
        return None
    old_rows, new_rows = _rows(old), _rows(new)
    drawn = _term(old, "sampling"), _term(new, "sampling")
    if drawn[0] != drawn[1]:  # pass@k of other samples is another quantity
        if all(drawn):
            message = "%s and %s drew other samples (%s vs %s): their pass@k and maj@k are not compared"
            logger.warning(message, before, after, *drawn)
        old_rows = {key: row for key, row in old_rows.items() if "@" not in key}
    changes = {key: new_rows[key][1] - row[1] for key, row in old_rows.items() if key in new_rows}
    paired = paired_changes(old_records, new_records)
    comparison = {before: old, after: new, "change": changes, "paired": paired}
    path.write_text(json.dumps(comparison, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [
        f"GSM8K, {before} vs {after} ({_term(old, 'protocol')} protocol, {old['n']} / {new['n']} questions)",
        f"| metric | {before} [95 % interval] | {after} | change |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {_cell(*cells)} | {_cell(*new_rows[key][1:])} | {_cell(changes[key], cells[1], None, True)} |"
            for key, (label, *cells) in old_rows.items()
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
