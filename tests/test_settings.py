"""The recipe's settings: the reference's hyperparameters as defaults, overridable from YAML and the command line."""

from __future__ import annotations

import logging

import pytest
import torch

import grpo_demo


def test_defaults_are_the_reference_hyperparameters_on_todays_trl():
    _, args, model_args = grpo_demo.parse_settings([])
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (args.learning_rate, args.adam_beta1, args.adam_beta2, args.weight_decay) == (5e-6, 0.9, 0.99, 0.1)
    assert args.warmup_steps == 0.1  # a ratio: 10 % of the run
    assert args.lr_scheduler_type == "cosine"
    assert args.logging_steps == 1
    assert args.num_generations == 16
    assert args.max_completion_length == 786
    assert args.num_train_epochs == 1
    assert args.save_steps == 100
    assert args.max_grad_norm == 0.1
    assert args.report_to == ["wandb"]
    # One prompt's 16 completions per device step, 4 accumulated steps: 4 prompts per optimizer step.
    assert args.per_device_train_batch_size == 16
    assert args.gradient_accumulation_steps == 4
    assert args.generation_batch_size == 64
    assert args.generation_batch_size // args.num_generations == 4
    assert args.bf16 == torch.cuda.is_available()
    assert args.output_dir == "outputs/Qwen-1.5B-GRPO"
    assert args.run_name == "Qwen-1.5B-GRPO-gsm8k"


@pytest.mark.parametrize(
    ("model", "output_dir", "run_name"),
    [
        ("Qwen/Qwen2.5-1.5B-Instruct", "outputs/Qwen-1.5B-GRPO", "Qwen-1.5B-GRPO-gsm8k"),
        ("meta-llama/Llama-3.2-1B-Instruct", "outputs/Llama-1B-GRPO", "Llama-1B-GRPO-gsm8k"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "outputs/Qwen-0.5B-GRPO", "Qwen-0.5B-GRPO-gsm8k"),
        ("{tmp}/my-local-model/", "outputs/my-local-model-GRPO", "my-local-model-GRPO-gsm8k"),
    ],
)
def test_output_folder_and_run_name_follow_the_model(tmp_path, model, output_dir, run_name):
    (tmp_path / "my-local-model").mkdir()
    _, args, _ = grpo_demo.parse_settings(["--model_name_or_path", model.format(tmp=tmp_path)])
    assert (args.output_dir, args.run_name) == (output_dir, run_name)


def test_editing_the_model_constant_swaps_the_model_and_its_names(monkeypatch):
    monkeypatch.setattr(grpo_demo, "MODEL_NAME", "meta-llama/Llama-3.2-1B-Instruct")
    _, args, model_args = grpo_demo.parse_settings([])
    assert model_args.model_name_or_path == "meta-llama/Llama-3.2-1B-Instruct"
    assert args.output_dir == "outputs/Llama-1B-GRPO"


def test_yaml_overrides_defaults_and_the_command_line_overrides_yaml(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model_name_or_path: meta-llama/Llama-3.2-1B-Instruct\nlearning_rate: 1.0e-6\nmax_steps: 7\nbeta: 0.04\n"
    )
    _, args, model_args = grpo_demo.parse_settings(["--config", str(recipe), "--max_steps", "9"])
    assert model_args.model_name_or_path == "meta-llama/Llama-3.2-1B-Instruct"
    assert args.output_dir == "outputs/Llama-1B-GRPO"
    assert (args.learning_rate, args.beta, args.max_steps) == (1e-6, 0.04, 9)
    assert args.num_generations == 16  # untouched defaults stay the recipe's


def test_an_explicit_output_dir_wins_over_the_model_name():
    _, args, _ = grpo_demo.parse_settings(["--output_dir", "elsewhere", "--run_name", "mine"])
    assert (args.output_dir, args.run_name) == ("elsewhere", "mine")


def test_cpu_loads_fp32_sdpa(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, args, model_args = grpo_demo.parse_settings([])
    assert (args.bf16, args.use_cpu) == (False, True)
    kwargs = grpo_demo.model_init_kwargs(model_args)
    assert (kwargs["dtype"], kwargs["attn_implementation"]) == ("float32", "sdpa")


@pytest.mark.parametrize(("has_flash_attn", "attention"), [(True, "flash_attention_2"), (False, "sdpa")])
def test_cuda_loads_bf16_with_flash_attention_when_it_imports(monkeypatch, caplog, has_flash_attn, attention):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(grpo_demo.importlib.util, "find_spec", lambda name: object() if has_flash_attn else None)
    # No GPU here for the trainer's own device set-up: keep it on the CPU, the model defaults follow "CUDA".
    _, _, model_args = grpo_demo.parse_settings(["--bf16", "false", "--use_cpu", "true"])
    assert model_args.dtype == "bfloat16"
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        kwargs = grpo_demo.model_init_kwargs(model_args)
    assert (kwargs["dtype"], kwargs["attn_implementation"]) == ("bfloat16", attention)
    assert ("flash-attn is not installed" in caplog.text) == (not has_flash_attn)


def test_an_explicit_dtype_wins():
    _, _, model_args = grpo_demo.parse_settings(["--dtype", "float16"])
    assert grpo_demo.model_init_kwargs(model_args)["dtype"] == "float16"
