"""n samples per question from one prefill of its prompt, against the same n samples from n separate copies of it.

    python benchmarks/shared_prefill.py --data ../shared/data/gsm8k             # real GSM8K test prompts
    python benchmarks/shared_prefill.py --data ../shared/data/gsm8k --samples 16 --questions 16

On CPU, one thread, side by side in one process: a tiny random Qwen2 (hidden 128, 4 layers) with a tokenizer trained
on GSM8K's train text, the first `--questions` test questions in the recipe protocol (system prompt + question) and
8-shot prompts (the first 8 worked train solutions as earlier turns before the question: long prompts, where a
shared prefill matters most). Both ways are `grpo_kit.generation.generate_samples`: of each prompt with n samples
(one prefill), and of each prompt copied n times with one sample each (n prefills), in the same batches and from
the same seed, so they draw the same tokens and the ratio is the prefill's share; the script checks that they do,
and that at a temperature near 0 both write the greedy completions (`generate_greedy`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: grpo_demo is at the repo root

import grpo_demo  # noqa: E402
from grpo_kit import generation, scoring, smoke  # noqa: E402


def shared(model, tokenizer, prompts, samples, temperature, max_new_tokens, batch_size) -> list[str]:
    """`samples` completions of each prompt from one prefill of it, seed 0 (`generation.generate_samples`)."""
    drawn = generation.generate_samples(
        model, tokenizer, prompts, samples, temperature, max_new_tokens, batch_size, 0, progress=False
    )
    return [g.text for own in drawn for g in own]


def separately(model, tokenizer, prompts, samples, temperature, max_new_tokens, batch_size) -> list[str]:
    """The same samples without a shared prefill: each prompt copied `samples` times, every copy prefilled alone for
    its one sample, in the shared way's batches (the copies of batch_size // samples prompts each)."""
    copies = [prompt for prompt in prompts for _ in range(samples)]
    return shared(model, tokenizer, copies, 1, temperature, max_new_tokens, max(1, batch_size // samples) * samples)


def user_and_assistant(question: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a folder with GSM8K's train.jsonl and test.jsonl")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=64, help="completions generated together")
    args = parser.parse_args()
    torch.set_num_threads(1)  # on a small shared CPU, threads spin against other processes: timings swing tenfold

    fmt = grpo_demo.ANSWER_FORMAT
    train = grpo_demo.get_gsm8k_questions("train", args.data)
    test = list(grpo_demo.get_gsm8k_questions("test", args.data))[: args.questions]
    corpus = [f"{row['question']}\n{row['solution']}" for row in train.select(range(2000))]
    tokenizer = smoke.build_tokenizer(smoke.corpus(fmt, []) + corpus, fmt.tags, vocab_size=2000)
    model = smoke.build_tiny_model(tokenizer, hidden_size=128, num_layers=4).eval()
    shots = [m for row in train.select(range(8)) for m in user_and_assistant(row["question"], row["solution"])]
    recipe = scoring.build_protocol("recipe", fmt).prompt
    ways = {"recipe": recipe, "8-shot": lambda question: [*shots, {"role": "user", "content": question}]}

    results = []
    for name, prompt in ways.items():
        prompts = [prompt(row["question"]) for row in test]
        lengths = [len(ids) for ids in generation.prompt_ids(tokenizer, prompts)]
        greedy = generation.generate_greedy(model, tokenizer, prompts, 8, args.batch_size, progress=False)
        cold = shared(model, tokenizer, prompts, 2, 1e-6, 8, args.batch_size)  # temperature ~0: greedy, twice
        agree = cold == [g.text for g in greedy for _ in range(2)]
        hot = (model, tokenizer, prompts, args.samples, 1.0, args.max_new_tokens, args.batch_size)
        seconds, drawn = {}, {}
        for way, run in (("separate", separately), ("shared", shared), ("separate", separately), ("shared", shared)):
            started = time.perf_counter()
            drawn[way] = run(*hot)
            seconds.setdefault(way, []).append(time.perf_counter() - started)
        best = {way: min(times) for way, times in seconds.items()}  # the second pass of each: nothing to warm up
        results.append(
            {
                "protocol": name,
                "mean_prompt_tokens": sum(lengths) / len(lengths),
                "separate_s": round(best["separate"], 2),
                "shared_s": round(best["shared"], 2),
                "speedup": round(best["separate"] / best["shared"], 2),
                "greedy_agree": agree,
                "same_samples": drawn["separate"] == drawn["shared"],
            }
        )

    print(
        f"\n{args.questions} GSM8K test questions x {args.samples} samples, {args.max_new_tokens} new tokens each, "
        f"{args.batch_size} completions per batch; tiny Qwen2 (hidden 128, 4 layers), 1 CPU thread\n"
    )
    print(
        "| protocol | mean prompt tokens | n separate prompts (s) | one prefill (s) | speed-up | cold: greedy |", end=""
    )
    print(" same samples |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['protocol']} | {r['mean_prompt_tokens']:.0f} | {r['separate_s']} | {r['shared_s']} | "
            f"{r['speedup']}x | {'yes' if r['greedy_agree'] else 'no'} | {'yes' if r['same_samples'] else 'no'} |"
        )
    print(json.dumps(results))
    if not all(r["greedy_agree"] and r["same_samples"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
