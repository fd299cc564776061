"""Scale: LoRA and its merge, QLoRA and vLLM settings, multi-process runs, and the configs and pins they rest on.

The two training tests run the recipe as a user would (a subprocess, offline): LoRA on the smoke preset, then the
documented merge; and the smoke preset under `accelerate launch` with two CPU processes.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import REWARD_NAMES, ROOT, offline_env, run_recipe
from safetensors.torch import load_file

import grpo_demo
from grpo_kit import checks, merge, smoke

TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two processes on two cores: torch's thread pools would fight


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The smoke preset's tiny model and generated problems, built once, as `--smoke` builds them."""
    folder = tmp_path_factory.mktemp("assets")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the preset writes to its relative default paths
        smoke.prepare(smoke.MODEL_DIR, smoke.DATA_DIR, smoke.SMOKE_DEFAULTS["output_dir"], None)
    return {"model": folder / smoke.MODEL_DIR, "data": folder / smoke.DATA_DIR}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# Multi-process: the smoke preset under `accelerate launch`, two CPU processes


def test_two_processes_train_one_run_with_every_completion_scored(tmp_path, assets):
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "configs" / "cpu_ddp.yaml"),
        "--main_process_port", str(free_port()),
        str(ROOT / "grpo_demo.py"), "--smoke", "--use_cpu", "true",
        "--model_name_or_path", str(assets["model"]), "--dataset", str(assets["data"]),
        "--output_dir", str(out), "--max_steps", "2", "--save_steps", "2", "--report_to", "wandb",
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env=offline_env(tmp_path, **ONE_THREAD),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:]

    # One checkpoint, written once: the model and optimizer by the main process, an RNG state by each process.
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    checkpoint = out / "checkpoint-2"
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"):
        assert (checkpoint / name).is_file(), name
    assert not (checkpoint / "rng_state_2.pth").exists()

    # One set of logs: one wandb run, one run record, each step logged once.
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1
    assert (out / "run_record.json").is_file()
    assert result.stdout.count("Run record:") == 1
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]

    # Every process generated for its own prompts, and the logged rewards cover both processes' completions:
    # 8 completions (2 prompts x 4) per process per step, 16 scored, 4 different prompts.
    per_process, processes = smoke.SMOKE_DEFAULTS["per_device_train_batch_size"], 2
    num_generations = smoke.SMOKE_DEFAULTS["num_generations"]
    assert sorted(p.name for p in (out / "completions").glob("*.parquet")) == [
        "completions_00001.parquet",
        "completions_00002.parquet",
    ]
    for entry in steps:
        table = pd.read_parquet(out / "completions" / f"completions_{entry['step']:05d}.parquet")
        assert len(table) == per_process * processes
        prompts = table["prompt"].astype(str).value_counts()
        assert len(prompts) == per_process * processes // num_generations
        assert set(prompts) == {num_generations}  # each prompt's whole group, scored together
        for name in REWARD_NAMES:
            assert entry[f"rewards/{name}/mean"] == pytest.approx(table[name].mean(), abs=1e-6), name


# ----------------------------------------------------------------------------------------------------------------
# LoRA: train with --use_peft, merge with the documented command


def test_lora_run_trains_only_the_adapter_and_merges_into_a_model_that_generates(tmp_path, assets):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_file = assets["model"] / "model.safetensors"
    base_hash = sha256(base_file)
    out, merged_dir = tmp_path / "outputs" / "lora", tmp_path / "outputs" / "lora-merged"
    r, alpha = 4, 16
    args = [
        "--smoke", "--use_peft", "--lora_r", str(r), "--lora_alpha", str(alpha),
        "--model_name_or_path", str(assets["model"]), "--dataset", str(assets["data"]), "--output_dir", str(out),
        "--max_steps", "3", "--save_steps", "3",
        # weight_decay 0: the adapter moves only through the rewards' gradient; a large rate makes it move visibly
        # (the first step's rate is 0, warm-up)
        "--weight_decay", "0", "--learning_rate", "1e-3",
    ]  # fmt: skip
    result = run_recipe(args, cwd=tmp_path, **ONE_THREAD)
    assert result.returncode == 0, result.stdout[-4000:]

    # The run saved an adapter, not a model: LoRA A and B for every projection of both layers, nothing else.
    assert not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], set(config["target_modules"])) == (r, alpha, TARGETS)
    assert config["base_model_name_or_path"] == str(assets["model"])
    adapter = load_file(out / "adapter_model.safetensors")
    assert len(adapter) == 2 * len(TARGETS) * 2
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter)

    # The base was frozen: the optimizer held the adapter's tensors only, and the base's file is untouched.
    optimizer = torch.load(out / "checkpoint-3" / "optimizer.pt", weights_only=True)
    assert sum(len(group["params"]) for group in optimizer["param_groups"]) == len(adapter)
    assert sha256(base_file) == base_hash
    # The adapter learned: every B matrix starts at zero and only a gradient moves it.
    assert all(tensor.abs().sum() > 0 for name, tensor in adapter.items() if ".lora_B." in name)

    merged_run = subprocess.run(
        [sys.executable, "-m", "grpo_kit.merge", "--adapter", str(out), "--output", str(merged_dir)],
        cwd=tmp_path,
        env=offline_env(tmp_path, **ONE_THREAD),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merged_run.returncode == 0, merged_run.stderr[-4000:]
    assert not (merged_dir / "adapter_config.json").exists()

    # Merged = base + (alpha / r) B A on the targeted projections; every other weight is the base's.
    base_weights, merged_weights = load_file(base_file), load_file(merged_dir / "model.safetensors")
    assert merged_weights.keys() == base_weights.keys()
    changed = 0
    for name, weight in base_weights.items():
        module = name.removesuffix(".weight").split(".")[-1]
        if module in TARGETS:
            prefix = "base_model.model." + name.removesuffix(".weight")
            delta = adapter[f"{prefix}.lora_B.weight"] @ adapter[f"{prefix}.lora_A.weight"] * (alpha / r)
            torch.testing.assert_close(merged_weights[name], weight + delta, rtol=0, atol=1e-6)
            changed += not merged_weights[name].equal(weight)
        else:
            assert merged_weights[name].equal(weight), name
    assert changed == 2 * len(TARGETS)

    # The merged model computes what base + adapter computes, loads without peft, and answers.
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    prompt = tokenizer.apply_chat_template(
        grpo_demo.get_gsm8k_questions("test", str(assets["data"]))["prompt"][0],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    merged_model = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(assets["model"]), str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged_model(**prompt).logits, reloaded(**prompt).logits, rtol=1e-4, atol=1e-5)
        generated = merged_model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 8
    assert isinstance(tokenizer.decode(generated[0, prompt["input_ids"].shape[1] :]), str)


# ----------------------------------------------------------------------------------------------------------------
# LoRA / QLoRA / vLLM settings


def test_use_peft_turns_on_the_references_lora():
    from trl import get_peft_config, get_quantization_config

    _, _, model_args = grpo_demo.parse_settings(["--use_peft"])
    lora = get_peft_config(model_args)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 64, 0.05)
    assert set(lora.target_modules) == TARGETS
    assert get_quantization_config(model_args) is None  # plain LoRA: the base stays in full precision
    _, _, model_args = grpo_demo.parse_settings([])
    assert get_peft_config(model_args) is None  # full fine-tuning unless asked


@pytest.fixture
def gpu_box(monkeypatch):
    """A CUDA machine with the GPU extras installed, as far as the checks can tell."""
    versions = {"vllm": "0.30.0", "bitsandbytes": "0.50.2"}
    monkeypatch.setattr(checks, "cuda_available", lambda: True)
    monkeypatch.setattr(checks, "installed_version", versions.get)
    return versions


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load_in_4bit"], "load_in_4bit: a quantized base model cannot be trained itself, only adapters on it: "),
        (
            ["--use_peft", "--load_in_4bit"],
            "load_in_4bit needs a CUDA GPU (bitsandbytes' quantized kernels) and this machine has none: "
            "drop --load_in_4bit and train LoRA in full precision with --use_peft alone",
        ),
        (["--use_peft", "--load_in_8bit"], "load_in_8bit needs a CUDA GPU"),
        (["--use_peft", "--load_in_4bit", "--load_in_8bit"], "load_in_4bit and load_in_8bit are both set: choose one"),
        (["--use_peft", "--lora_r", "0"], "lora_r=0: the adapter's rank must be at least 1"),
    ],
)
def test_quantization_and_lora_settings_this_machine_cannot_run_are_named(monkeypatch, args, message):
    monkeypatch.setattr(checks, "cuda_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        grpo_demo.parse_settings(args)
    assert message in str(stop.value)


def test_qlora_without_bitsandbytes_names_the_gpu_requirements(gpu_box):
    del gpu_box["bitsandbytes"]
    with pytest.raises(SystemExit, match=re.escape("needs bitsandbytes, which is not installed: pip install -r requ")):
        grpo_demo.parse_settings(["--use_peft", "--load_in_4bit"])


def test_qlora_under_zero3_needs_a_float_storage_dtype(gpu_box, monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(SystemExit, match="add --bnb_4bit_quant_storage bfloat16"):
        grpo_demo.parse_settings(["--use_peft", "--load_in_4bit"])
    _, _, model_args = grpo_demo.parse_settings(
        ["--use_peft", "--load_in_4bit", "--bnb_4bit_quant_storage", "bfloat16"]
    )
    assert model_args.load_in_4bit


def test_use_vllm_without_vllm_names_the_gpu_requirements(monkeypatch):
    monkeypatch.setattr(checks, "installed_version", lambda package: None)
    with pytest.raises(SystemExit) as stop:
        grpo_demo.parse_settings(["--use_vllm"])
    assert "use_vllm: vllm is not installed: pip install -r requirements-gpu.txt" in str(stop.value)


@pytest.mark.parametrize(
    ("args", "vllm", "message"),
    [
        (["--use_vllm"], "0.33.0", "use_vllm: vllm 0.33.0 is installed, TRL 1.16 works with 0.22.0 to 0.31.0"),
        (["--use_vllm", "--vllm_mode", "remote"], "0.30.0", "vllm_mode=remote: 'colocate'"),
        (["--use_vllm", "--vllm_gpu_memory_utilization", "1.5"], "0.30.0", "vllm_gpu_memory_utilization=1.5"),
    ],
)
def test_vllm_settings_that_cannot_work_are_named(gpu_box, args, vllm, message):
    gpu_box["vllm"] = vllm
    with pytest.raises(SystemExit) as stop:
        grpo_demo.parse_settings(args)
    assert message in str(stop.value)


def test_the_recipe_yamls_are_valid_settings_on_a_gpu_box(gpu_box):
    _, args, model_args = grpo_demo.parse_settings(["--config", str(ROOT / "configs" / "qwen_lora_vllm.yaml")])
    assert (args.use_vllm, args.vllm_mode, model_args.use_peft) == (True, "colocate", True)
    assert args.vllm_max_model_length == grpo_demo.MAX_PROMPT_TOKENS + args.max_completion_length
    _, args, model_args = grpo_demo.parse_settings(["--config", str(ROOT / "configs" / "qwen_qlora.yaml")])
    assert (model_args.use_peft, model_args.load_in_4bit, model_args.dtype) == (True, True, "bfloat16")


# ----------------------------------------------------------------------------------------------------------------
# Merge


@pytest.fixture
def adapter_run(tmp_path):
    """A base model folder and a LoRA adapter on it with non-zero B matrices, saved as a --use_peft run saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    tokenizer = smoke.build_tokenizer([grpo_demo.SYSTEM_PROMPT, *(p["question"] for p in smoke.make_problems(32))])
    smoke.build_tiny_model(tokenizer).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    model = get_peft_model(model, LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.save_pretrained(tmp_path / "run")
    tokenizer.save_pretrained(tmp_path / "run")
    return tmp_path, model.eval(), tokenizer


def test_merge_gives_the_adapted_models_outputs_in_full_precision(adapter_run):
    folder, adapted, tokenizer = adapter_run
    merged_dir = merge.merge_adapter(folder / "run", folder / "merged")

    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert merged.dtype == torch.float32  # no CUDA here: fp32, as the recipe trains on a CPU
    assert getattr(merged.config, "quantization_config", None) is None
    assert (merged_dir / "tokenizer.json").is_file() and not (merged_dir / "adapter_config.json").exists()
    inputs = tokenizer("Ava has 3 apples and gets 4 more.", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(merged(**inputs).logits, adapted(**inputs).logits, rtol=1e-4, atol=1e-5)


def test_merge_names_what_is_wrong_instead_of_a_traceback(adapter_run, tmp_path):
    folder, _, _ = adapter_run
    with pytest.raises(SystemExit, match="a full model .* already standalone: nothing to merge"):
        merge.merge_adapter(folder / "base", folder / "out")
    with pytest.raises(SystemExit, match="no adapter_config.json there"):
        merge.merge_adapter(tmp_path / "nowhere", folder / "out")
    with pytest.raises(SystemExit, match="--output must be another folder than --adapter"):
        merge.merge_adapter(folder / "run", folder / "run")
    with pytest.raises(SystemExit, match="no-such-model': no such folder. Give the base the adapter was trained on"):
        merge.merge_adapter(folder / "run", folder / "out", base=str(tmp_path / "no-such-model"))

    quantized = folder / "base-4bit"
    quantized.mkdir()
    config = json.loads((folder / "base" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match="is a quantized checkpoint: a merge needs full-precision weights"):
        merge.merge_adapter(folder / "run", folder / "out", base=str(quantized))


# ----------------------------------------------------------------------------------------------------------------
# Configs, pins and the GPU benchmark


@pytest.mark.parametrize(
    ("name", "distributed_type", "zero_stage", "mixed_precision"),
    [
        ("ddp.yaml", "MULTI_GPU", None, "bf16"),
        ("zero2.yaml", "DEEPSPEED", 2, "bf16"),
        ("zero3.yaml", "DEEPSPEED", 3, "bf16"),
        ("cpu_ddp.yaml", "MULTI_GPU", None, "no"),
    ],
)
def test_accelerate_configs_load_as_documented(name, distributed_type, zero_stage, mixed_precision):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / name))
    assert config.distributed_type == distributed_type
    assert config.mixed_precision == mixed_precision
    assert (config.deepspeed_config or {}).get("zero_stage") == zero_stage
    if zero_stage == 3:
        assert config.deepspeed_config["zero3_save_16bit_model"]  # the saved model loads without DeepSpeed


def test_gpu_requirements_pin_a_vllm_this_trl_accepts():
    from trl import import_utils

    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements-gpu.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert {"flash-attn", "vllm", "bitsandbytes", "deepspeed"} <= pins.keys()
    source = Path(import_utils.__file__).read_text()
    assert 'Version("{}") <= _vllm_base_version <= Version("{}")'.format(*checks.VLLM_RANGE) in source
    low, high = (tuple(map(int, v.split("."))) for v in checks.VLLM_RANGE)
    assert low <= tuple(map(int, pins["vllm"].split("."))) <= high


def test_gpu_benchmark_runs_its_code_path_on_cpu(tmp_path):
    report = tmp_path / "throughput.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"), "--dry-run", "--steps", "2"]
    result = subprocess.run(
        [*command, "--json", str(report)],
        cwd=tmp_path,
        env=offline_env(tmp_path, **ONE_THREAD),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = {r["variant"]: r for r in json.loads(report.read_text())["results"]}
    assert rows.keys() == {"full", "lora"}
    for row in rows.values():
        assert row["steps"] == 2 and row["mean_step_s"] > 0 and row["generated_tokens_per_s"] > 0
        assert row["mean_completion_tokens"] == 16  # every completion ran to its full length
    assert rows["lora"]["trainable_params"] < rows["full"]["trainable_params"]
    assert "| full | transformers |" in result.stdout
