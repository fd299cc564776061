"""Batched, left-padded GSM8K evaluation against one question at a time: the speed-up, and identical completions.

    python benchmarks/eval_batching.py                      # 64 generated questions, 64 new tokens, batch 32
    python benchmarks/eval_batching.py --questions 128 --max_new_tokens 32

Offline, on CPU: a tiny random Qwen2 model (hidden 128, 4 layers) and generated GSM8K-format problems. Greedy
decoding makes the two runs' completions comparable token for token; the target is a speed-up of 8x or more.
Exits 1 when the completions differ or the speed-up misses the target.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: grpo_demo is at the repo root

import grpo_demo  # noqa: E402
from grpo_kit import evaluation, smoke  # noqa: E402

TARGET_SPEEDUP = 8.0


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    # One thread by default: on a small shared CPU, torch's worker threads spin against other processes and the
    # timings swing tenfold between runs; batching is what is measured here, not thread scheduling.
    torch.set_num_threads(args.threads)

    fmt = grpo_demo.ANSWER_FORMAT
    tokenizer = smoke.build_tokenizer(smoke.corpus(fmt, smoke.make_problems(256)), fmt.tags)
    model = smoke.build_tiny_model(tokenizer, hidden_size=128, num_layers=4)
    with tempfile.TemporaryDirectory() as folder:
        smoke.write_gsm8k_folder(folder, n_train=1, n_test=args.questions)
        rows = grpo_demo.get_gsm8k_questions("test", folder)

    def run(batch_size: int):
        return evaluation.evaluate(
            model, tokenizer, rows, fmt, max_new_tokens=args.max_new_tokens, batch_size=batch_size, model_name="tiny"
        )

    run(args.batch_size)  # warm-up: one-time initialisation is not what is measured
    (batched, batched_records), (single, single_records) = run(args.batch_size), run(1)
    identical = [r["completion"] for r in batched_records] == [r["completion"] for r in single_records]
    speedup = single["seconds"] / batched["seconds"]

    print(
        f"\n{len(rows)} questions, max_new_tokens {args.max_new_tokens}, tiny Qwen2 (hidden 128, 4 layers), "
        f"CPU threads: {torch.get_num_threads()}\n"
    )
    print("| generation | batch size | seconds | questions/s | mean completion tokens |")
    print("| --- | --- | --- | --- | --- |")
    for name, summary, size in (("batched", batched, args.batch_size), ("one at a time", single, 1)):
        print(
            f"| {name} | {size} | {summary['seconds']:.2f} | {summary['questions_per_second']:.1f} "
            f"| {summary['mean_completion_tokens']:.1f} |"
        )
    verdict = "yes" if identical else "no"
    print(f"\nspeed-up: {speedup:.1f}x (target {TARGET_SPEEDUP:.0f}x); identical completions: {verdict}")
    if not identical or speedup < TARGET_SPEEDUP:
        sys.exit(1)


if __name__ == "__main__":
    main()
