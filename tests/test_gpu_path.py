"""The CUDA path's traps, proven on the CPU: one GPU for one process, a LoRA base that vLLM's weight syncs keep bit for
bit, a memory plan before loading, rollouts cast once, one input-gradient hook, a bf16 KL reference."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, resolved

import grpo_demo
from grpo_kit import RecipeError, checks, models, patches


# ---------------------------------------------- One GPU for a single process -----------------------------------------
def test_one_process_on_an_eight_gpu_box_loads_whole_on_one_gpu_and_says_how_to_use_all(
    monkeypatch, tmp_path, tiny_dir, caplog
):
    from trl import GRPOConfig
    from trl.trainer import utils as trl_utils

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert args.device.type == "cpu"  # the device set up here; from now on the machine pretends to have 8 GPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    args.use_cpu, args._n_gpu = False, 8  # transformers counts every visible GPU for a single process
    model_args = SimpleNamespace(dtype="float32", attn_implementation="sdpa", model_revision=None)
    with caplog.at_level("WARNING", logger="grpo_demo"):
        kwargs = models.init_kwargs(model_args, args)
    assert kwargs["device_map"] == {"": 0}
    assert args.n_gpu == 1  # no nn.DataParallel (which GRPOTrainer refuses)
    said = [r.getMessage() for r in caplog.records if "GPUs visible" in r.getMessage()]
    assert len(said) == 1 and "accelerate launch --config_file configs/ddp.yaml --num_processes 8" in said[0]

    # TRL's placement: create_model_from_path sets device_map="auto" (every GPU) unless it is given one
    loaded = {}
    from transformers import Qwen2ForCausalLM

    monkeypatch.setattr(Qwen2ForCausalLM, "from_pretrained", classmethod(lambda cls, path, **kw: loaded.update(kw)))
    monkeypatch.setattr(trl_utils, "PartialState", lambda: SimpleNamespace(device=torch.device("cuda", 0)))
    trl_utils.create_model_from_path(str(tiny_dir), **kwargs)
    assert loaded["device_map"] == {"": 0}
    trl_utils.create_model_from_path(str(tiny_dir), **models.init_kwargs(model_args))  # without the recipe's choice
    assert loaded["device_map"] == "auto"


def test_under_a_launcher_or_on_the_cpu_the_trainer_places_the_model(monkeypatch, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    model_args = SimpleNamespace(dtype="float32", attn_implementation="sdpa", model_revision=None)
    assert "device_map" not in models.init_kwargs(model_args, args)  # the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "8")
    args.use_cpu = False
    assert "device_map" not in models.init_kwargs(model_args, args)  # accelerate launch: TRL sets None, DDP places


# ---------------------------------------------- LoRA + vLLM: the base stays ------------------------------------------
def lora_model(tiny):
    from peft import LoraConfig, get_peft_model

    _, model = tiny
    torch.manual_seed(0)
    base = type(model)(model.config).to(torch.bfloat16)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=targets))
    return peft_model


def vllm_syncs(model, cycles: int) -> dict:
    """`cycles` weight syncs as TRL's colocate mode makes them (VLLMGeneration._iter_named_params: merge, read,
    unmerge), the adapter trained a little between two; the last merged weights vLLM was handed."""
    from trl.generation.vllm_generation import VLLMGeneration

    gather = SimpleNamespace(gather_params=lambda params: nullcontext(), is_fsdp=False)
    sync = SimpleNamespace(model=model, _dist=gather, _fix_param_name_to_vllm=lambda name, extra_prefixes=None: name)
    adapters = [p for name, p in model.named_parameters() if "lora_B" in name]
    handed = {}
    for _ in range(cycles):
        with torch.no_grad():
            for p in adapters:
                p.add_(torch.randn_like(p) * 0.01)  # a training step's change of the adapter
        handed = {name: p.clone() for name, p in VLLMGeneration._iter_named_params(sync)}
    return handed


def base_weights(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


def test_lora_base_is_bit_exact_after_many_vllm_syncs_and_vllm_gets_the_merged_weights(tiny):
    drifting = lora_model(tiny)
    start = base_weights(drifting)
    vllm_syncs(drifting, 50)
    changed = sum(int((start[n] != p).sum()) for n, p in base_weights(drifting).items())
    assert changed > 0  # TRL's in-place bf16 merge and unmerge alone: the frozen base drifts

    kept = lora_model(tiny)
    start = base_weights(kept)
    assert patches.keep_base_exact(kept) == 7 * 2  # 7 projections, 2 layers
    handed = vllm_syncs(kept, 50)
    end = base_weights(kept)
    assert all(torch.equal(start[name], end[name]) for name in start)  # bit for bit
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(handed[q], start["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    layer = kept.base_model.model.model.layers[0].self_attn.q_proj
    merged = start[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"].float() + layer.get_delta_weight(
        "default"
    )
    torch.testing.assert_close(handed[q].float(), merged, atol=1e-2, rtol=0)  # w + BA, in bf16


@pytest.mark.parametrize(("delta", "kept"), [(1e-5, 0.23), (3e-5, 0.60), (1e-4, 0.98)])
def test_vllm_gets_the_lora_update_rounded_to_bf16_as_the_readme_states(delta, kept):
    """The gap README.md ("LoRA and vLLM") and configs/qwen_lora_vllm.yaml state: PEFT merges the adapter into the
    bf16 base in place (peft/tuners/lora/layer.py, `base_layer.weight.data += delta_weight`) and vLLM is handed the
    rounded sum. Base weights ~N(0, 0.025) as Qwen's; an update of std `delta`: the share of it vLLM sees."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)).to(torch.bfloat16)
    torch.nn.init.normal_(base[0].weight, std=0.025)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=64, target_modules=["0"]))
    layer = model.base_model.model[0]
    layer.lora_A["default"].float(), layer.lora_B["default"].float()  # fp32 adapters, as the recipe trains them
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(torch.randn_like(layer.lora_B["default"].weight))
        intended = layer.get_delta_weight("default").float()
        scale = delta / intended.std()
        layer.lora_B["default"].weight.mul_(scale.to(layer.lora_B["default"].weight.dtype))
        intended = layer.get_delta_weight("default").float()
    before = layer.get_base_layer().weight.detach().float().clone()
    patches.keep_base_exact(model)
    model.merge_adapter()  # what TRL does before it reads the weights for vLLM
    seen = layer.get_base_layer().weight.detach().float() - before
    model.unmerge_adapter()
    assert float((seen * intended).sum() / (intended * intended).sum()) == pytest.approx(kept, abs=0.04)
    assert torch.equal(layer.get_base_layer().weight.detach().float(), before)  # the base restored


def test_the_lora_vllm_preset_is_guarded():
    import yaml

    preset = yaml.safe_load((ROOT / "configs" / "qwen_lora_vllm.yaml").read_text())
    assert preset["use_peft"] and preset["use_vllm"]
    trainer = SimpleNamespace(
        args=SimpleNamespace(use_vllm=True, bf16=False, fp16=False), is_deepspeed_enabled=False, ref_model=None
    )
    guarded = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(patches, "keep_base_exact", lambda model: guarded.append(model) or 1)
        trainer.model = torch.nn.Linear(2, 2)
        patches.prepare_trained_model(trainer)
    assert guarded == [trainer.model]  # the recipe guards every vLLM run's model (a no-op without adapters)


# ---------------------------------------------- The memory plan ----------------------------------------------------
def skeleton(kind: str, **dims):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(kind, **dims)
    with torch.device("meta"):
        return config, AutoModelForCausalLM.from_config(config)


LLAMA_8B = dict(
    hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
    vocab_size=128256, tie_word_embeddings=False,
)  # fmt: skip
QWEN_1_5B = dict(
    hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
    vocab_size=151936, tie_word_embeddings=True,
)  # fmt: skip


def test_an_8b_full_fine_tune_on_one_141_gb_gpu_is_refused_with_what_fits(fake_cuda, monkeypatch):
    monkeypatch.setattr(checks, "gpu_memory", lambda: 141e9)
    v = resolved([])
    config, model = skeleton("llama", **LLAMA_8B)
    with pytest.raises(RecipeError) as refused:
        checks.memory_fits(config, model, v, v)
    said = str(refused.value)
    assert "8.03 B parameters" in said and "would need ~147 GiB" in said and "the GPU has 131 GiB" in said
    options = ["LoRA (--use_peft): ~", "QLoRA (--use_peft --load_in_4bit): ~", "ZeRO-2 over 8 GPUs", "ZeRO-3 over 8"]
    for option in [*options, "an 8-bit optimizer (--optim paged_adamw_8bit): ~102 GiB"]:
        assert option in said, option
    assert "shorter completions" not in said  # 786 tokens or 393: the weights, gradients and moments alone overflow


REFUSED_OPTIONS = {  # (the run's settings, warm-started, the options the settings would refuse for it)
    "a warm start": (["--warm_start_rows", "8"], True, ["QLoRA"]),  # it trains every weight: no quantized base
    "continuous batching": (["--use_transformers_continuous_batching", "true", "--dtype", "bfloat16"], False,
                            ["LoRA", "QLoRA"]),  # TRL's cast to bf16 would drop the fp32 adapters
    "neither": ([], False, []),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED_OPTIONS, ids=list(REFUSED_OPTIONS))
def test_what_fits_instead_leaves_out_what_the_settings_would_refuse(fake_cuda, gpu_extras, monkeypatch, case):
    """The options left out are those the settings' own checks refuse for the run (its twin rules there)."""
    extra, warm, left_out = REFUSED_OPTIONS[case]
    monkeypatch.setattr(checks, "gpu_memory", lambda: 40e9)
    v = resolved(extra)
    with pytest.raises(RecipeError) as refused:
        checks.memory_fits(*skeleton("llama", **LLAMA_8B), v, v, warm=warm)
    offered = str(refused.value).split("What fits, estimated: ")[1]
    for mode, flags in {"LoRA": ["--use_peft"], "QLoRA": ["--use_peft", "--load_in_4bit"]}.items():
        assert (f"{mode} (--use_peft" not in offered) == (mode in left_out), offered
        with pytest.raises(RecipeError) if mode in left_out else nullcontext():  # as the user would run it
            resolved([*extra, *flags])


VLLM_MODES = {"transformers": [], "colocate": ["--use_vllm", "--vllm_mode", "colocate"],
              "server": ["--use_vllm", "--vllm_mode", "server"]}  # fmt: skip


@pytest.mark.parametrize("vllm", VLLM_MODES.values(), ids=VLLM_MODES.keys())
def test_what_fits_instead_is_said_as_a_command_the_settings_accept(fake_cuda, gpu_extras, monkeypatch, vllm):
    """QLoRA is refused with vLLM: suggested for a vLLM run, it says to drop --use_vllm, and its estimate has no vLLM
    in it; LoRA works with vLLM, so its estimate keeps the run's vLLM."""
    monkeypatch.setattr(checks, "gpu_memory", lambda: 141e9)
    v = resolved(vllm)
    plan = checks.memory_plan(v, v, 141e9)
    shape = checks.model_shape(*skeleton("llama", **LLAMA_8B))
    options = dict(checks.alternatives(shape, plan))
    lora = sum(checks.memory_estimate(shape, {**plan, "mode": "lora", "zero": None}).values())
    qlora = sum(checks.memory_estimate(shape, {**plan, "mode": "qlora", "vllm_share": 0.0, "server": None}).values())
    said = ", without --use_vllm" if vllm else ""
    assert options["LoRA (--use_peft)"] == lora and options[f"QLoRA (--use_peft --load_in_4bit{said})"] == qlora
    assert (lora > sum(checks.memory_estimate(shape, {**plan, "mode": "lora", "vllm_share": 0.0}).values())) == (
        "colocate" in vllm
    )  # colocate's reserved share counted in LoRA's estimate


def test_the_recipes_1_5b_full_fine_tune_fits(fake_cuda, monkeypatch, caplog):
    monkeypatch.setattr(checks, "gpu_memory", lambda: 141e9)
    v = resolved([])
    config, model = skeleton("qwen2", **QWEN_1_5B)
    with caplog.at_level("INFO", logger="grpo_demo"):
        checks.memory_fits(config, model, v, v)
    assert "Memory plan: ~31 GiB of the GPU's 131 GiB" in caplog.text


def test_the_plan_is_checked_before_the_weights_load(fake_cuda, monkeypatch, tmp_path):
    monkeypatch.setattr(checks, "gpu_memory", lambda: 24e9)  # a 24 GB GPU
    config, _ = skeleton("qwen2", **QWEN_1_5B)
    config.save_pretrained(tmp_path / "model")
    v = resolved(["--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(tmp_path / "out")])
    with pytest.raises(RecipeError, match="would need ~31 GiB.*LoRA \\(--use_peft\\): ~6.6 GiB.*--memory_plan false"):
        checks.model_and_disk(v, v)
    checks.model_and_disk(v, v, plan_memory=False)  # the user's word against the estimate: nothing refused
    run = resolved(["--memory_plan", "false"])
    assert run.memory_plan is False


def test_the_memory_table_is_the_estimators():
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_table", ROOT / "benchmarks" / "memory_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert (ROOT / "docs" / "memory.md").read_text(encoding="utf-8") == table.table()


# ---------------------------------------------- Rollouts, hooks, the reference -------------------------------------
def trainer_for(tiny_dir, gsm8k_dir, tmp_path, extra: list[str], steps: int = 1):
    from trl import GRPOTrainer, get_peft_config

    argv = [
        "--model_name_or_path", str(tiny_dir), "--dataset", str(gsm8k_dir), "--output_dir", str(tmp_path),
        "--use_cpu", "true", "--bf16", "true", "--report_to", "none", "--max_steps", str(steps), "--warmup_steps", "0",
        "--save_strategy", "no", "--log_completions", "false", "--num_generations", "2",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--max_completion_length", "6",
        "--lora_r", "2", *extra,
    ]  # fmt: skip
    run, args, model_args = grpo_demo.parse_settings(argv)
    model_args.dtype = model_args.dtype or "float32"
    args.model_init_kwargs = models.init_kwargs(model_args, args)
    trainer = GRPOTrainer(
        model=str(tiny_dir),
        processing_class=models.load_tokenizer(model_args, args),
        reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"])) for c in completions]],
        args=args,
        train_dataset=grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir)),
        peft_config=get_peft_config(model_args),
    )
    patches.prepare_trained_model(trainer)
    return trainer


def weight_casts(model, run) -> int:
    """How many times a weight was cast while `run()` ran (aten._to_copy of a tensor shaped like a q_proj weight)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shape = tuple(next(m for n, m in model.named_modules() if n.endswith("q_proj")).weight.shape)

    class Count(TorchDispatchMode):
        casts = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == shape:
                Count.casts += 1
            return func(*args, **(kwargs or {}))

    with Count():
        run()
    return Count.casts


def test_a_rollout_casts_each_weight_once_and_a_fp32_lora_model_computes_in_bf16(tiny_dir, gsm8k_dir, tmp_path):
    trainer = trainer_for(tiny_dir, gsm8k_dir, tmp_path, [])
    model, ids = trainer.model, torch.tensor([[5, 6, 7, 8]])
    shape = next(m for n, m in model.named_modules() if n.endswith("q_proj")).weight.shape
    weights = sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.shape == shape)
    greedy = dict(do_sample=False, min_new_tokens=12, max_new_tokens=12)
    assert weight_casts(model, lambda: model.generate(ids, **greedy)) == weights  # once per generation, not per token
    cache = model.generate(ids, **greedy, return_dict_in_generate=True).past_key_values
    assert {(layer.keys.dtype, layer.values.dtype) for layer in cache.layers} == {(torch.bfloat16, torch.bfloat16)}

    lora = trainer_for(tiny_dir, gsm8k_dir, tmp_path / "lora", ["--use_peft", "--dtype", "float32"])
    seen = []
    q_proj = next(m for n, m in lora.model.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
    q_proj.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    lora.model.generate(ids, **greedy)
    assert set(seen) == {torch.bfloat16}  # PeftModel.generate skips the wrapped forward: fp32 before, flash refused


def test_twenty_steps_leave_the_embedding_with_the_hooks_it_had_after_one(tiny_dir, gsm8k_dir, tmp_path):
    from transformers import TrainerCallback

    trainer = trainer_for(tiny_dir, gsm8k_dir, tmp_path, ["--activation_checkpointing", "true"], steps=20)
    embedding, counts = trainer.model.get_input_embeddings(), {}

    class Hooks(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            counts[state.global_step] = len(embedding._forward_hooks)

    trainer.add_callback(Hooks())
    trainer.train()
    assert counts[20] == counts[1] >= 1, counts


def test_the_kl_reference_computes_in_bf16_and_deepspeed_loads_bf16(fake_cuda, monkeypatch):
    ref = torch.nn.Linear(4, 4)
    trainer = SimpleNamespace(ref_model=ref, is_deepspeed_enabled=False, args=SimpleNamespace(bf16=True))
    assert patches.reference_in_bf16(trainer) and ref.weight.dtype == torch.bfloat16
    v = resolved([])
    assert models.weights_dtype(v, v) == "float32"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert models.weights_dtype(v, v) == "bfloat16"  # DeepSpeed keeps fp32 master weights of its own


def test_docs_name_the_memory_table():
    assert "memory_table.py" in Path(ROOT / "docs" / "memory.md").read_text()


@pytest.mark.parametrize("flag, planned", [([], True), (["--memory_plan", "false"], False)])
def test_memory_plan_false_reaches_the_check_before_the_weights(monkeypatch, flag, planned):
    seen = []
    monkeypatch.setattr(checks, "enough_data", lambda *a: None)
    monkeypatch.setattr(checks.runs, "same_data", lambda *a: None)
    monkeypatch.setattr(checks, "model_and_disk", lambda m, t, tokens, plan, *longest: seen.append(plan))
    v = resolved(flag)
    checks.before_the_weights([], v, v, v)
    assert seen == [planned]


def test_rollouts_decode_by_the_recipes_rules_not_the_model_folders_generation_config(tiny_dir, gsm8k_dir, tmp_path):
    """A generation_config.json that suppresses every digit: transformers' generate would fill TRL's rollout config
    with it (its unset values come from the model's), so rollouts would hold no digit and evaluations would."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_dir, folder)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    digits = [i for token, i in tokenizer.get_vocab().items() if any(c.isdigit() for c in token)]
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "suppress_tokens": digits}))
    trainer = trainer_for(folder, gsm8k_dir, tmp_path / "run", ["--max_completion_length", "48"])
    prompt = tokenizer.apply_chat_template(grpo_demo.chat_prompt("What is 12 + 30?"), add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)  # fmt: skip
    ids = prompt["input_ids"].repeat(16, 1)
    torch.manual_seed(0)
    out = trainer.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 generation_config=trainer.generation_config)  # fmt: skip
    assert set(out[:, ids.shape[1] :].flatten().tolist()) & set(digits)  # digits sampled: the suppression not used
    assert json.loads((folder / "generation_config.json").read_text())["suppress_tokens"] == digits  # the file kept
    assert trainer.model.generation_config.suppress_tokens == digits  # and the model's config, once generation ends


def test_the_plan_counts_the_parameters_under_zero3(monkeypatch):
    """Under ZeRO-3 the Trainer's arguments set transformers' DeepSpeed config, and `from_config` then builds inside
    `deepspeed.zero.Init`, which allocates, partitions and empties every parameter (a count of 0). A stand-in of
    that path, from transformers 5.24's `_from_config`: the config set, and a `deepspeed.zero.Init` that fails if
    entered. The skeleton is built without it, every parameter counted."""
    import importlib.machinery
    import sys
    import types
    import weakref

    from transformers.integrations import deepspeed as hf_deepspeed

    class Zero3Config:
        config = {"zero_optimization": {"stage": 3}}

        def is_zero3(self):
            return True

    class Init:
        def __init__(self, *args, **kwargs):
            pytest.fail("the skeleton was built inside deepspeed.zero.Init")

    config, _ = skeleton("qwen2", **QWEN_1_5B)  # the libraries imported before the stand-in goes in
    stand_in = types.ModuleType("deepspeed")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
    stand_in.zero = types.SimpleNamespace(Init=Init)
    held = Zero3Config()
    monkeypatch.setitem(sys.modules, "deepspeed", stand_in)
    monkeypatch.setattr(hf_deepspeed, "_hf_deepspeed_config_weak_ref", weakref.ref(held))
    assert hf_deepspeed.is_deepspeed_zero3_enabled()  # as under accelerate launch --config_file configs/zero3.yaml
    counted = checks.model_shape(config, models.shapes_only(config))["parameters"]
    assert round(counted / 1e9, 2) == 1.54
    assert hf_deepspeed.is_deepspeed_zero3_enabled()  # the config is back for the trainer


# A micro-batch of one short completion: the training's activations (~60 MB) far under the base gathered whole
LORA_ZERO3 = dict(mode="lora", zero="3", processes=8, batch=1, generation_batch=1, prompt=256, completion=64)


@pytest.mark.parametrize(
    ("change", "part", "gib"),
    [
        # ZeRO-3 shards the bf16 base over the 8 processes: 3.1 GB / 8
        ({}, "base weights (bf16, sharded)", 0.36),
        ({"mode": "qlora"}, "base weights (4-bit, sharded)", None),
        # transformers generates: TRL gathers the whole model first (unwrap_model_for_generation), 7/8 of it more
        ({}, "KV cache and gathered weights, or training activations, the larger", "gathered"),
        # a vLLM server: no KV cache here, but each sync gathers the whole model to merge the adapters into it
        # (VLLMGeneration._iter_named_params) and patches.keep_base_exact copies the merged layers' base
        ({"server": True}, checks.SYNC_HOLDS, "gathered and copied"),
        # vLLM colocated: the same gather and copy, while vLLM holds its share
        ({"vllm_share": 0.3}, checks.SYNC_HOLDS, "gathered and copied"),
    ],
)
def test_lora_under_zero3_shards_the_base_and_counts_it_gathered(change, part, gib):
    config, model = skeleton("qwen2", **QWEN_1_5B)
    shape = checks.model_shape(config, model)
    parts = checks.memory_estimate(shape, {**LORA_ZERO3, "gpu": 141e9, **change})
    assert part in parts, sorted(parts)
    base = 2 * shape["parameters"]
    if gib == "gathered":  # the whole bf16 base less the shard held: 7/8 of 3.1 GB (with a few MB of KV cache)
        assert 7 / 8 * base <= parts[part] < base
    elif gib == "gathered and copied":  # and the layers LoRA targets copied, all but the embeddings: 2.44 GiB
        assert parts[part] == 7 / 8 * base + 2 * (shape["parameters"] - shape["embedding"])
    elif gib is not None:
        assert round(parts[part] / 2**30, 2) == pytest.approx(gib, abs=0.05)


def test_a_vllm_sync_and_the_training_passes_are_not_counted_at_once():
    """A LoRA run's vLLM sync (the merged layers' base copied, `patches.keep_base_exact`) runs before a step's
    generation, the training's activations after it: the peak holds the larger of the two, not their sum."""
    config, model = skeleton("qwen2", **QWEN_1_5B)
    shape = checks.model_shape(config, model)
    plan = dict(mode="lora", batch=16, generation_batch=64, prompt=256, completion=786, gpu=141e9, vllm_share=0.3)
    copy = 2 * (shape["parameters"] - shape["embedding"])
    recipe, short = checks.memory_estimate(shape, plan), checks.memory_estimate(shape, {**plan, "batch": 1})
    assert short[checks.SYNC_HOLDS] == copy  # one completion's activations: the copy is the larger
    assert recipe[checks.SYNC_HOLDS] > copy  # the recipe's micro-batch: its activations are
    without = checks.memory_estimate(shape, {**plan, "vllm_share": 0.0})  # transformers generates: no sync
    assert sum(recipe.values()) - 0.3 * 141e9 == sum(without.values())  # the share more, nothing for the copy


@pytest.mark.parametrize(
    ("change", "part", "gib"),
    [
        # DDP: a second fp32 copy of the gradients in its buckets, per process
        ({"processes": 8}, "DDP gradient buckets", 5.7),
        # beta > 0: TRL's reference model for the KL term, in bf16 (sharded under ZeRO-3)
        ({"beta": 0.04}, "reference model (bf16, KL)", 2.9),
        ({"beta": 0.04, "zero": "3", "processes": 8}, "reference model (bf16, KL)", 0.36),
    ],
)
def test_the_estimate_holds_what_trl_allocates(change, part, gib):
    config, model = skeleton("qwen2", **QWEN_1_5B)
    shape = checks.model_shape(config, model)
    plan = dict(mode="full", batch=16, generation_batch=64, prompt=256, completion=786, gpu=141e9)
    parts = checks.memory_estimate(shape, {**plan, **change})
    assert round(parts[part] / 2**30, 2) == pytest.approx(gib, abs=0.05)
    # TRL 1.16's fused LM head holds logit tiles of 4,096 tokens x 32,768 ids (forward, and backward), never a
    # completion's logits whole (16 x 786 x 151,936 in bf16: 3.6 GiB)
    training = {**plan, "generation_batch": 1}  # the training's activations are the larger part
    logits = sum(checks.memory_estimate(shape, training).values()) - sum(
        checks.memory_estimate({**shape, "vocab": 1}, training).values()
    )
    assert logits == 2 * 4096 * 32768 * 2 - 2 * 4096 * 1 * 2
    under_zero3 = checks.memory_estimate(shape, {**plan, "zero": "3", "processes": 8})  # gathered to generate
    assert "KV cache and gathered weights, or training activations, the larger" in under_zero3
    for apart in ({"server": True}, {"gather": False}):  # a vLLM server generates; TRL told not to gather
        assert "KV cache or training activations, the larger" in checks.memory_estimate(
            shape, {**plan, "zero": "3", "processes": 8, **apart}
        )
