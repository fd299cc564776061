"""Merge a trained LoRA adapter into its base model: a standalone model folder that loads without peft.

    python -m grpo_kit.merge --adapter outputs/Qwen-1.5B-GRPO --output outputs/Qwen-1.5B-GRPO-merged
    python -m grpo_kit.merge --adapter outputs/Qwen-1.5B-GRPO/checkpoint-500 --output merged-500 --base ./qwen-local

The base (adapter_config.json's, or `--base`) is always reloaded unquantized: a small LoRA update added to 4-bit
weights would mostly round away, and leave a model that loads only with bitsandbytes."""

import argparse
import json
import logging
import sys
from pathlib import Path

from grpo_kit import RecipeError

logger = logging.getLogger("grpo_demo")

DTYPES = ("auto", "bfloat16", "float16", "float32")


def checked_folders(adapter: Path, output: Path, base: str | None) -> str:
    """The base model to merge into (`base`, else the adapter's), once the adapter is one, the output a new folder
    that overwrites neither the base nor the adapter, and a local base is there."""
    if not (config := adapter / "adapter_config.json").is_file():
        if (adapter / "config.json").is_file():
            raise RecipeError(
                f"--adapter {adapter}: a full model (config.json, no adapter_config.json), already standalone: "
                "nothing to merge. Adapters come from runs with --use_peft."
            )
        raise RecipeError(f"--adapter {adapter}: no adapter_config.json there (the output_dir of a --use_peft run)")
    try:
        adapter_config = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RecipeError(f"{config} cannot be read ({err}): copy the adapter's folder again") from None
    base = base or (adapter_config.get("base_model_name_or_path") if isinstance(adapter_config, dict) else None)
    if not base:
        raise RecipeError(f"{config} names no base model: give it with --base MODEL")
    if Path(base).expanduser().exists() and output.resolve() == Path(base).expanduser().resolve():
        raise RecipeError("--output must be another folder than the base model (its weights would be overwritten)")
    if output.resolve() == adapter.resolve():
        raise RecipeError("--output must be another folder than --adapter (the adapter would be overwritten)")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise RecipeError(
            f"--output {output}: {'a file' if not output.is_dir() else 'a folder with files'} is there, which the "
            "merged model would write over: name a new folder"
        )
    if base.startswith((".", "/", "~")) and not Path(base).expanduser().is_dir():
        raise RecipeError(
            f"The base model {base!r}: no such folder. Give the base the adapter was trained on with --base"
        )
    return base


def merge_adapter(adapter: str | Path, output: str | Path, base: str | None = None, dtype: str | None = None) -> Path:
    """Merge the adapter into `base` (default: the adapter's) loaded unquantized in `dtype` (default: fp32); save it
    to `output`, a new folder, with a tokenizer (the run's, else the base's)."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not str(output).strip():
        raise RecipeError("--output is empty: name a new folder for the merged model")
    adapter, output = Path(adapter), Path(output).expanduser()
    base = checked_folders(adapter, output, base)
    try:
        base_config = AutoConfig.from_pretrained(base)
    except OSError as err:  # not on disk, not cached, Hub unreachable
        raise RecipeError(
            f"Could not load the base model {base!r} ({str(err).splitlines()[0][:200]}). "
            "Offline? Point --base at a local copy of it."
        ) from None
    if getattr(base_config, "quantization_config", None):
        raise RecipeError(
            f"The base {base!r} is a quantized checkpoint: a merge needs full-precision weights. "
            "Give the original model with --base (e.g. Qwen/Qwen2.5-1.5B-Instruct, not a 4-bit copy of it)."
        )
    # fp32 by default: merged in bf16, w + BA is rounded to bf16's 8 bits, which keeps little of an update smaller than
    # a weight's rounding step (about 1e-4 at 0.025): the adapter's early training, most of it
    dtype = dtype or "float32"
    logger.info("Loading base %s in %s (never quantized)", base, dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    try:
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as err:  # size mismatch: the adapter was trained on another model
        first = str(err).strip().splitlines()[0][:300]
        raise RecipeError(
            f"The adapter {adapter} does not fit the base {base!r} ({first}): give the base it was trained on "
            "with --base"
        ) from None
    tokenizer = AutoTokenizer.from_pretrained(adapter if (adapter / "tokenizer_config.json").is_file() else base)
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
        "--dtype",
        choices=DTYPES,
        help="Weights' dtype; default: float32 (bfloat16 halves the size, rounding small updates away); auto: "
        "the base's",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        merge_adapter(args.adapter, args.output, args.base, args.dtype)
    except RecipeError as err:
        sys.exit(str(err))


if __name__ == "__main__":
    main()
