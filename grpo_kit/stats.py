"""The statistics behind an accuracy number: its 95 % interval, pass@k and maj@k, and whether a change is chance.

- `wilson`: the Wilson score interval of a proportion (Newcombe 1998, method 3); unlike the normal approximation it
  stays inside [0, 1] and is honest at 0 % or 100 % and at small n.
- `mean_interval`: a normal-approximation interval of a mean of per-question values in [0, 1] (pass@k).
- `pass_at_k`: the unbiased estimator of Chen et al. (2021): 1 - C(n - c, k) / C(n, k) from n samples, c correct.
- `majority`: the answer most samples commit to; a tie goes to the tied answer seen first (sample order).
- `mcnemar_exact`: the exact (binomial) McNemar test on paired verdicts: of the questions that changed, are the
  gains and losses more lopsided than a fair coin would make them?
"""

from __future__ import annotations

import math
from collections import Counter

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: two-sided 95 %
ALPHA = 0.05  # a change is called larger than chance when the paired test's p-value is below this


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of successes / n; (0.0, 1.0) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: list[float], z: float = Z95) -> tuple[float, float]:
    """A normal-approximation interval of the mean of `values` (each in [0, 1]), clipped to [0, 1]."""
    n = len(values)
    if n == 0:
        return 0.0, 1.0
    mean = sum(values) / n
    if n == 1:
        return 0.0, 1.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = z * sd / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n (c of them correct) is correct."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... up to n, and n itself."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n}) if n > 0 else []


def majority(answers: list) -> object | None:
    """The answer most of `answers` commit to (None entries do not vote); a tie goes to the tied answer that comes
    first in `answers`; None when none commits."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == top)


def binomial_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided p-value of the exact McNemar test: `gained` questions wrong before and right after, `lost` the
    reverse; 1.0 when none changed."""
    changed = gained + lost
    if changed == 0:
        return 1.0
    return min(1.0, 2 * binomial_cdf(min(gained, lost), changed))


def paired(before: list[bool], after: list[bool]) -> dict:
    """The paired comparison of two verdict lists over the same questions: which flipped each way, the exact
    McNemar p-value, and a one-line verdict."""
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
