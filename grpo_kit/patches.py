"""Where the recipe changes what a library does: every patch of a library's functions, methods or objects, in one
place (flags a library reads are set where they are decided: offline mode in `online`, DeepSpeed's construction hook
for a shape-only model in `models.shapes_only`).

Each says which upstream behaviour it answers and on which version it was read; tests/test_patches.py checks that
behaviour on the installed versions (and fails when upstream changes it), the other tests the patch's effect. Read on
transformers 5.24, TRL 1.16, PEFT 0.21, accelerate 1.15, torch 2.13.

Each patch, and the upstream behaviour it answers:
- `train_adapters_in_fp32`: trl/trainer/grpo_trainer.py casts a quantized PEFT model's trainable parameters to bf16.
- `reference_in_bf16`: trl/trainer/grpo_trainer.py loads the KL reference model as the policy (fp32 weights).
- `keep_base_exact`: peft/tuners/lora/layer.py `merge` adds the delta to the base weight in place, in its dtype, and
  trl/generation/vllm_generation.py merges and unmerges at every weight sync.
- `decode_by_the_recipes_rules`: transformers/generation/utils.py `_prepare_generation_config` fills every unset value
  from the model's generation_config (`defaults_only=True`).
- `cast_once_per_generation`: accelerate wraps forward in autocast, torch clears its cast cache when the outermost
  autocast exits, and RoPE returns fp32 cos/sin.
- `one_input_grad_hook`: transformers/modeling_utils.py `enable_input_require_grads` adds a hook at each call and keeps
  the last.
- `count_one_gpu`: transformers/training_args.py `n_gpu` returns `_n_gpu`; the Trainer wraps the model in
  nn.DataParallel when it is above 1.
- `rotate_after_save`: transformers/trainer.py `_save_checkpoint(model, trial)` rotates by modification time
  (`use_mtime=True`), a copy's time moving it.
- `completions_table_only_when`: trl/trainer/grpo_trainer.py calls its module's `print_prompt_completions_sample`
  whenever it logs completions (to files and wandb), printing the table to the console each time.
- `keep_train_sampler`: trl/trainer/grpo_trainer.py `_get_train_sampler` makes a RepeatSampler (`generator`,
  `shuffle`, `num_samples`) anew when a run resumes.
"""

import logging
from functools import partial

from grpo_kit import layout

logger = logging.getLogger("grpo_demo")


def prepare_trained_model(trainer) -> None:
    """What the trainer's model needs once loaded, before training: fp32 adapters, a base that vLLM's weight syncs
    leave as it was, rollouts cast once each, one input-gradient hook however often checkpointing is re-enabled."""
    train_adapters_in_fp32(trainer)
    reference_in_bf16(trainer)
    if trainer.args.use_vllm:
        keep_base_exact(trainer.model)
    decode_by_the_recipes_rules(trainer)
    cast_once_per_generation(trainer)
    one_input_grad_hook(trainer.model)


# What TRL's rollouts set themselves, and the tokens a model's generation config rightly names
DECODING_SET = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty"}
TOKEN_IDS = {"eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id"}


def decode_by_the_recipes_rules(trainer) -> list[str]:
    """Make TRL's rollouts decode by the recipe's settings alone, as its evaluation does; returns the model's
    generation settings that are so left out.

    transformers' `generate` fills every value of the GenerationConfig it is handed that is unset (None) from the
    model's own generation_config.json (generation/utils.py, `_prepare_generation_config`: `update(**self.
    generation_config.to_dict(), defaults_only=True)`, transformers 5.24), and TRL's leaves all but its sampling
    settings unset: a model folder's `suppress_tokens`, `no_repeat_ngram_size` or `bad_words_ids` would shape every
    rollout and no evaluation. During each `generate` the model's config holds its end, pad and bos tokens alone
    (`generation.own_generation_config`, as the evaluation's)."""
    from grpo_kit.generation import own_generation_config, pad_id, stop_ids

    model = trainer.model
    own = getattr(model.get_base_model() if hasattr(model, "get_base_model") else model, "generation_config", None)
    if own is None:  # no generation config to fill TRL's with
        return []
    ignored = set(own.to_diff_dict()) - DECODING_SET - TOKEN_IDS
    left_out = sorted(k for k in ignored if not k.startswith(("_", "transformers")))
    if left_out:
        logger.warning(
            "The model's generation_config.json sets %s: neither rollouts nor evaluations use them (the recipe's "
            "decoding settings alone, and its end tokens)", ", ".join(left_out),
        )  # fmt: skip
    tokenizer = trainer.processing_class
    stops, pad, generate = stop_ids(model, tokenizer), pad_id(tokenizer), model.generate

    def generate_by_the_recipes_rules(*args, **kwargs):
        with own_generation_config(model, stops, pad):
            return generate(*args, **kwargs)

    model.generate = generate_by_the_recipes_rules
    return left_out


def keep_base_exact(model) -> int:
    """Make `merge_adapter` / `unmerge_adapter` leave a LoRA model's frozen base bit for bit as it was; returns the
    layers guarded.

    TRL syncs a LoRA model's weights to vLLM by merging the adapter into the base, reading the merged weights and
    unmerging (`VLLMGeneration._iter_named_params`), in place: in bf16, (w + BA) - BA is not w, and every sync adds
    that rounding to the "frozen" base (a CPU simulation of 500 syncs changed a third or more of the base weights,
    by about the size of the LoRA update itself). Here merging first copies each base weight, and unmerging puts the
    copy back: vLLM still gets w + BA (rounded to bf16: README, "LoRA"), the base never changes. The copies live
    only during a sync (the targeted weights once more: ~2.6 GB in bf16 for the 1.5B model)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not hasattr(model, "merge_adapter"):
        return 0
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    merge, unmerge, saved = model.merge_adapter, model.unmerge_adapter, []

    def merge_adapter(*args, **kwargs):
        saved[:] = [(w, w.detach().clone()) for w in (layer.get_base_layer().weight for layer in layers)]
        return merge(*args, **kwargs)

    def unmerge_adapter(*args, **kwargs):
        result = unmerge(*args, **kwargs)
        for weight, copy in saved:
            weight.data.copy_(copy)
        saved.clear()
        return result

    model.merge_adapter, model.unmerge_adapter = merge_adapter, unmerge_adapter
    return len(layers)


def cast_once_per_generation(trainer) -> None:
    """Run the trainer's `generate` (rollouts, and the evaluation's) inside one autocast.

    accelerate wraps the model's forward in autocast, and each forward's exit clears torch's cast cache: with fp32
    weights every decoded token re-cast every weight to bf16. One autocast around the whole `generate` keeps the
    cache (torch clears it only when the outermost autocast exits): each weight cast once per generation. It also
    covers PEFT, whose `generate` calls the base model's forward, not the wrapped one (a `--dtype float32` LoRA
    model then handed flash-attention fp32 tensors, which it refuses)."""
    if not (trainer.args.bf16 or trainer.args.fp16) or trainer.is_deepspeed_enabled:
        return
    model, autocast = trainer.model, trainer.accelerator.autocast
    generate, generating = model.generate, []
    for module in model.modules():  # RoPE's fp32 cos/sin would promote the cached keys to fp32 (43 KB/token, not 28)
        if type(module).__name__.endswith("RotaryEmbedding"):
            module.register_forward_hook(partial(_rope_in_autocast_dtype, generating))

    def generate_in_one_autocast(*args, **kwargs):
        with autocast():
            generating.append(True)
            try:
                return generate(*args, **kwargs)
            finally:
                generating.pop()

    model.generate = generate_in_one_autocast


def _rope_in_autocast_dtype(generating: list, module, inputs, output):
    """During a generation, RoPE's cos and sin in the dtype autocast computes in: keys and queries stay bf16."""
    import torch

    if not generating or not torch.is_autocast_enabled(device := output[0].device.type):
        return output
    return tuple(t.to(torch.get_autocast_dtype(device)) for t in output)


def one_input_grad_hook(model) -> None:
    """Keep one input-embedding hook however often gradient checkpointing is re-enabled.

    transformers' `enable_input_require_grads` adds a forward hook to the input embeddings each time it runs without
    removing the last one (it only forgets it), and TRL re-enables checkpointing after every generation: thousands of
    hooks late in a run, each called on every embedding forward. Here it removes its previous hooks first."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.enable_input_require_grads = _enable_once(module)


def _enable_once(module):
    from transformers import PreTrainedModel

    def enable_input_require_grads():
        module.disable_input_require_grads()
        PreTrainedModel.enable_input_require_grads(module)

    return enable_input_require_grads


def reference_in_bf16(trainer) -> bool:
    """The KL reference model (beta > 0, full fine-tuning) in bf16: TRL loads it as the policy (fp32 weights), and
    it only computes log-probabilities under the same bf16 autocast, so its fp32 copy would double the weights'
    memory for nothing. DeepSpeed prepares its own (loaded in bf16 there)."""
    import torch

    ref = getattr(trainer, "ref_model", None)
    if ref is None or trainer.is_deepspeed_enabled or not trainer.args.bf16:
        return False
    if {p.dtype for p in ref.parameters()} != {torch.float32}:
        return False
    ref.to(torch.bfloat16)
    logger.info("The reference model computes in bf16: its weights cast to bf16 (half the memory of fp32)")
    return True


def train_adapters_in_fp32(trainer) -> int:
    """Cast an adapter model's trainable parameters back to fp32 before the optimizer is built; returns how many.
    trl 1.16 casts a quantized model's to bf16 (after `get_peft_model`), where AdamW's steps at this recipe's rates
    are below half of bf16's spacing and round away; PEFT computes in the base's dtype under autocast, so only the
    optimizer sees fp32. DeepSpeed keeps fp32 master weights of its own: left alone there."""
    import torch

    if trainer.is_deepspeed_enabled or not hasattr(trainer.model, "peft_config"):
        return 0
    half = [p for p in trainer.model.parameters() if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)]
    for param in half:
        param.data = param.data.float()
    if half:
        logger.info("Adapters train in fp32: %d tensors cast back from half precision", len(half))
    return len(half)


def rotate_after_save(trainer, rotate) -> None:
    """Rotate `trainer`'s checkpoints by `rotate(output_dir, limit, keep)` after each save (`save_total_limit` read
    then) instead of by its own rotation, which is switched off while it saves."""
    save = trainer._save_checkpoint

    def save_then_rotate(model, trial):
        args = trainer.args
        limit, args.save_total_limit = args.save_total_limit, None  # the trainer's rotation: nothing to do
        try:
            save(model, trial)
        finally:
            args.save_total_limit = limit
        if args.should_save:
            output_dir = trainer._get_output_dir(trial=trial)
            just_saved = layout.checkpoint(output_dir, trainer.state.global_step)
            rotate(output_dir, limit, (str(just_saved), trainer.state.best_model_checkpoint))

    trainer._save_checkpoint = save_then_rotate


def count_one_gpu(training_args) -> None:
    """The Trainer counts one GPU for this process (it reads `n_gpu`, `_n_gpu` underneath, before it would wrap the
    model in nn.DataParallel, which GRPOTrainer refuses)."""
    training_args._n_gpu = 1


def keep_train_sampler(trainer) -> list:
    """Every sampler the trainer makes, appended to the list returned (the newest last): `runs.same_data_order` reads
    the one training uses."""
    made, make = [], trainer._get_train_sampler

    def sampler(*args, **kwargs):
        made.append(make(*args, **kwargs))
        return made[-1]

    trainer._get_train_sampler = sampler
    return made


def completions_table_only_when(shown) -> None:
    """TRL's completions table printed to the console only while `shown()` is true (the run asked for it): the
    function TRL calls is wrapped, once a process."""
    from trl.trainer import grpo_trainer

    printer = grpo_trainer.print_prompt_completions_sample
    if getattr(printer, "wrapped_by_recipe", False):
        return

    def only_when_shown(*args, **kwargs):
        if shown():
            printer(*args, **kwargs)

    only_when_shown.wrapped_by_recipe = True
    grpo_trainer.print_prompt_completions_sample = only_when_shown
