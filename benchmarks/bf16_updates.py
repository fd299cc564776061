"""How much of AdamW's intended movement survives in each way of storing the weights, at the recipe's settings.

    python benchmarks/bf16_updates.py                 # 200k weights from N(0, 0.02), 10 steps at lr 5e-6
    python benchmarks/bf16_updates.py --steps 50 --lr 1e-6

The same gradients (seeded) drive AdamW (betas 0.9/0.99, weight decay 0.1, the recipe's) on copies of the same
weights stored as:
- fp32: the reference (what fp32 master weights with bf16 autocast compute do: the optimizer sees fp32 weights);
- bf16, torch AdamW in place: what transformers' Trainer does with a model loaded in bf16 without DeepSpeed;
- bf16 with Kahan summation (torch-optimi's AdamW, if installed: `pip install torch-optimi`), the memory-saving
  alternative: compensation buffers carry what rounding drops.
Reports the share of weights that moved at all, the mean |dw| against fp32's, the error against fp32's movement,
and the bytes each parameter costs (weights + gradient + optimizer state). CPU only; seconds.
"""

from __future__ import annotations

import argparse
import importlib.util


def run(dtype, optimizer_factory, weights, grads, lr: float):
    import torch

    param = torch.nn.Parameter(weights.clone().to(dtype))
    optimizer = optimizer_factory([param], lr)
    for grad in grads:
        param.grad = grad.to(dtype)
        optimizer.step()
        optimizer.zero_grad()
    return param.detach().float()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=5e-6)
    args = parser.parse_args()
    torch.manual_seed(0)
    weights = torch.randn(args.weights) * 0.02
    grads = [torch.randn(args.weights) * 1e-3 for _ in range(args.steps)]
    adam = dict(betas=(0.9, 0.99), weight_decay=0.1)

    def torch_adamw(params, lr):
        return torch.optim.AdamW(params, lr=lr, foreach=False, **adam)

    variants = {
        "fp32 weights (fp32 master, bf16 compute)": (torch.float32, torch_adamw, 4 + 4 + 8),
        "bf16 weights, AdamW in place": (torch.bfloat16, torch_adamw, 2 + 2 + 4),
    }
    if importlib.util.find_spec("optimi"):
        import optimi

        def kahan(params, lr):
            return optimi.AdamW(params, lr=lr, kahan_sum=True, foreach=False, **adam)

        variants["bf16 weights, AdamW + Kahan summation (optimi)"] = (torch.bfloat16, kahan, 2 + 2 + 4 + 2)

    reference = run(torch.float32, torch_adamw, weights, grads, args.lr) - weights
    start = {dtype: weights.to(dtype).float() for dtype in (torch.float32, torch.bfloat16)}
    print(
        f"AdamW, {args.weights:,} weights from N(0, 0.02), {args.steps} steps at lr {args.lr:g}, "
        "betas 0.9/0.99, weight decay 0.1\n"
    )
    print("| weights | moved | mean abs(dw) | of fp32's movement | error vs fp32 (mean abs) | bytes / parameter |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (dtype, factory, nbytes) in variants.items():
        moved = run(dtype, factory, weights, grads, args.lr) - start[dtype]
        share = (moved != 0).float().mean().item()
        mean = moved.abs().mean().item()
        error = (moved - reference).abs().mean().item()
        ratio = mean / reference.abs().mean().item()
        print(f"| {name} | {share:.1%} | {mean:.2e} | {ratio:.2f} | {error:.2e} | {nbytes} |")
    if not importlib.util.find_spec("optimi"):
        print("\n(torch-optimi is not installed: the Kahan-summation row is left out)")


if __name__ == "__main__":
    main()
