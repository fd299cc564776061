"""What a model needs to run here: this machine's GPUs, packages and processes, the tokenizer (one pad-token rule), the
attention that can run, the trainer's load arguments, a saved model for inference, fp32 adapters."""

import importlib.util
import logging
import os
from importlib import metadata

from grpo_kit import RecipeError, offline_commands, patches

logger = logging.getLogger("grpo_demo")

GPU_EXTRAS = "pip install -r requirements-gpu.txt"
RESERVED_PAD_TOKENS = ("<|finetune_right_pad_id|>", "<pad>")  # Llama 3.1 and later reserve the first, set no pad


def world_size() -> int:
    """Processes of this run (`accelerate launch` / torchrun set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def zero_stage() -> str | None:
    """The DeepSpeed ZeRO stage `accelerate launch` runs under, None without DeepSpeed."""
    return os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") if os.environ.get("ACCELERATE_USE_DEEPSPEED") else None


def shapes_only(config, trust_remote_code: bool = False):
    """The model of `config` on the meta device: shapes and parameter counts, nothing allocated.

    Under `accelerate launch` with ZeRO-3 the Trainer's arguments set transformers' DeepSpeed config, and
    `from_config` then builds inside `deepspeed.zero.Init` (modeling_utils.py, `_from_config`: `needs_zero3_init`,
    transformers 5.24), whose device overrides meta: every parameter allocated, partitioned across the processes and
    left as `torch.empty(0)`, so a count reads 0 (and start-up pays a full-model broadcast). The config is hidden
    from transformers for the duration (integrations/deepspeed.py, `_hf_deepspeed_config_weak_ref`)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import deepspeed

    kept = deepspeed._hf_deepspeed_config_weak_ref
    deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    finally:
        deepspeed._hf_deepspeed_config_weak_ref = kept


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def installed_version(package: str) -> str | None:
    """The installed version of `package`, None when it is absent (found without importing it: cheap)."""
    try:
        return metadata.version(package) if importlib.util.find_spec(package.replace("-", "_")) else None
    except metadata.PackageNotFoundError:
        return None


def pad_token(tokenizer) -> str:
    """The one pad-token rule: the tokenizer's own; without one (Llama 3), a token its vocabulary reserves for padding,
    else its end of sequence. Code that masks by token id (`ids != pad`, a collator ignoring labels equal to the pad)
    would take a pad that is also a real token for padding: Llama 3.2's end of sequence, `<|eot_id|>`, ends turns."""
    if tokenizer.pad_token is not None:
        return tokenizer.pad_token
    return next((token for token in RESERVED_PAD_TOKENS if token in tokenizer.get_vocab()), tokenizer.eos_token)


def set_pad_token(tokenizer):
    tokenizer.pad_token = pad_token(tokenizer)
    return tokenizer


def end_of_turn(tokenizer) -> str | None:
    """The special token the chat template closes an assistant turn with (`<|im_end|>` for ChatML, `<|eot_id|>` for
    Llama 3), None when the template has none (or fails on a short conversation)."""
    mark = "MARK-the-answer-ends-here"  # text no template adds to, trims or escapes
    conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": mark}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # a template that raises on this conversation (a jinja exception of its own)
        return None
    ids = tokenizer(text.rsplit(mark, 1)[-1], add_special_tokens=False)["input_ids"] if mark in text else []
    token = tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
    return token if token in tokenizer.all_special_tokens or token in tokenizer.get_added_vocab() else None


def stop_at_end_of_turn(tokenizer, name: str, model_args, training_args):
    """Make generation stop where the chat template ends a turn. Generation (TRL's, vLLM's, the evaluation's) stops at
    the end of sequence and the generation config's eos_token_id: a turn end neither names (Llama 3's first Instruct
    release: `<|eot_id|>`) would let completions run on to the length limit. It becomes the end of sequence then, and
    a stop token for vLLM, which reads the tokenizer from the model's folder."""
    from transformers import AutoConfig, GenerationConfig

    if (turn_end := end_of_turn(tokenizer)) is None or turn_end == tokenizer.eos_token:
        return tokenizer
    try:  # the token ids the model's generation config says end generation
        ends = GenerationConfig.from_pretrained(name, revision=model_args.model_revision).eos_token_id
    except OSError:  # no generation_config.json: generation reads the model's config
        try:
            options = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
            ends = getattr(AutoConfig.from_pretrained(name, **options).get_text_config(), "eos_token_id", None)
        except (OSError, ValueError):  # unreadable: the template's end is not added then
            ends = None
    turn_end_id = tokenizer.convert_tokens_to_ids(turn_end)
    if turn_end_id in ([ends] if isinstance(ends, int) else list(ends or [])):
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


def load_tokenizer(model_args, training_args):
    """The model's tokenizer, with a pad token of its own and an end of sequence where its turns end (see
    `pad_token` and `stop_at_end_of_turn`); a short message instead of a traceback when it can't be had."""
    from transformers import AutoTokenizer

    name = model_args.model_name_or_path
    options = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **options)
    except (OSError, ValueError) as err:  # not on disk, not cached, Hub unreachable or gated; a folder without one
        raise RecipeError(
            f"Could not load the model {name!r} ({str(err).splitlines()[0][:200]}).\n"
            f"Offline? Point --model_name_or_path at a local folder, or try the recipe offline: {offline_commands()}. "
            "Gated (Llama)? Accept the licence on the Hub and run `hf auth login`."
        ) from None
    if not tokenizer.chat_template:  # a base model: apply_chat_template would raise in data prep or evaluation
        raise RecipeError(
            f"The model {name!r} has no chat template (a base model?): the recipe prompts a chat model with a system "
            "and a user message. Use an instruct model (e.g. Qwen/Qwen2.5-1.5B-Instruct), or give this one a "
            "chat template (chat_template.jinja, or chat_template in its tokenizer_config.json)"
        )
    usable(tokenizer, name, options)
    return set_pad_token(stop_at_end_of_turn(tokenizer, name, model_args, training_args))


SYSTEM_PROBE = "System text 7f3a: answer in the format."  # a system message whose place in the prompt is checked


def usable(tokenizer, name: str, options: dict) -> None:
    """Refuse a tokenizer the recipe cannot prompt with, before anything trains or generates: no vocabulary (a folder
    with a template but no tokenizer files), a chat template that cannot be rendered or refuses a system message
    (jinja's error, as training, --eval_only and --ask would each raise it), one that drops the system message (the
    format instructions would never reach the model), or more tokens than the model has embeddings."""
    ids = tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    if not ids or set(ids) == {tokenizer.unk_token_id}:  # a vocabulary of special tokens alone: text encodes to nothing
        raise RecipeError(
            f"The tokenizer of {name!r} is empty (no tokenizer.json or vocabulary files beside its chat template): "
            "copy the model's tokenizer files into the folder"
        )
    chat = [{"role": "system", "content": SYSTEM_PROBE}, {"role": "user", "content": "What is 2 + 3?"}]
    try:
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    except Exception as err:  # jinja2's TemplateError, or what a template raises itself (raise_exception)
        said = str(err).strip().splitlines()[0][:200]
        fix = (
            "the recipe's format instructions are its system prompt: give the model a chat template that takes a "
            "system message (chat_template.jinja in a copy of its folder), or use a model whose template does"
            if "system" in said.lower()
            else "fix the template (chat_template.jinja, or chat_template in tokenizer_config.json)"
        )
        raise RecipeError(f"The chat template of {name!r} cannot render the recipe's prompt ({said}): {fix}") from None
    if SYSTEM_PROBE not in str(text):
        raise RecipeError(
            f"The chat template of {name!r} drops the system message: the recipe's format instructions (its system "
            "prompt) would never reach the model. Give it a template that keeps the system message "
            "(chat_template.jinja in a copy of its folder)"
        )
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, **options).get_text_config()
    except Exception:  # an adapter's folder, say: the base's embeddings are checked when it loads
        return
    if (rows := getattr(config, "vocab_size", None)) and len(tokenizer) > rows:
        raise RecipeError(
            f"The tokenizer of {name!r} has {len(tokenizer)} tokens and the model embeds {rows}: an id past "
            f"{rows - 1} would index beyond its embeddings. Use the model's own tokenizer, or resize the model's "
            "embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer))) and save both"
        )


def flash_attention_problem(computes_in_half_precision: bool) -> str | None:
    """Why flash-attention 2 cannot run on this CUDA machine, None when it can: reasons transformers would only
    raise when the model loads, or flash-attn itself at the first step."""
    import torch

    capability = torch.cuda.get_device_capability()
    if tuple(capability) < (8, 0):  # flash-attn 2 runs on Ampere or newer
        return f"this GPU has compute capability {capability[0]}.{capability[1]} and it needs 8.0 or newer"
    if not computes_in_half_precision:
        return "it computes in bf16 or fp16 only, and this run computes in fp32 (bf16 false, dtype float32)"
    try:
        import flash_attn  # noqa: F401  (a wheel built for another torch or CUDA fails here, not at find_spec)
    except Exception as err:  # ImportError, or OSError / RuntimeError from a mismatched binary
        return f"flash_attn does not import ({type(err).__name__}: {str(err)[:120]}); {GPU_EXTRAS}"
    return None


def attention(requested: str | None, use_cpu: bool, half: bool) -> str:
    """flash-attention 2 on a GPU where it runs (`half`: the run computes in bf16 or fp16), else sdpa (with one
    warning where flash-attention was expected or asked for); any other implementation the user names is kept."""
    if requested not in (None, "flash_attention_2"):
        return requested
    if use_cpu or not cuda_available():
        if requested:
            logger.warning("attn_implementation=flash_attention_2 needs a CUDA GPU: using sdpa attention")
        return "sdpa"
    if requested is None and importlib.util.find_spec("flash_attn") is None:
        logger.warning("flash-attn is not installed: using sdpa attention (%s)", GPU_EXTRAS)
        return "sdpa"
    if problem := flash_attention_problem(half):
        logger.warning("flash-attention 2 cannot run here: %s. Using sdpa attention.", problem)
        return "sdpa"
    return "flash_attention_2"


def init_kwargs(model_args, training_args=None) -> dict:
    """What the trainer loads the model with: the recipe's dtype, the attention chosen at start, the revision, and
    for one process on a CUDA machine its one GPU (`one_gpu`)."""
    kwargs = dict(
        dtype=model_args.dtype, attn_implementation=model_args.attn_implementation, revision=model_args.model_revision
    )
    if training_args is not None and (device := one_gpu(training_args)) is not None:
        kwargs["device_map"] = {"": device}
    return kwargs


def one_gpu(training_args) -> int | None:
    """The GPU a single process (python, not accelerate launch) trains on; None under a launcher or on the CPU.

    Outside a launcher TRL loads with `device_map="auto"` (`create_model_from_path`), which spreads the model over
    every visible GPU, layer by layer: a naive pipeline, each GPU idle while the others compute, and tensors the
    recipe's checks sum on different devices. Without it the Trainer would wrap the model in nn.DataParallel, which
    GRPOTrainer refuses. So the model goes on the current GPU whole, the Trainer counts one GPU, and the user is told
    once how to use them all."""
    import torch

    if training_args.use_cpu or world_size() > 1 or not cuda_available():
        return None
    if str(training_args.distributed_state.distributed_type).rsplit(".", 1)[-1] != "NO":
        return None
    if (count := torch.cuda.device_count()) > 1:
        logger.warning(
            "%d GPUs visible: this process trains on GPU %d alone. To train on all of them, one process each: "
            "accelerate launch --config_file configs/ddp.yaml --num_processes %d grpo_demo.py (configs/zero2.yaml or "
            "zero3.yaml when the model or its optimizer does not fit one GPU)",
            count, torch.cuda.current_device(), count,
        )  # fmt: skip
        patches.count_one_gpu(training_args)
    return torch.cuda.current_device()


def weights_dtype(model_args, training_args) -> str:
    """The dtype the trainer loads the weights in; `--dtype` overrides it.

    Full fine-tuning on a GPU keeps fp32 weights and computes in bf16 (`bf16=True`: autocast, flash-attention):
    AdamW updates bf16 weights in place, and at lr 5e-6 a step is far below half the bf16 spacing of a weight near
    0.02 (6e-5), so it rounds away. Measured (benchmarks/bf16_updates.py): pure bf16 weights realise ~1/13 of the
    fp32 movement, fp32 weights with bf16 autocast ~all of it. Neither transformers nor accelerate keeps an fp32
    master copy (DeepSpeed does), so this also makes a 1-GPU or DDP run train as a ZeRO-2 run does. The cost is
    memory: 18 bytes per parameter before activations, ~31 GiB in all for the 1.5B model (docs/memory.md).
    LoRA and QLoRA freeze the base, so it stays in bf16 (or 4-bit) and only the adapters train, in fp32. DeepSpeed
    trains bf16 weights beside fp32 master copies of its own: they load in bf16 (fp32 would only cost host memory).
    """
    if model_args.dtype:
        return model_args.dtype
    if training_args.use_cpu or not training_args.bf16:
        return "float32"
    return "bfloat16" if model_args.use_peft or zero_stage() else "float32"


def inference_dtype(model_args, training_args) -> str:
    """bf16 on a GPU, fp32 on a CPU, unless --dtype says otherwise."""
    return model_args.dtype or ("bfloat16" if not training_args.use_cpu and cuda_available() else "float32")


def load_for_inference(model_args, training_args):
    """A saved model (or a LoRA adapter on its base) on this process's device in eval mode, loaded as the run does."""
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM

    name, dtype = model_args.model_name_or_path, inference_dtype(model_args, training_args)
    attention = model_args.attn_implementation
    if attention == "flash_attention_2" and dtype not in ("bfloat16", "float16"):
        logger.warning("flash-attention 2 computes in bf16/fp16 only and this model loads in %s: using sdpa", dtype)
        attention = "sdpa"  # no autocast here: transformers would hand flash-attn fp32 tensors
    options = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, attn_implementation=attention, **options)
    except Exception as err:  # unreadable or damaged files (safetensors raises its own error), no weights
        message = f"Could not load the model {name!r} ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        raise RecipeError(message) from None
    return model.to(PartialState().device).eval()
