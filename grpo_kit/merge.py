"""Merge a trained LoRA adapter into its base model: a standalone model folder that loads without peft.

    python -m grpo_kit.merge --adapter outputs/Qwen-1.5B-GRPO --output outputs/Qwen-1.5B-GRPO-merged
    python -m grpo_kit.merge --adapter outputs/Qwen-1.5B-GRPO/checkpoint-500 --output merged-500 --base ./qwen-local

The base model is the one named in the adapter's adapter_config.json (`base_model_name_or_path`) unless `--base`
names another copy of it. It is always reloaded unquantized, bf16 on a CUDA machine and fp32 without one: an
adapter trained on a 4-bit base (QLoRA, `--load_in_4bit`) merges into full-precision weights, because adding a
small LoRA update to 4-bit weights would round most of it away and leave a model that loads only with
bitsandbytes. The merged folder holds the model and the run's tokenizer and serves anywhere (transformers, vLLM).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger("grpo_demo")

DTYPES = ("auto", "bfloat16", "float16", "float32")


def default_dtype() -> str:
    """bf16 where the merged model will run on a GPU; fp32 on a CPU-only machine (as the recipe trains there)."""
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def read_adapter_config(adapter: str | Path) -> dict:
    """The adapter's adapter_config.json; a message naming what the folder is instead when it holds none."""
    adapter = Path(adapter)
    config = adapter / "adapter_config.json"
    if not config.is_file():
        if (adapter / "config.json").is_file():
            sys.exit(
                f"--adapter {adapter}: a full model (config.json, no adapter_config.json), already standalone: "
                "nothing to merge. Adapters come from runs with --use_peft."
            )
        sys.exit(f"--adapter {adapter}: no adapter_config.json there (the output_dir of a --use_peft run)")
    return json.loads(config.read_text(encoding="utf-8"))


def merge_adapter(adapter: str | Path, output: str | Path, base: str | None = None, dtype: str | None = None) -> Path:
    """Load `base` (default: the adapter's own base) unquantized in `dtype`, add the adapter, merge, save to `output`.

    Returns the output folder, which holds the merged model and a tokenizer (the run's, else the base's).
    """
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    adapter, output = Path(adapter), Path(output)
    config = read_adapter_config(adapter)
    base = base or config.get("base_model_name_or_path")
    if not base:
        sys.exit(f"{adapter / 'adapter_config.json'} names no base model: give it with --base MODEL")
    if output.resolve() == adapter.resolve():
        sys.exit("--output must be another folder than --adapter (the adapter would be overwritten)")
    dtype = dtype or default_dtype()

    if base.startswith((".", "/", "~")) and not Path(base).expanduser().is_dir():
        sys.exit(f"The base model {base!r}: no such folder. Give the base the adapter was trained on with --base")
    try:
        base_config = AutoConfig.from_pretrained(base)
    except OSError as err:  # not on disk, not cached, Hub unreachable
        sys.exit(
            f"Could not load the base model {base!r} ({str(err).splitlines()[0][:200]}). "
            "Offline? Point --base at a local copy of it."
        )
    if getattr(base_config, "quantization_config", None):
        sys.exit(
            f"The base {base!r} is a quantized checkpoint: a merge needs full-precision weights. "
            "Give the original model with --base (e.g. Qwen/Qwen2.5-1.5B-Instruct, not a 4-bit copy of it)."
        )
    logger.info("Loading base %s in %s (never quantized)", base, dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    model = PeftModel.from_pretrained(model, str(adapter))
    merged = model.merge_and_unload()

    tokenizer_source = adapter if (adapter / "tokenizer_config.json").is_file() else base
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    output.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(output)
    tokenizer.save_pretrained(output)
    logger.info("Merged %s into %s: saved to %s", adapter, base, output)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", required=True, help="The run's output_dir, or one of its checkpoint-N folders")
    parser.add_argument("--output", required=True, help="Folder for the merged model and tokenizer")
    parser.add_argument("--base", help="The base model (Hub id or folder); default: the adapter's own")
    parser.add_argument(
        "--dtype", choices=DTYPES, help="Weights' dtype; default: bfloat16 with CUDA, float32 without; auto: the base's"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    merge_adapter(args.adapter, args.output, args.base, args.dtype)


if __name__ == "__main__":
    main()
