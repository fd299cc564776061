"""How an answer is read and counted: the evaluation protocols, the verdicts on one completion, the rates over many
with their 95 % intervals, pass@k and maj@k, and the paired test of a change.

Protocols (how a question is put; strict, lenient: where the answer is read): `recipe`, the recipe's system prompt;
the number in its answer block (what the correctness reward pays), the last number. `chat`, the question alone; the
last `\\boxed{}`, that where it holds a number, else the last number; no system message (a template's default one is
added, as for any user). Numbers are read with `grpo_kit.numbers` and the format checks are the recipe's own, so a
completion scores here as it is rewarded. lm-evaluation-harness's own tasks are run by lm-eval: `grpo_kit.harness`.

Statistics: `wilson` is the Wilson score interval (Newcombe 1998, method 3: inside [0, 1], honest at 0 % and at
small n); pass@k is the unbiased estimator of Chen et al. (2021), its interval Wilson's of the mean (conservative)."""

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from grpo_kit.numbers import answer_number, last_number, parse_number

PROTOCOLS = ("recipe", "chat")  # the recipe's own; lm-eval's tasks: harness.PROTOCOLS
BOXED = "\\boxed{"
Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: two-sided 95 %
ALPHA = 0.05  # a change is called larger than chance when the paired test's p-value is below this


def fingerprint(pairs) -> str:
    """sha256 over (question or prompt, gold answer) pairs, in order: the one fingerprint of rows. An evaluation's
    questions (two evaluations compare only on the same) and a run's training rows (a resume trains on its start's).

    >>> fingerprint([("What is 2 + 2?", "4")])[:12]
    '21511af1b8fc'
    """
    digest = hashlib.sha256()
    for question, answer in pairs:
        digest.update(json.dumps([question, answer], sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def questions_fingerprint(rows) -> str:
    """`fingerprint` of evaluated rows ({"question", "answer"})."""
    return fingerprint((row["question"], row["answer"]) for row in rows)


def data_fingerprint(dataset) -> str:
    """`fingerprint` of the training rows as the trainer sees them (prompt and gold answer)."""
    return fingerprint(zip(dataset["prompt"], dataset["answer"], strict=True))


@dataclass(frozen=True)
class Protocol:
    name: str
    prompt: Callable[[str], list[dict]]  # question -> the messages the model answers
    strict: Callable[[str], str | None]  # completion -> the answer it commits to in this protocol's form
    lenient: Callable[[str], str | None]  # completion -> the answer read more leniently (the last number...)
    judges_format: bool  # whether the recipe's format checks mean anything here


def boxed(completion: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces inside balanced), None without a closed one."""
    if (start := completion.rfind(BOXED)) < 0:
        return None
    depth, i = 1, start + len(BOXED)
    for j in range(i, len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[j], 0)
        if depth == 0:
            return completion[i:j].strip()
    return None


def boxed_or_last_number(completion: str) -> str | None:
    box = boxed(completion)
    return box if box is not None and answer_number(box) is not None else last_number(completion)


def _asked(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def build_protocol(name: str, answer_format):
    if name == "recipe":
        strict = lambda c: answer_format.extract_answer(c) or None  # noqa: E731
        return Protocol("recipe", answer_format.chat_prompt, strict, last_number, True)
    if name == "chat":
        return Protocol("chat", _asked, boxed, boxed_or_last_number, False)
    raise ValueError(f"no evaluation protocol {name!r}: one of {', '.join(PROTOCOLS)}")


def score(completion: str, gold: str, answer_format, protocol=None) -> dict:
    """The answers one completion commits to under `protocol` (default: the recipe's) and whether each equals the
    gold answer (`1080`); the recipe's format checks, None under a protocol that does not ask for the format."""
    protocol = protocol or build_protocol("recipe", answer_format)
    gold = parse_number(gold)  # no answer equals an unparsable gold (the recipe drops those rows)
    strict, lenient = protocol.strict(completion), protocol.lenient(completion)
    return {
        "answer_strict": strict,
        "answer_lenient": lenient,
        "correct_strict": gold is not None and strict is not None and answer_number(strict) == gold,
        "correct_lenient": gold is not None and lenient is not None and answer_number(lenient) == gold,
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
        "truncated": None if any(r["truncated"] is None for r in records) else sum(r["truncated"] for r in records),
    }


def summarize_samples(records: list[dict], samples: int, temperature: float) -> dict:
    """pass@k (unbiased, from all `samples` of a question) and maj@k (the majority of the first k samples' numbers)
    for k = 1, 2, 4, ... `samples`, strict and lenient, each with its 95 % interval; records carry `samples`."""
    out = {"samples": samples, "temperature": temperature}
    for verdict in ("strict", "lenient"):
        out[verdict] = {}
        for k in ks_for(samples):
            passed = [pass_at_k(samples, sum(s[f"correct_{verdict}"] for s in r["samples"]), k) for r in records]
            voted = [_voted(r, verdict, k) for r in records]
            for metric, values in ((f"pass@{k}", passed), (f"maj@{k}", voted)):
                mean = sum(values) / len(values) if values else 0.0
                out[verdict][metric] = {"value": mean, "interval": list(wilson(sum(values), len(values)))}
    return out


def _voted(record: dict, verdict: str, k: int) -> bool:
    """Whether the majority of the first k samples' numbers is the gold answer."""
    numbers = [answer_number(a) if (a := s[f"answer_{verdict}"]) else None for s in record["samples"][:k]]
    gold = parse_number(record["gold"])
    return gold is not None and majority(numbers) == gold


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of successes / n (a sum of values in [0, 1] for a mean); (0.0, 1.0) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, successes / n))  # a mean of floats may stray past 1 by a rounding error
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(max(0.0, centre - half), 12), round(min(1.0, centre + half), 12)  # no 7e-18 for a bound of 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n (c of them correct) is correct."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    return 1.0 if n - c < k else 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... up to n, and n itself."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n}) if n > 0 else []


def majority(answers: list) -> object | None:
    """The answer most of `answers` commit to (None does not vote); a tie goes to the tied answer that comes first."""
    votes = Counter(a for a in answers if a is not None)
    top = max(votes.values(), default=0)
    return next((a for a in answers if a is not None and votes[a] == top), None)


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided p-value of the exact McNemar test: `gained` questions wrong before and right after, `lost` the
    reverse (X ~ Binomial(gained + lost, 1/2)); 1.0 when none changed."""
    changed = gained + lost  # none: 2 x P(X <= 0) = 2, so 1.0
    return min(1.0, 2 * sum(math.comb(changed, i) for i in range(min(gained, lost) + 1)) / 2**changed)


def paired(before: list[bool], after: list[bool]) -> dict:
    """Two verdict lists over the same questions: which flipped each way, the exact McNemar p-value, a verdict."""
    if len(before) != len(after):
        raise ValueError(f"paired verdicts need the same questions ({len(before)} vs {len(after)})")
    gained = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a and not b]
    lost = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b and not a]
    p = mcnemar_exact(len(gained), len(lost))
    if not gained and not lost:
        verdict = "no question changed"
    elif p < ALPHA:
        verdict = f"{'a rise' if len(gained) > len(lost) else 'a fall'} larger than chance (p < {ALPHA})"
    else:
        verdict = f"within chance (p >= {ALPHA})"
    return {"gained": gained, "lost": lost, "p_value": p, "verdict": verdict}
