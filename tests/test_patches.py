"""The upstream behaviours grpo_kit/patches.py answers, checked on the installed libraries: each test fails when a
library changes what its patch relies on (a renamed internal, a fixed bug), so the patch is revisited rather than
silently wrong or left working around nothing. What each patch does to a run is tested beside its feature
(test_gpu_path.py, test_precision.py, test_folders.py, test_runs.py)."""

from __future__ import annotations

import inspect

import pytest
import torch


def source(dotted: str) -> str:
    module_name, _, attribute = dotted.rpartition(":")
    import importlib

    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return inspect.getsource(obj)


SOURCE_CONTRACTS = [
    # train_adapters_in_fp32: TRL casts a quantized PEFT model's trainable parameters to bf16
    ("trl.trainer.grpo_trainer:GRPOTrainer.__init__", "param.data = param.data.to(torch.bfloat16)"),
    # keep_base_exact: TRL's vLLM weight sync merges the adapter into the base and unmerges it, every sync
    ("trl.generation.vllm_generation:VLLMGeneration", "model.merge_adapter()"),
    ("trl.generation.vllm_generation:VLLMGeneration", "model.unmerge_adapter()"),
    # keep_base_exact: PEFT merges in place, in the base weight's dtype
    ("peft.tuners.lora.layer:Linear.merge", "base_layer.weight.data += delta_weight"),
    # decode_by_the_recipes_rules: generate fills every unset value from the model's own generation_config
    ("transformers.generation.utils:GenerationMixin._prepare_generation_config", "defaults_only=True"),
    # rotate_after_save: the trainer's own rotation orders by modification time, after reading save_total_limit
    ("transformers.trainer:Trainer._save_checkpoint", "use_mtime=True"),
    ("transformers.trainer:Trainer._save_checkpoint", "save_total_limit=self.args.save_total_limit"),
    # count_one_gpu: the Trainer wraps the model in nn.DataParallel where n_gpu > 1
    ("transformers.trainer:Trainer._wrap_model", "self.args.n_gpu > 1"),
    # reference_in_bf16: TRL loads the KL reference model (beta > 0) as the policy, with its model_init_kwargs
    ("trl.trainer.grpo_trainer:GRPOTrainer.__init__", "self.ref_model = create_model_from_path("),
    # completions_table_only_when: TRL prints the table through its module's function, each time it logs
    ("trl.trainer.grpo_trainer:GRPOTrainer.log", "print_prompt_completions_sample("),
    # keep_train_sampler: GRPO's sampler is TRL's RepeatSampler, made by _get_train_sampler
    ("trl.trainer.grpo_trainer:GRPOTrainer._get_train_sampler", "RepeatSampler("),
]


@pytest.mark.parametrize(("where", "text"), SOURCE_CONTRACTS, ids=[f"{w.split(':')[1]}" for w, _ in SOURCE_CONTRACTS])
def test_the_upstream_code_a_patch_answers_is_still_there(where, text):
    assert text in source(where), f"{where} no longer has {text!r}: revisit grpo_kit/patches.py"


def test_the_save_and_sampler_hooks_keep_their_signatures():
    from transformers import Trainer
    from trl import GRPOTrainer

    assert list(inspect.signature(Trainer._save_checkpoint).parameters) == ["self", "model", "trial"]
    assert hasattr(Trainer, "_get_output_dir")
    assert "dataset" in inspect.signature(GRPOTrainer._get_train_sampler).parameters


def test_the_repeat_sampler_keeps_the_generator_a_resume_advances():
    from trl.trainer.utils import RepeatSampler

    sampler = RepeatSampler(list(range(8)), mini_repeat_count=2, batch_size=2, repeat_count=1, shuffle=True, seed=3)
    assert sampler.shuffle and sampler.num_samples == 8 and isinstance(sampler.generator, torch.Generator)
    first = torch.randperm(8, generator=torch.Generator().manual_seed(3)).tolist()
    assert list(sampler)[::2] == first  # each epoch: the generator's next permutation


def test_n_gpu_is_the_private_count_the_patch_sets():
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none")
    args._n_gpu = 1
    assert args.n_gpu == 1


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_enable_input_require_grads_still_stacks_hooks_without_the_patch():
    """transformers adds a hook each call and keeps the old: TRL re-enables checkpointing after every generation."""
    model = tiny_llama()
    embeddings = model.get_input_embeddings()
    before = len(embeddings._forward_hooks)
    model.enable_input_require_grads()
    model.enable_input_require_grads()
    assert len(embeddings._forward_hooks) - before == 2


def test_rope_is_a_module_named_so_and_computes_in_the_residual_dtype():
    """cast_once_per_generation finds RoPE by its class name and casts its fp32 cos/sin while generating."""
    model = tiny_llama()
    rope = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert rope
    x = torch.zeros(1, 3, 16)
    cos, sin = rope[0](x, torch.arange(3)[None])
    assert cos.dtype == sin.dtype == torch.float32


def test_a_bf16_lora_merge_and_unmerge_still_moves_the_base_without_the_patch():
    """PEFT's in-place bf16 merge: (w + BA) - BA is not w, so the base drifts at every sync."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(tiny_llama().to(torch.bfloat16), LoraConfig(r=4, target_modules=["q_proj"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=1e-3)
    layer = next(m for m in model.modules() if hasattr(m, "get_base_layer") and hasattr(m, "lora_A"))
    before = layer.get_base_layer().weight.detach().clone()
    model.merge_adapter()
    model.unmerge_adapter()
    assert not torch.equal(layer.get_base_layer().weight, before)


def test_trls_completions_table_prints_only_while_the_run_asks_for_it(monkeypatch):
    from trl.trainer import grpo_trainer

    from grpo_kit import patches

    printed, shown = [], [False]
    monkeypatch.setattr(grpo_trainer, "print_prompt_completions_sample", lambda *args: printed.append(args))
    patches.completions_table_only_when(lambda: shown[0])
    patches.completions_table_only_when(lambda: True)  # a second install (another run in the process) wraps nothing
    grpo_trainer.print_prompt_completions_sample("hidden")
    shown[0] = True
    grpo_trainer.print_prompt_completions_sample("shown")
    assert printed == [("shown",)]
