"""Precision on the GPU path, run on the CPU: every update lands, rollouts and the loss compute in bf16.

On CUDA the recipe loads full fine-tuning in fp32 and computes in bf16 (autocast), LoRA on a frozen bf16 base with
fp32 adapters. bf16 autocast runs on the CPU too, so the same trainer path is measured here at the recipe's lr
5e-6, against an fp32 run, and against pure bf16 weights (what the recipe did before: most updates rounded away).
"""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
import torch
from conftest import pretend_cuda

import grpo_demo
from grpo_kit import evaluation, models, patches, settings

STEPS = 3


def resolved(argv: list[str]) -> SimpleNamespace:
    """The recipe's settings for `argv`, resolved and checked as on the machine the test pretends to be (the
    trainer's own arguments would set up the device, so they are not built here)."""
    values = settings.resolve(argv, grpo_demo.recipe_defaults(), grpo_demo.REWARD_FUNCS)
    return SimpleNamespace(**values)


@pytest.mark.parametrize(("extra", "dtype"), [([], "float32"), (["--use_peft"], "bfloat16")])
def test_on_cuda_weights_are_fp32_for_full_fine_tuning_and_bf16_under_adapters(fake_cuda, extra, dtype):
    chosen = resolved(extra)
    assert (chosen.bf16, chosen.use_cpu) == (True, False)  # bf16 compute: autocast
    assert models.weights_dtype(chosen, chosen) == dtype


def test_on_cpu_everything_is_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, args, model_args = grpo_demo.parse_settings(["--use_peft"])
    assert (args.bf16, args.use_cpu) == (False, True)
    assert models.weights_dtype(model_args, args) == "float32"


def test_an_explicit_dtype_wins_and_pure_bf16_full_fine_tuning_is_warned_about(fake_cuda, caplog):
    with caplog.at_level("WARNING", logger="grpo_demo"):
        chosen = resolved(["--dtype", "bfloat16"])
    assert models.weights_dtype(chosen, chosen) == "bfloat16"
    assert "dtype=bfloat16 with full fine-tuning: AdamW updates bfloat16 weights in place" in caplog.text


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that differs within every group, so every step has a gradient (the tiny random model never earns
    the recipe's rewards, and a step without reward spread would not move the weights in any precision)."""
    return [float(len(c[0]["content"])) for c in completions]


def train(tiny_dir, gsm8k_dir, tmp_path, dtype: str, bf16: bool, lora: bool):
    """The recipe's settings, model loading and evaluation callback on the CPU, STEPS steps at lr 5e-6; (start
    weights, end weights, trainable parameters, the dtypes a projection's output had in each phase: evaluation,
    rollout, loss)."""
    from trl import GRPOTrainer, get_peft_config

    argv = [
        "--model_name_or_path", str(tiny_dir), "--dataset", str(gsm8k_dir), "--output_dir", str(tmp_path / dtype),
        "--use_cpu", "true", "--bf16", str(bf16).lower(), "--dtype", dtype, "--report_to", "none",
        "--max_steps", str(STEPS), "--warmup_steps", "0", "--save_strategy", "no", "--log_completions", "false",
        "--num_generations", "4", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
        "--max_completion_length", "12", "--activation_checkpointing", "false", "--lora_r", "4",
        "--eval_batch_size", "4",
    ] + (["--use_peft"] if lora else [])  # fmt: skip
    run, args, model_args = grpo_demo.parse_settings([*argv, "--eval_limit", "4", "--eval_every_steps", "0"])
    assert args.learning_rate == 5e-6  # the recipe's
    args.model_init_kwargs = models.init_kwargs(model_args)
    train_set = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))
    test_set = grpo_demo.get_gsm8k_questions("test", str(gsm8k_dir))
    trainer = GRPOTrainer(
        model=str(tiny_dir),
        processing_class=models.load_tokenizer(model_args, args),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=train_set,
        peft_config=get_peft_config(model_args),
    )
    trainer.add_callback(
        evaluation.callback(
            trainer,
            test_set,
            evaluation.measurement_plan(run, args, grpo_demo.ANSWER_FORMAT, training=True),
            grpo_demo.ANSWER_FORMAT,
        )
    )
    trainable = {name: p for name, p in trainer.model.named_parameters() if p.requires_grad}
    start = {name: p.detach().float().clone() for name, p in trainable.items()}

    seen, evaluating = collections.Counter(), []
    generate_greedy = evaluation.generate_greedy

    def evaluation_generation(*args, **kwargs):
        evaluating.append(True)
        try:
            return generate_greedy(*args, **kwargs)
        finally:
            evaluating.pop()

    def phase() -> str:
        return "evaluation" if evaluating else "rollout" if not torch.is_grad_enabled() else "loss"

    projection = trainer.model.get_decoder().layers[0].self_attn.q_proj
    projection.register_forward_hook(lambda module, inputs, output: seen.update([(phase(), output.dtype)]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "generate_greedy", evaluation_generation)
        trainer.train()
    end = {name: p.detach().float() for name, p in trainable.items()}
    return start, end, trainable, seen


def movement(start: dict, end: dict) -> float:
    return sum((end[name] - start[name]).abs().sum().item() for name in start)


def gpu_precision(lora: bool) -> tuple[str, bool]:
    """(weights' dtype, bf16 compute) as the recipe chooses them on a CUDA machine."""
    with pytest.MonkeyPatch.context() as patch:
        pretend_cuda(patch)
        chosen = resolved(["--use_peft"] if lora else [])
        return models.weights_dtype(chosen, chosen), chosen.bf16


@pytest.mark.slow  # GRPO steps, in-process
@pytest.mark.parametrize("lora", [False, True], ids=["full fine-tuning", "LoRA"])
def test_the_gpu_precision_realises_the_fp32_update_and_pure_bf16_does_not(tiny_dir, gsm8k_dir, tmp_path, lora):
    dtype, bf16 = gpu_precision(lora)  # the recipe's choice on CUDA, trained on the CPU (bf16 autocast runs there)
    start, end, trainable, seen = train(tiny_dir, gsm8k_dir, tmp_path, dtype, bf16=bf16, lora=lora)
    fp32_start, fp32_end, _, _ = train(tiny_dir, gsm8k_dir, tmp_path, "float32", bf16=False, lora=lora)
    realised = movement(start, end) / movement(fp32_start, fp32_end)
    assert realised >= 0.95, f"the recipe's GPU precision realised {realised:.1%} of the fp32 run's movement"

    # Trained parameters are fp32 (full weights, or adapters on the bf16 base) and every matmul ran in bf16:
    # the evaluations before and after training, the rollouts (no grad) and the loss alike.
    assert {p.dtype for p in trainable.values()} == {torch.float32}
    phases = {("evaluation", torch.bfloat16), ("rollout", torch.bfloat16), ("loss", torch.bfloat16)}
    assert set(seen) == phases, seen

    if not lora:  # the old way: pure bf16 weights, AdamW in place
        bf16_start, bf16_end, _, _ = train(tiny_dir, gsm8k_dir, tmp_path, "bfloat16", bf16=True, lora=False)
        kept = movement(bf16_start, bf16_end) / movement(fp32_start, fp32_end)
        assert kept < 0.3, f"pure bf16 weights kept {kept:.1%} of the movement"


def test_qlora_adapters_cast_to_bf16_by_trl_go_back_to_fp32(tiny):
    """trl casts a quantized model's trainable parameters to bf16; the recipe casts them back before training."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model

    tokenizer, model = tiny
    base = type(model)(model.config).to(torch.bfloat16)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    for param in peft_model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.bfloat16)  # as trl does for a quantized base
    trainer = SimpleNamespace(model=peft_model, is_deepspeed_enabled=False)
    assert patches.train_adapters_in_fp32(trainer) == 2 * 2 * 2  # A and B, 2 projections, 2 layers
    dtypes = {(p.requires_grad, p.dtype) for p in peft_model.parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}  # adapters fp32, the frozen base untouched

    assert patches.train_adapters_in_fp32(SimpleNamespace(model=base, is_deepspeed_enabled=False)) == 0  # no adapter
    assert patches.train_adapters_in_fp32(SimpleNamespace(model=peft_model, is_deepspeed_enabled=True)) == 0
