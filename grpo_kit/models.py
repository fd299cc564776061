"""Loading what a run needs of a model: its tokenizer (with one pad-token rule), the attention implementation that
can run here, the trainer's load arguments, a saved model for inference, and adapters kept in fp32."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("grpo_demo")

FLASH_MIN_CAPABILITY = (8, 0)  # flash-attn 2 runs on Ampere or newer
GPU_EXTRAS = "pip install -r requirements-gpu.txt"


# Tokens a vocabulary reserves for padding: Llama 3.1 and later keep `<|finetune_right_pad_id|>` for it (and set no
# pad token); other tokenizers that have one set it as their pad token already.
RESERVED_PAD_TOKENS = ("<|finetune_right_pad_id|>", "<pad>")


def set_pad_token(tokenizer):
    """The one pad-token rule: a tokenizer without one (Llama 3) pads with a token its vocabulary reserves for padding,
    which no prompt or completion contains, else with its end-of-sequence token. The recipe and TRL mask padding by
    attention masks, but code that masks by token id (an attention mask made as `ids != pad`, a collator ignoring
    labels equal to the pad) would take a pad that is also a real token for padding: Llama 3.2's end of sequence,
    `<|eot_id|>`, ends every turn of every prompt and every completion."""
    tokenizer.pad_token = pad_token(tokenizer)
    return tokenizer


def pad_token(tokenizer) -> str:
    """The token `set_pad_token` pads with (the tokenizer is not modified)."""
    if tokenizer.pad_token is not None:
        return tokenizer.pad_token
    vocabulary = tokenizer.get_vocab()
    return next((token for token in RESERVED_PAD_TOKENS if token in vocabulary), tokenizer.eos_token)


def end_of_turn(tokenizer) -> str | None:
    """The special token the chat template closes an assistant turn with (`<|im_end|>` for ChatML, `<|eot_id|>` for
    Llama 3), None when the template has none (or fails on a short conversation)."""
    mark = "MARK-the-answer-ends-here"  # text no template adds to, trims or escapes
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "?"}, {"role": "assistant", "content": mark}], tokenize=False
        )
    except Exception:  # a template that raises on this conversation (a jinja exception of its own)
        return None
    after = text.rsplit(mark, 1)[-1] if mark in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    token = tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
    return token if token in tokenizer.all_special_tokens or token in tokenizer.get_added_vocab() else None


def configured_end_ids(name: str, model_args, training_args) -> list[int]:
    """The token ids the model's generation config (or, without one, its config) says end generation."""
    from transformers import AutoConfig, GenerationConfig

    options = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
    try:
        ids = GenerationConfig.from_pretrained(name, revision=model_args.model_revision).eos_token_id
    except OSError:  # no generation_config.json: generation reads the model's config
        try:
            ids = getattr(AutoConfig.from_pretrained(name, **options).get_text_config(), "eos_token_id", None)
        except (OSError, ValueError):  # unreadable: the template's end is not added then
            ids = None
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


def stop_at_end_of_turn(tokenizer, name: str, model_args, training_args):
    """Make sure generation stops where the chat template ends a turn.

    Generation ends at the tokenizer's end of sequence and the generation config's eos_token_id (TRL's rollouts,
    vLLM and this recipe's evaluation all take both). A model whose template ends turns with a token neither names
    (Llama 3's first Instruct release: `<|eot_id|>`, with `<|end_of_text|>` as the end of sequence) would write
    past the end of its answer until the length limit, every completion truncated. That token is made the
    tokenizer's end of sequence then, and under vLLM, which reads the tokenizer from the model's folder, a stop token.
    """
    turn_end = end_of_turn(tokenizer)
    if turn_end is None or turn_end == tokenizer.eos_token:
        return tokenizer
    turn_end_id = tokenizer.convert_tokens_to_ids(turn_end)
    if turn_end_id in configured_end_ids(name, model_args, training_args):
        return tokenizer
    logger.warning(
        "%s ends a turn with %s, which neither its tokenizer's end of sequence (%s) nor its generation config lists: "
        "using %s as the end of sequence, so that completions stop there",
        name, turn_end, tokenizer.eos_token, turn_end,
    )  # fmt: skip
    tokenizer.eos_token = turn_end
    if getattr(training_args, "use_vllm", False):
        kwargs = dict(training_args.generation_kwargs or {})
        kwargs["stop_token_ids"] = sorted({*kwargs.get("stop_token_ids", []), turn_end_id})
        training_args.generation_kwargs = kwargs
    return tokenizer


def load_tokenizer(model_args, training_args, path: str | None = None):
    """The model's tokenizer, with a pad token of its own and an end of sequence where its turns end (see
    `set_pad_token` and `stop_at_end_of_turn`); a short message instead of a traceback when it can't be had."""
    from transformers import AutoTokenizer

    name = path or model_args.model_name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
    except (OSError, ValueError) as err:  # not on disk, not cached, Hub unreachable or gated; a folder without one
        sys.exit(
            f"Could not load the model {name!r} ({str(err).splitlines()[0][:200]}).\n"
            "Offline? Point --model_name_or_path at a local folder, or try the recipe offline: --smoke. "
            "Gated (Llama)? Accept the licence on the Hub and run `hf auth login`."
        )
    return set_pad_token(stop_at_end_of_turn(tokenizer, name, model_args, training_args))


def on_gpu(training_args) -> bool:
    import torch

    return not training_args.use_cpu and torch.cuda.is_available()


def flash_attention_problem(computes_in_half_precision: bool) -> str | None:
    """Why flash-attention 2 cannot run on this CUDA machine, None when it can. Each reason is one that
    transformers would only raise when the model loads, or that flash-attn itself would raise at the first step."""
    import torch

    capability = torch.cuda.get_device_capability()
    if tuple(capability) < FLASH_MIN_CAPABILITY:
        return f"this GPU has compute capability {capability[0]}.{capability[1]} and it needs 8.0 or newer"
    if not computes_in_half_precision:
        return "it computes in bf16 or fp16 only, and this run computes in fp32 (bf16 false, dtype float32)"
    try:
        import flash_attn  # noqa: F401  (a wheel built for another torch or CUDA fails here, not at find_spec)
    except Exception as err:  # ImportError, or OSError / RuntimeError from a mismatched binary
        return f"flash_attn does not import ({type(err).__name__}: {str(err)[:120]}); {GPU_EXTRAS}"
    return None


def attention(model_args, training_args) -> str:
    """flash-attention 2 on a GPU where it runs, else sdpa (with one warning where flash-attention was expected or
    asked for); any other implementation the user names is kept."""
    import importlib.util

    requested = model_args.attn_implementation
    if requested not in (None, "flash_attention_2"):
        return requested
    if not on_gpu(training_args):
        if requested:
            logger.warning("attn_implementation=flash_attention_2 needs a CUDA GPU: using sdpa attention")
        return "sdpa"
    if requested is None and importlib.util.find_spec("flash_attn") is None:
        logger.warning("flash-attn is not installed: using sdpa attention (%s)", GPU_EXTRAS)
        return "sdpa"
    half = training_args.bf16 or training_args.fp16 or model_args.dtype in ("bfloat16", "float16")
    problem = flash_attention_problem(half)
    if problem:
        logger.warning("flash-attention 2 cannot run here: %s. Using sdpa attention.", problem)
        return "sdpa"
    return "flash_attention_2"


def init_kwargs(model_args) -> dict:
    """What the trainer loads the model with: the recipe's dtype, the attention chosen at start, the revision."""
    return {
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        "revision": model_args.model_revision,
    }


def inference_dtype(model_args, training_args) -> str:
    """bf16 on a GPU, fp32 on a CPU, unless --dtype says otherwise."""
    return model_args.dtype or ("bfloat16" if on_gpu(training_args) else "float32")


def load_for_inference(model_args, training_args, path: str | None = None):
    """A saved model (or a LoRA run's adapter on its base) on this process's device, in eval mode, loaded with the
    run's revision, trust_remote_code, dtype and attention."""
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM

    name, dtype = path or model_args.model_name_or_path, inference_dtype(model_args, training_args)
    attention = model_args.attn_implementation
    if attention == "flash_attention_2" and dtype not in ("bfloat16", "float16"):
        logger.warning("flash-attention 2 computes in bf16/fp16 only and this model loads in %s: using sdpa", dtype)
        attention = "sdpa"  # no autocast here: transformers would hand flash-attn fp32 tensors
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name,
            dtype=dtype,
            attn_implementation=attention,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
    except Exception as err:  # unreadable or damaged files (safetensors raises its own error), no weights
        sys.exit(f"Could not load the model {name!r} ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
    return model.to(PartialState().device).eval()


def train_adapters_in_fp32(trainer) -> int:
    """Cast the trainable parameters of an adapter model back to fp32 before the optimizer is built; returns how many.

    trl 1.16 casts a quantized model's trainable parameters to bf16 (grpo_trainer.py, after `get_peft_model`,
    citing the QLoRA paper), where AdamW's steps at this recipe's rates are far below half the spacing of bf16 and
    round away: the adapters would barely move. PEFT computes an fp32 adapter on a 4-bit or bf16 base in the
    base's dtype under autocast, so only the optimizer sees fp32. Under DeepSpeed the parameters' storage is
    DeepSpeed's, and it keeps fp32 master weights itself: left alone there.
    """
    import torch

    model = trainer.model
    if trainer.is_deepspeed_enabled or not hasattr(model, "peft_config"):
        return 0
    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
            cast += 1
    if cast:
        logger.info("Adapters train in fp32: %d tensors cast back from half precision", cast)
    return cast
