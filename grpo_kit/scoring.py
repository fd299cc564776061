"""The verdicts on one completion and the rates over many: what an accuracy number is made of.

Two verdicts per question, as others report them; under the recipe's protocol:
- strict: the number the last answer block commits to equals the gold answer (what the recipe's correctness
  reward pays for);
- lenient: the last number anywhere in the completion equals the gold answer (format ignored).
Other protocols read their own forms (`grpo_kit.protocols`: `#### N`, `\\boxed{}`). Numbers are read with
`grpo_kit.numbers`, and the answer block and format checks are the recipe's own (its `AnswerFormat`), so a
completion scores here as it is rewarded in training. Every rate carries its 95 % interval (`grpo_kit.stats`);
with several samples per question, pass@k and maj@k (`summarize_samples`).
"""

from __future__ import annotations

from grpo_kit.numbers import answer_number, parse_number
from grpo_kit.stats import ks_for, majority, mean_interval, pass_at_k, wilson


def score(completion: str, gold: str, answer_format, protocol=None) -> dict:
    """The extracted answers and verdicts of one completion against a canonical gold answer (`1080`).

    `protocol` (`grpo_kit.protocols`, default: the recipe's) says where the answer is read: `answer_strict` is what
    the completion commits to in the protocol's form (the recipe's answer block, `#### N`, `\\boxed{}`), None
    without it; `answer_lenient` the lenient reading (the last number). `format_strict` / `format_soft` are the
    recipe's format checks, None under a protocol that does not ask for the format.
    """
    if protocol is None:
        from grpo_kit.protocols import build

        protocol = build("recipe", answer_format)
    gold_number = parse_number(gold)
    strict, lenient = protocol.strict(completion), protocol.lenient(completion)
    gradable = gold_number is not None  # no answer equals an unparsable gold (the recipe drops those rows)
    return {
        "answer_strict": strict,
        "answer_lenient": lenient,
        "correct_strict": gradable and strict is not None and answer_number(strict) == gold_number,
        "correct_lenient": gradable and lenient is not None and answer_number(lenient) == gold_number,
        "format_strict": answer_format.is_strict_format(completion) if protocol.judges_format else None,
        "format_soft": answer_format.is_soft_format(completion) if protocol.judges_format else None,
    }


def summarize(records: list[dict]) -> dict:
    """Rates and counts over scored records (`score`'s fields plus `completion_tokens` and `truncated`)."""
    n = len(records)

    def rate(key: str) -> float | None:
        if any(r[key] is None for r in records):
            return None  # not measured under this protocol
        return sum(r[key] for r in records) / n if n else 0.0

    return {
        "n": n,
        "accuracy_strict": rate("correct_strict"),
        "accuracy_lenient": rate("correct_lenient"),
        "interval_strict": list(wilson(sum(r["correct_strict"] for r in records), n)),  # 95 %
        "interval_lenient": list(wilson(sum(r["correct_lenient"] for r in records), n)),
        "format_rate": rate("format_strict"),
        "soft_format_rate": rate("format_soft"),
        "mean_completion_tokens": rate("completion_tokens"),
        "truncated": sum(r["truncated"] for r in records),
    }


def summarize_samples(records: list[dict], samples: int, temperature: float) -> dict:
    """pass@k (unbiased, from all `samples` of a question) and maj@k (the majority of the first k samples' numbers,
    a tie going to the one sampled first) for k = 1, 2, 4, ... `samples`, strict and lenient, each with its 95 %
    interval; records carry `samples`, a list of scored samples."""
    out = {"samples": samples, "temperature": temperature}
    for verdict in ("strict", "lenient"):
        metrics = {}
        for k in ks_for(samples):
            passed = [pass_at_k(samples, sum(s[f"correct_{verdict}"] for s in r["samples"]), k) for r in records]
            metrics[f"pass@{k}"] = {"value": _mean(passed), "interval": list(mean_interval(passed))}
            voted = [_voted(r, verdict, k) for r in records]
            metrics[f"maj@{k}"] = {"value": _mean(voted), "interval": list(wilson(sum(voted), len(voted)))}
        out[verdict] = metrics
    return out


def _mean(values) -> float:
    return sum(values) / len(values) if values else 0.0


def _voted(record: dict, verdict: str, k: int) -> bool:
    """Whether the majority of the first k samples' numbers is the gold answer."""
    numbers = [answer_number(s[f"answer_{verdict}"]) if s[f"answer_{verdict}"] else None for s in record["samples"][:k]]
    gold = parse_number(record["gold"])
    return gold is not None and majority(numbers) == gold
