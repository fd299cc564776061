"""Reading GSM8K-format splits, from a local folder or the Hub, with a message instead of a traceback."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger("grpo_demo")


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file; a message naming the file and line when one is not a JSON object."""
    rows = []
    try:
        with path.open(encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of the first row
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    sys.exit(f"{path}, line {number}: not valid JSON ({err.msg}); each line must be one JSON object")
                if not isinstance(row, dict):
                    sys.exit(f"{path}, line {number}: a {type(row).__name__}, not an object like GSM8K's rows")
                rows.append(row)
    except UnicodeDecodeError as err:
        sys.exit(f"{path}: not UTF-8 text (byte {err.start}): save it as UTF-8 JSON lines")
    return rows


def load_split(split: str, dataset_dir: str | None, hub_name: str, hub_config: str):
    """GSM8K rows (`question`, `answer`) of `split` from a local folder of `<split>.jsonl`, or from the Hub."""
    from datasets import Dataset, load_dataset

    if dataset_dir:
        path = Path(dataset_dir) / f"{split}.jsonl"
        if not path.is_file():
            sys.exit(f"--dataset {dataset_dir}: no {path.name} there (expected GSM8K's train.jsonl / test.jsonl)")
        return Dataset.from_list(read_jsonl(path))
    try:
        return load_dataset(hub_name, hub_config, split=split)
    except Exception as err:  # the Hub is unreachable or the data set is not cached
        sys.exit(
            f"Could not load {hub_name} ({type(err).__name__}: {str(err)[:200]}).\n"
            "Offline? Use a local copy: --dataset DIR (a folder with train.jsonl and test.jsonl), "
            "or try the whole recipe on generated problems: --smoke"
        )


def report_bad_rows(bad: dict[str, list[int]], kept: int, split: str, source: str, strict: bool) -> None:
    """Say how many rows of `split` were dropped and why, naming their ids; stop instead with `strict`, or when
    nothing is left."""
    for reason, ids in bad.items():
        message = f"{len(ids)} {split} rows with {reason} (row ids {ids[:20]}{' ...' if len(ids) > 20 else ''})"
        if strict:
            sys.exit(f"Bad data: {message}. Fix the data, or drop such rows: --strict_data false")
        logger.warning("Dropped %s", message)
    if not kept:
        sys.exit(f"No usable {split} rows in {source}: every row was dropped (see above)")
