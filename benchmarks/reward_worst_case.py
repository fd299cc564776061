"""The five rewards on adversarial 1 MB completions: milliseconds per call, against a 50 ms target.

    python benchmarks/reward_worst_case.py

A reward runs on every completion of every step, so a pattern that makes one backtrack (nested tags, runs of
digits, separators) must not stall training. Each shape is scored 3 times and the best time is kept (a busy
machine adds noise, not cost). Exits 1 when a reward misses the target. tests/test_rewards.py checks the same
shapes for their values.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 2**20
TARGET_MS = 50.0
_GOOD = "<reasoning>\nSome steps.\n</reasoning>\n<answer>\n18\n</answer>\n"

ADVERSARIAL = {
    "digits": "1" * MB,
    "digits in the answer block, then junk": "<answer>" + "1" * MB + "x</answer>",
    "separated digits in the answer block": "<answer>" + "1,111" * (MB // 5) + ",1</answer>",
    "repeated '1 '": "1 " * (MB // 2),
    "repeated '1 ' in the answer block": "<answer>\n" + "1 " * (MB // 2) + "\n</answer>",
    "repeated formatted completions": _GOOD * (MB // len(_GOOD)),
    "repeated opening answer tags": "<answer>" * (MB // 8) + "</answer>",
    "repeated closing answer tags": "\n</answer>" * (MB // 10),
    "repeated reasoning blocks": "<reasoning></reasoning>" * (MB // 23),
    "whitespace after an open tag": "<reasoning>" + " " * MB,
    "huge format, no newlines": "<reasoning>" + "a" * MB + "</reasoning><answer>" + "1" * MB + "</answer>",
    "huge strict format": f"<reasoning>\n{'a' * MB}\n</reasoning>\n<answer>\n{'1' * MB}\n</answer>\n",
    "nested boxes": "<answer>" + "\\boxed{" * (MB // 7) + "</answer>",
    "newlines": "\n" * MB,
    "binary junk": bytes(range(256)).decode("latin-1") * (MB // 256),
}


def main() -> None:
    import grpo_demo

    print(f"| completion (about 1 MB) | slowest reward | ms (best of 3; target < {TARGET_MS:.0f}) |")
    print("| --- | --- | --- |")
    worst = 0.0
    for shape, text in ADVERSARIAL.items():
        completions = [[{"role": "assistant", "content": text}]]
        times = {}
        for func in grpo_demo.REWARD_FUNCS:
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                func(prompts=[[]], completions=completions, answer=["1"])
                best = min(best, time.perf_counter() - start)
            times[func.__name__] = 1e3 * best
        name, ms = max(times.items(), key=lambda item: item[1])
        worst = max(worst, ms)
        print(f"| {shape} | {name} | {ms:.1f} |")
    print(f"\nslowest: {worst:.1f} ms")
    if worst >= TARGET_MS:
        sys.exit(1)


if __name__ == "__main__":
    main()
