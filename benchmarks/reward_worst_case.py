"""The five rewards on adversarial 1 MB completions: milliseconds per call, against a 50 ms target.

    python benchmarks/reward_worst_case.py

A reward runs on every completion of every step, so a pattern that makes one backtrack (nested tags, runs of
digits, separators) must not stall training. Each shape is scored 3 times and the best time is kept (a busy
machine adds noise, not cost). Exits 1 when a reward misses the target. The shapes are
tests/adversarial_completions.py's; tests/test_rewards.py checks the rewards' values on them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from adversarial_completions import ADVERSARIAL  # noqa: E402  (the shapes, shared with tests/test_rewards.py)

TARGET_MS = 50.0


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
