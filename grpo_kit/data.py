"""Reading GSM8K-format splits, from a local folder or the Hub, with a message instead of a traceback."""

from __future__ import annotations

import codecs
import json
import logging
import random
import sys
from pathlib import Path

logger = logging.getLogger("grpo_demo")


def read_jsonl(path: Path) -> tuple[list[tuple[int, dict]], dict[str, list[int]]]:
    """(line number, row) of every JSON object in a JSON-lines file, and the numbers of the lines that are not one,
    by reason. A byte-order mark is not part of the first line; blank lines are skipped."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        sys.exit(f"{path}: cannot be read ({err.strerror})")
    rows, bad = [], {}
    for number, line in enumerate(raw.removeprefix(codecs.BOM_UTF8).split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            bad.setdefault("a line that is not UTF-8 text", []).append(number)
            continue
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than the parser goes
            bad.setdefault("a line that is not valid JSON", []).append(number)
            continue
        if isinstance(row, dict):
            rows.append((number, row))
        else:
            bad.setdefault("a line that is not a JSON object", []).append(number)
    return rows, bad


def load_split(split: str, dataset_dir: str | None, hub_name: str, hub_config: str):
    """(rows, unreadable, how rows are named) of GSM8K's `split`: rows are (id, {"question", "answer", ...}) from a
    local folder's `<split>.jsonl` (ids are line numbers, named "<split>.jsonl lines") or from the Hub (ids are row
    numbers); unreadable lines by reason (`read_jsonl`)."""
    from datasets import load_dataset

    if dataset_dir:
        path = Path(dataset_dir) / f"{split}.jsonl"
        if not path.is_file():
            sys.exit(f"--dataset {dataset_dir}: no {path.name} there (expected GSM8K's train.jsonl / test.jsonl)")
        rows, bad = read_jsonl(path)
        return rows, bad, f"{path} lines"
    try:
        data = load_dataset(hub_name, hub_config, split=split)
    except Exception as err:  # the Hub is unreachable or the data set is not cached
        sys.exit(
            f"Could not load {hub_name} ({type(err).__name__}: {str(err)[:200]}).\n"
            "Offline? Use a local copy: --dataset DIR (a folder with train.jsonl and test.jsonl), "
            "or try the whole recipe on generated problems: --smoke"
        )
    return list(enumerate(data)), {}, f"{hub_name} {split} rows"


VALIDATION_SEED = 1234  # one draw whatever the training seed: runs and a search's trials hold out the same rows


def hold_out(train, n: int):
    """(`train` less `n` rows, those `n` rows): a validation split carved from the training rows by a fixed random
    draw, never trained on, so that tuning never looks at the test split. (train, None) when `n` is 0."""
    if train is None or n <= 0:
        return train, None
    if n >= len(train):
        sys.exit(f"validation_rows={n}: the train split has {len(train)} usable rows: hold out fewer")
    order = random.Random(VALIDATION_SEED).sample(range(len(train)), len(train))
    logger.info("Validation: %d of %d train rows held out (seed %d), never trained on", n, len(train), VALIDATION_SEED)
    return train.select(sorted(order[n:])), train.select(sorted(order[:n]))


def report_bad_rows(bad: dict[str, list[int]], kept: int, split: str, named: str, strict: bool) -> None:
    """Say how many rows of `split` were dropped and why, naming them (`named`: how their ids read, e.g.
    "data/train.jsonl lines"); stop instead with `strict`, or when nothing is left."""
    for reason, ids in bad.items():
        message = f"{len(ids)} {split} rows with {reason} ({named} {ids[:20]}{' ...' if len(ids) > 20 else ''})"
        if strict:
            sys.exit(f"Bad data: {message}. Fix the data, or drop such rows: --strict_data false")
        logger.warning("Dropped %s", message)
    if not kept:
        sys.exit(f"No usable {split} rows in {named.rsplit(' ', 1)[0]}: every row was dropped (see above)")


def drop_long_prompts(data, tokenizer, max_tokens: int):
    """Drop rows whose chat-templated prompt exceeds `max_tokens` (a cut question is unanswerable), and say so."""
    lengths = [
        len(tokenizer.apply_chat_template(p, tokenize=True, add_generation_prompt=True, return_dict=False))
        for p in data["prompt"]
    ]
    long_rows = [i for i, n in enumerate(lengths) if n > max_tokens]
    logger.info(
        "Prompts: %d rows, %d-%d tokens; %d over %d tokens dropped%s",
        len(lengths),
        min(lengths, default=0),
        max(lengths, default=0),
        len(long_rows),
        max_tokens,
        f" (rows {long_rows[:20]})" if long_rows else "",
    )
    if len(long_rows) == len(lengths):
        sys.exit(f"Every prompt is over {max_tokens} tokens: nothing to train on. Raise --max_prompt_tokens")
    return data.select(sorted(set(range(len(lengths))) - set(long_rows))) if long_rows else data
