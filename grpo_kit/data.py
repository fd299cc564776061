"""GSM8K-format splits: read from a local folder or the Hub (bad rows named and dropped), which of them a run
reads (`splits`: train, and the test split or the validation rows held out of train), and prompts too long."""

import codecs
import json
import logging
import random
from pathlib import Path

from grpo_kit import RecipeError, offline_commands

logger = logging.getLogger("grpo_demo")


def read_jsonl(path: Path) -> tuple[list[tuple[int, dict]], dict[str, list[int]]]:
    """(line number, row) of every JSON object in a JSON-lines file, and the numbers of the lines that are not one,
    by reason. A byte-order mark is not part of the first line; blank lines are skipped."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise RecipeError(f"{path}: cannot be read ({err.strerror})") from None
    rows, bad = [], {}
    for number, line in enumerate(raw.removeprefix(codecs.BOM_UTF8).split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
            reason = None if isinstance(row, dict) else "a line that is not a JSON object"
        except UnicodeDecodeError:
            reason = "a line that is not UTF-8 text"
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than the parser goes
            reason = "a line that is not valid JSON"
        if reason:
            bad.setdefault(reason, []).append(number)
        else:
            rows.append((number, row))
    return rows, bad


def split_files(dataset_dir: str | Path, split: str) -> list[Path]:
    """The files of `split` in a local GSM8K copy: GSM8K's `<split>.jsonl`, or the Hub's parquet shards of its main
    config (`main/<split>-00000-of-00001.parquet`; or in the folder itself, a copy of `main/`); [] when neither."""
    folder = Path(dataset_dir)
    if (path := folder / f"{split}.jsonl").is_file():
        return [path]
    shards = (sorted(where.glob(f"{split}-*.parquet")) for where in (folder / "main", folder))
    return next((found for found in shards if found), [])


def read_parquet(files: list[Path]) -> list[dict]:
    """The rows of parquet shards, in order."""
    import pyarrow.parquet

    rows = []
    for path in files:
        try:
            rows += pyarrow.parquet.read_table(path).to_pylist()
        except (OSError, ValueError) as err:  # pyarrow's errors for a cut or damaged file are of these kinds
            raise RecipeError(f"{path}: cannot be read as parquet ({str(err).splitlines()[0][:200]})") from None
    return rows


def load_split(split: str, dataset_dir: str | None, hub_name: str, hub_config: str):
    """(rows, unreadable lines by reason, how row ids read) of GSM8K's `split`: (id, row) from a folder's
    `<split>.jsonl` (ids: line numbers, "<split>.jsonl lines"), its parquet shards or the Hub (ids: row numbers)."""
    from datasets import load_dataset

    if dataset_dir:
        if not (files := split_files(dataset_dir, split)):
            raise RecipeError(
                f"--dataset {dataset_dir}: no {split}.jsonl there, nor the Hub's main/{split}-*.parquet (expected "
                f"GSM8K's train.jsonl / test.jsonl, or the Hub's layout: main/{split}-00000-of-00001.parquet)"
            )
        if files[0].suffix == ".jsonl":
            return (*read_jsonl(files[0]), f"{files[0]} lines")
        return list(enumerate(read_parquet(files))), {}, f"{files[0].parent}/{split}-*.parquet rows"
    try:
        data = load_dataset(hub_name, hub_config, split=split)
    except Exception as err:  # the Hub is unreachable or the data set is not cached
        raise RecipeError(
            f"Could not load {hub_name} ({type(err).__name__}: {str(err)[:200]}).\n"
            "Offline? Use a local copy: --dataset DIR (a folder with train.jsonl and test.jsonl), "
            f"or try the recipe on generated problems: {offline_commands()}"
        ) from None
    return list(enumerate(data)), {}, f"{hub_name} {split} rows"


VALIDATION_SEED = 1234  # one draw whatever the training seed: runs and a search's trials hold out the same rows


def splits(run, load):
    """(train rows, the rows accuracy is measured on): what a run reads (`load`, the recipe's `get_gsm8k_questions`),
    decided here alone. Train is read to train, or to hold out `--validation_rows` (measured
    with `--eval_split validation`, so that tuning never reads the test split); test where it is measured, and to keep
    its questions out of training."""
    measures = run.eval_only or run.final_eval or run.eval_every_steps > 0
    test = load("test") if measures and run.eval_split == "test" else None
    reads_train = not run.eval_only or run.eval_split == "validation"
    train, validation = hold_out(load("train") if reads_train else None, run.validation_rows)
    measured = validation if run.eval_split == "validation" else test
    if not run.eval_only:  # the same train rows whatever this run measures: never the test split's or held-out ones
        train = never_measured(train, validation, "validation")
        train = never_measured(train, test if test is not None else readable(load, "test"), "test")
    return train, measured


def readable(load, split: str):
    """`split`'s rows, or None where the data has none (a --dataset folder without test.jsonl)."""
    try:
        return load(split)
    except RecipeError:
        return None


def _text(question: str) -> str:
    return " ".join(question.split()).casefold()


def never_measured(train, measured, split: str):
    """`train` less the rows whose question (spaces and case aside) is also one of `measured`'s: a model is never
    measured on a question it trained on (a train file that repeats a test question, or a row of it twice, one copy
    held out). Said, with how many; refused when nothing is left to train on."""
    if train is None or measured is None:
        return train
    asked = {_text(q) for q in measured["question"]}
    seen = [i for i, q in enumerate(train["question"]) if _text(q) in asked]
    if not seen:
        return train
    if len(seen) == len(train):
        raise RecipeError(
            f"Every train question is also a {split} question: the run would be measured on what it trained on. "
            "Check --dataset (is its train file a copy of the test file?)"
        )
    logger.warning(
        "%d train rows ask a question the %s split measures (rows %s): not trained on, so that no measured question "
        "was trained on", len(seen), split, seen[:20],
    )  # fmt: skip
    dropped = set(seen)
    return train.select([i for i in range(len(train)) if i not in dropped])


def hold_out(train, n: int):
    """(`train` less `n` rows, those `n` rows): a validation split carved from the training rows by a fixed random
    draw, never trained on, so that tuning never looks at the test split. (train, None) when `n` is 0."""
    if train is None or n <= 0:
        return train, None
    if n >= len(train):
        raise RecipeError(f"validation_rows={n}: the train split has {len(train)} usable rows: hold out fewer")
    order = random.Random(VALIDATION_SEED).sample(range(len(train)), len(train))
    logger.info("Validation: %d of %d train rows held out (seed %d), never trained on", n, len(train), VALIDATION_SEED)
    return train.select(sorted(order[n:])), train.select(sorted(order[:n]))


def report_bad_rows(bad: dict[str, list[int]], kept: int, split: str, named: str, strict: bool) -> None:
    """Say how many rows of `split` were dropped and why, naming them (`named`: how their ids read, e.g.
    "data/train.jsonl lines"); refuse instead with `strict`, or when nothing is left."""
    for reason, ids in bad.items():
        message = f"{len(ids)} {split} rows with {reason} ({named} {ids[:20]}{' ...' if len(ids) > 20 else ''})"
        if strict:
            raise RecipeError(f"Bad data: {message}. Fix the data, or drop such rows: --strict_data false")
        logger.warning("Dropped %s", message)
    if not kept:
        raise RecipeError(f"No usable {split} rows in {named.rsplit(' ', 1)[0]}: every row was dropped (see above)")


def drop_long_prompts(data, tokenizer, max_tokens: int, split: str = "train"):
    """Drop rows whose chat-templated prompt exceeds `max_tokens` (a cut question is unanswerable; a huge one, in
    an evaluation batch, would take memory for its whole length times the batch), and say so."""
    lengths = [
        len(tokenizer.apply_chat_template(p, add_generation_prompt=True, return_dict=False)) for p in data["prompt"]
    ]
    long_rows = [i for i, n in enumerate(lengths) if n > max_tokens]
    span, cut = f"{min(lengths, default=0)}-{max(lengths, default=0)}", f" (rows {long_rows[:20]})" if long_rows else ""
    prompt = "prompt" if split == "train" else f"{split} prompt"
    logger.info(
        "%ss: %d rows, %s tokens; %d over %d tokens dropped%s",
        prompt.capitalize(), len(lengths), span, len(long_rows), max_tokens, cut,
    )  # fmt: skip
    if len(long_rows) == len(lengths):
        what = "nothing to train on" if split == "train" else f"no {split} question to measure"
        raise RecipeError(f"Every {prompt} is over {max_tokens} tokens: {what}. Raise --max_prompt_tokens")
    return data.select([i for i, n in enumerate(lengths) if n <= max_tokens]) if long_rows else data
