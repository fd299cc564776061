"""Per decoded token, the cost of a rollout with fp32 weights under bf16 mixed precision: accelerate's per-forward
autocast (each forward's exit clears torch's cast cache, so every token re-casts every weight) against the recipe's
one autocast around the whole `generate` (grpo_kit.patches.cast_once_per_generation: each weight cast once). Side by
side in one run, on this machine's CPU (bf16 autocast runs there); a ratio, not a GPU figure.

    OMP_NUM_THREADS=1 python benchmarks/rollout_casts.py [--hidden 1024 --layers 8 --tokens 32 --repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from transformers import Qwen2Config, Qwen2ForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64, num_key_value_heads=2, vocab_size=8192,
    )  # fmt: skip
    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    model = accelerator.prepare_model(Qwen2ForCausalLM(config).eval())  # fp32 weights, forward wrapped in autocast
    ids = torch.randint(0, 8192, (4, 16))
    settings = dict(do_sample=False, min_new_tokens=args.tokens, max_new_tokens=args.tokens)

    def per_forward():
        return model.generate(ids, **settings)

    def one_autocast():
        with accelerator.autocast():
            return model.generate(ids, **settings)

    times = {"per-forward autocast": [], "one autocast per generate": []}
    with torch.no_grad():
        one_autocast()  # warm-up
        for _ in range(args.repeats):  # interleaved, so that both see the same machine
            for name, run in zip(times, (per_forward, one_autocast), strict=True):
                start = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - start) / args.tokens)
    best = {name: min(values) for name, values in times.items()}
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{parameters:.0f} M fp32 parameters, batch 4, {args.tokens} tokens, best of {args.repeats}:")
    for name, seconds in best.items():
        print(f"  {name}: {seconds * 1000:.1f} ms per token")
    print(f"  ratio: {best['per-forward autocast'] / best['one autocast per generate']:.2f}x")


if __name__ == "__main__":
    main()
