"""docs/memory.md: the recipe's memory plan (grpo_kit.checks.memory_estimate, the estimate it stops a run by) for
common models and modes, at the recipe's batch and lengths. Shapes from each model's config.json; nothing is
downloaded or loaded (the parameters are counted on a meta-device skeleton).

    python benchmarks/memory_table.py            # rewrites docs/memory.md
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_kit import checks  # noqa: E402

GPU = 141e9  # one H200 (141 GB): colocated vLLM reserves its share of this
# config.json values that set the memory (Qwen2.5 and Llama 3 families)
MODELS = {
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2", 896, 24, 14, 2, 4864, 151936, True),
    "Qwen/Qwen2.5-1.5B-Instruct": ("qwen2", 1536, 28, 12, 2, 8960, 151936, True),
    "meta-llama/Llama-3.2-1B-Instruct": ("llama", 2048, 16, 32, 8, 8192, 128256, True),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2", 3584, 28, 28, 4, 18944, 152064, False),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama", 4096, 32, 32, 8, 14336, 128256, False),
}
RECIPE = dict(batch=16, generation_batch=64, prompt=256, completion=786, lora_r=16, gpu=GPU)  # grpo_demo's defaults
MODES = {
    "full, 1 GPU": dict(mode="full"),
    "full, 8-bit optimizer": dict(mode="full", optim_8bit=True),
    "full, DDP x 8": dict(mode="full", processes=8),
    "full, ZeRO-2 x 8": dict(mode="full", zero="2", processes=8),
    "full, ZeRO-3 x 8": dict(mode="full", zero="3", processes=8),
    "LoRA": dict(mode="lora"),
    "LoRA + vLLM (0.3)": dict(mode="lora", vllm_share=0.3),
    "QLoRA": dict(mode="qlora"),
}


def shape(values: tuple) -> dict:
    from transformers import AutoConfig

    from grpo_kit.models import shapes_only

    kind, hidden, layers, heads, kv_heads, intermediate, vocab, tied = values
    config = AutoConfig.for_model(
        kind, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, vocab_size=vocab, tie_word_embeddings=tied,
    )  # fmt: skip
    return checks.model_shape(config, shapes_only(config))


def table() -> str:
    header = ["model", "parameters", *MODES]
    lines = [
        "# GPU memory per process, estimated",
        "",
        "Written by `python benchmarks/memory_table.py` from `grpo_kit.checks.memory_estimate`, the estimate the",
        "recipe checks before it loads a model on a GPU: a run whose estimate exceeds its GPU stops in its first",
        "seconds, with the options that fit and their estimates. GiB per process at the recipe's batch (16 completions",
        "per micro-batch, 64 per generation), 256 prompt and 786 completion tokens, LoRA r 16; vLLM colocated with 0.3",
        "of a 141 GB GPU; beta 0 (the recipe's: no reference model). Rough by design (within ~20 %); not measured on",
        "a GPU (benchmarks/gpu_check.py's full-786 sets its torch peak beside the plan). A cell over the GPU's memory",
        "is refused.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    for name, values in MODELS.items():
        dims = shape(values)
        cells = [name, f"{dims['parameters'] / 1e9:.2f} B"]
        for plan in MODES.values():
            cells.append(f"{sum(checks.memory_estimate(dims, {**RECIPE, **plan}).values()) / 2**30:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    (ROOT / "docs" / "memory.md").write_text(table(), encoding="utf-8")
    print(table())
