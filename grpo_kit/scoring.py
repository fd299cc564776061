"""The verdicts on one completion and the rates over many: what an accuracy number is made of.

Two verdicts per question, as others report them:
- strict: the number the last answer block commits to equals the gold answer (what the recipe's correctness
  reward pays for);
- lenient: the last number anywhere in the completion equals the gold answer (format ignored).
Both read numbers with `grpo_kit.numbers`, and the answer block and format checks are the recipe's own (its
`AnswerFormat`), so a completion scores here as it is rewarded in training.
"""

from __future__ import annotations

from grpo_kit.numbers import answer_number, last_number, parse_number


def score(completion: str, gold: str, answer_format) -> dict:
    """The extracted answers and verdicts of one completion against a canonical gold answer (`1080`).

    `answer_strict` is the last answer block's content (None without one), `answer_lenient` the last number in the
    completion (None without one); `format_strict` / `format_soft` are the recipe's format checks.
    """
    gold_number = parse_number(gold)
    block = answer_format.extract_answer(completion) or None
    number = last_number(completion)
    gradable = gold_number is not None  # no answer equals an unparsable gold (the recipe drops those rows)
    return {
        "answer_strict": block,
        "answer_lenient": number,
        "correct_strict": gradable and block is not None and answer_number(block) == gold_number,
        "correct_lenient": gradable and number is not None and parse_number(number) == gold_number,
        "format_strict": answer_format.is_strict_format(completion),
        "format_soft": answer_format.is_soft_format(completion),
    }


def summarize(records: list[dict]) -> dict:
    """Rates and counts over scored records (`score`'s fields plus `completion_tokens` and `truncated`)."""
    n = len(records)

    def rate(key: str) -> float:
        return sum(r[key] for r in records) / n if n else 0.0

    return {
        "n": n,
        "accuracy_strict": rate("correct_strict"),
        "accuracy_lenient": rate("correct_lenient"),
        "format_rate": rate("format_strict"),
        "soft_format_rate": rate("format_soft"),
        "mean_completion_tokens": rate("completion_tokens"),
        "truncated": sum(r["truncated"] for r in records),
    }
