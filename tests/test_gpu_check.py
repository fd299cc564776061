"""benchmarks/gpu_check.py, the GPU acceptance check: its whole code path on the CPU (--dry-run), and the rules it
decides by (generation settings, pass/fail, the time plan) without running anything."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, offline_env

from benchmarks import gpu_check


@pytest.mark.slow
def test_dry_run_trains_evaluates_and_measures_full_and_lora(tmp_path):
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--json", str(report_path)],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["failures"] == []
    variants = report["variants"]
    assert variants.keys() == {"full", "lora"}
    for name, v in variants.items():
        assert v["status"] == "passed", (name, v)
        assert v["steps"] == 2 and v["mean_step_s"] > 0 and v["generated_tokens_per_s"] > 0
        assert v["mean_completion_tokens"] == 64  # every completion ran to its full length
        assert v["steps_with_gradient"] >= 1
        assert v["model"]["attention"] == "sdpa" and v["flash_attention"] is False  # CPU
        assert v["peak_gpu_memory_gib"] is None  # torch counts GPU memory only on CUDA
        for evaluation in ("baseline", "final"):
            assert v["evaluation"][evaluation]["n"] == 4 and v["evaluation"][evaluation]["seconds"] >= 0
            assert v["evaluation"][evaluation]["sampled"]  # pass@k from one prefill, as on the GPU
        assert "grpo_demo.py" in v["command"] and "--use_cpu true" in v["command"]
        assert not list((tmp_path / "outputs" / "gpu_check" / name / "output").glob("*.safetensors"))  # cleaned up
    full, lora = variants["full"], variants["lora"]
    assert full["model"]["weights_dtype"] == ["float32"]  # the CPU trains in fp32
    assert full["movement"]["measured_on"] == "all weights"
    assert full["movement"]["parameters"] == full["model"]["trainable_parameters"]  # every weight compared
    assert full["movement"]["moved_fraction"] >= 0.9
    # AdamW moves at most about lr a step: between the random walk's sqrt(T) x lr and T x lr (gradients all alike)
    top = 2**0.5  # 2 steps
    assert 0.5 <= full["movement"]["realised_over_expected"] <= top
    assert lora["movement"]["measured_on"] == "LoRA B matrices" and lora["movement"]["moved_fraction"] > 0.5
    assert 0.5 <= lora["movement"]["realised_over_expected"] <= top
    assert "--use_peft" in lora["command"]
    assert lora["model"]["trainable_parameters"] < full["model"]["trainable_parameters"]
    assert report["environment"]["versions"]["trl"] and report["environment"]["hardware"]["gpu_count"] >= 0
    assert any(line.startswith("| full | passed | transformers |") for line in result.stdout.splitlines())
    assert "PASSED" in result.stdout


def test_sampling_is_restricted_to_the_tokenizers_ids():
    assets = {"tokenizer_tokens": 627, "model_vocab": 151936}
    transformers_kwargs = gpu_check.generation_kwargs(gpu_check.BY_NAME["full"], 128, assets)
    assert transformers_kwargs["min_new_tokens"] == 128
    assert transformers_kwargs["suppress_tokens"] == list(range(627, 151936))
    vllm_kwargs = gpu_check.generation_kwargs(gpu_check.BY_NAME["full-vllm"], 128, assets)
    assert vllm_kwargs == {"min_tokens": 128, "allowed_token_ids": list(range(627))}
    tiny = {"tokenizer_tokens": 627, "model_vocab": 627}  # the dry run's model: nothing to suppress
    assert gpu_check.generation_kwargs(gpu_check.BY_NAME["lora"], 16, tiny) == {"min_new_tokens": 16}


def test_the_default_plan_fits_its_budget():
    steps, completion = gpu_check.REAL["steps"], gpu_check.REAL["completion"]
    estimates = {v.name: v.estimate(steps, completion) for v in gpu_check.VARIANTS}
    training = gpu_check.BUILD_ESTIMATE_S + sum(s for name, s in estimates.items() if name != "full-786")
    assert training < gpu_check.BUDGET_S == 480  # every training variant, with room to spare in 8 minutes
    assert f"{training:.0f} s" in gpu_check.__doc__  # the docstring states the estimate the code makes
    # the memory check: one step of 786 tokens, last; in the budget where vllm and bitsandbytes are not installed
    assert gpu_check.VARIANTS[-1].name == "full-786" and gpu_check.VARIANTS[-1].shaped(gpu_check.REAL)["steps"] == 1
    without = training - estimates["qlora"] - estimates["full-vllm"] + estimates["full-786"]
    assert without < gpu_check.BUDGET_S and f"({without:.0f} s in all)" in gpu_check.__doc__


def test_the_memory_plan_is_read_from_the_recipes_log(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("x\nINFO Memory plan: ~1,234 GiB of the GPU's 140 GiB (weights (fp32) 5.7 GiB)\n")
    assert gpu_check.memory_planned(log) == 1234.0
    log.write_text("Memory plan: ~6.5 GiB of the GPU's 140 GiB (...)\n")
    assert gpu_check.memory_planned(log) == 6.5
    log.write_text("no plan on a CPU\n")
    assert gpu_check.memory_planned(log) is None
    assert gpu_check.memory_planned(tmp_path / "missing.txt") is None


def test_only_counted_variants_fail_the_check():
    passed = {"status": "passed"}
    assert gpu_check.failures({"full": passed, "qlora": {"status": "skipped", "reason": "not installed"}}) == []
    assert gpu_check.failures({"full": passed, "cb-bf16": {"status": "did not run", "error": "boom"}}) == []
    assert gpu_check.failures({"full": passed, "lora": {"status": "failed", "problems": ["no eval/final"]}}) == [
        "lora: no eval/final"
    ]
    assert gpu_check.failures({"full": {"status": "skipped"}}) == ["no variant ran: nothing was checked"]
    assert gpu_check.failures({"full": {"status": "failed", "error": "stopped after 300 s: --timeout"}}) == [
        "full: stopped after 300 s: --timeout"
    ]


def passing(name: str, dry_run: bool = False) -> dict:
    """What a variant that trained leaves, as `measure` reads it: every assertion of the check met."""
    variant = gpu_check.BY_NAME[name]
    base, trainable = gpu_check.expected_dtypes(variant, dry_run)
    summary = {"n": 16, "seconds": 1.0, "sampled": True}
    return {
        "steps": 3,
        "steps_with_gradient": 3,
        "first_step_with_gradient": 1,
        "model": {"weights_dtype": sorted({base, *trainable}), "trainable_dtype": sorted(trainable),
                  "attention": "sdpa" if dry_run else "flash_attention_2"},
        "evaluation": {"baseline": summary, "final": summary},
        "health": {"status": "ok", "findings": []},
        "movement": {"measured_on": "LoRA B matrices" if variant.adapters else "all weights", "moved_fraction": 1.0,
                     "realised_over_expected": 0.7},
        "vllm_sync": {"syncs": [{"step": step, "compared": 4096, "differing": 0, "moved_since_start": 100 * step}
                                for step in range(3)]},
    }  # fmt: skip


@pytest.mark.parametrize("name", ["full", "lora", "qlora", "full-vllm", "lora-vllm"])
def test_a_variant_that_trained_passes(name):
    assert gpu_check.problems(gpu_check.BY_NAME[name], passing(name), 3, flash=True) == []
    assert gpu_check.problems(gpu_check.BY_NAME[name], passing(name, dry_run=True), 3, dry_run=True) == []


WEAKENED = {  # (variant, what changes in the result, what the check must then say)
    "half the expected move": ("full", ("movement", "realised_over_expected", 0.49), "moved 0.49 of AdamW's"),
    "no gradient at all": ("full", ("movement", "realised_over_expected", 0.0), "the updates did not land"),
    "LoRA B unmoved": ("lora", ("movement", "realised_over_expected", 0.0), "LoRA B matrices moved 0.00"),
    "few B entries moved": ("lora", ("movement", "moved_fraction", 0.4), "40.0% of the LoRA B entries"),
    "bf16 weights for full fine-tuning": ("full", ("model", "weights_dtype", ["bfloat16"]), "dtypes: weights"),
    "bf16 adapters": ("lora", ("model", "trainable_dtype", ["bfloat16"]), "trainable ['bfloat16']"),
    "QLoRA adapters left in bf16": ("qlora", ("model", "trainable_dtype", ["bfloat16"]), "dtypes"),
    "LoRA on an fp32 base": ("lora", ("model", "weights_dtype", ["float32"]), "expected weights with bfloat16"),
    "sdpa where flash_attn imports": ("full", ("model", "attention", "sdpa"), "flash_attention_2 was expected"),
    "vLLM without a gradient": ("full-vllm", ("steps_with_gradient", None, 0), "no step had a gradient"),
    "a stale vLLM sync": ("full-vllm", ("vllm_sync", "syncs", [{"step": 0, "compared": 4096, "differing": 0,
                          "moved_since_start": 0}, {"step": 1, "compared": 4096, "differing": 300,
                          "moved_since_start": 300}, {"step": 2, "compared": 4096, "differing": 0,
                          "moved_since_start": 300}]), "a stale or broken weight sync"),
    "a step without a sync": ("lora-vllm", ("vllm_sync", "syncs", [{"step": 0, "compared": 4096, "differing": 0,
                              "moved_since_start": 0}]), "did not sync vLLM before step(s) [2, 3]"),
    "no sync compared": ("full-vllm", ("vllm_sync", None, None), "no vllm_sync.json"),
    "no name matched": ("full-vllm", ("vllm_sync", "syncs", [{"step": s, "compared": 0, "differing": 0,
                        "moved_since_start": 0} for s in range(3)]), "matched one of the trainer's by name"),
    "nothing moved to tell": ("lora-vllm", ("vllm_sync", "syncs", [{"step": s, "compared": 9, "differing": 0,
                              "moved_since_start": 0} for s in range(3)]), "cannot be told from a stale"),
    "the comparison failed": ("full-vllm", ("vllm_sync", "syncs", [{"step": 1, "error": "AttributeError: x"}]),
                              "could not be compared (step 1: AttributeError"),
    "a stacked weight of another shape": ("full-vllm", ("vllm_sync", "syncs", [{"step": s, "compared": 9,
                                          "differing": 0, "moved_since_start": s, "other_shape": ["qkv_proj: ..."]}
                                          for s in range(3)]), "another shape than the trainer's (qkv_proj"),
    "a trained weight vLLM lacks": ("full-vllm", ("vllm_sync", "syncs", [{"step": s, "compared": 9, "differing": 0,
                                    "moved_since_start": s, "not_in_vllm": ["lm_head.weight"]} for s in range(3)]),
                                    "no weight in vLLM to compare (e.g. lm_head.weight)"),
    # the last step's update is never synced: with no gradient before it, no sync could carry a move
    "only the last step had a gradient": ("lora-vllm", ("first_step_with_gradient", None, 3), "is not judged"),
    "no step had a gradient (vLLM)": ("full-vllm", ("first_step_with_gradient", None, None), "is not judged"),
}  # fmt: skip


@pytest.mark.parametrize("case", WEAKENED, ids=list(WEAKENED))
def test_each_assertion_fails_a_variant_that_did_not_train_as_the_recipe_says(case):
    name, (part, key, value), said = WEAKENED[case]
    result = passing(name)
    if key is None:
        result[part] = value
    else:
        result[part][key] = value
    found = gpu_check.problems(gpu_check.BY_NAME[name], result, 3, flash=True)
    assert any(said in line for line in found), found


# vLLM's Qwen2 and Llama at tensor-parallel size 1: q, k, v stacked in this order into qkv_proj, gate and up into
# gate_up_proj, each at the sum of the shards before it (QKVParallelLinear, MergedColumnParallelLinear), written out
# here rather than read from the check, so that a check stacking in another order fails
VLLM_STACKS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
               "up_proj": "gate_up_proj"}  # fmt: skip


class Engine:
    """vLLM's model as TRL's colocate sync writes into it (`load_weights`), in bf16, with q/k/v and gate/up stacked into
    one tensor each at their offsets as vLLM's Qwen2 holds them (`VLLM_STACKS`); `drops`: a part of the names its
    loader drops, as a broken loader would ("" drops none)."""

    def __init__(self, start: torch.nn.Module, drops: str):
        weights = {name: p.detach().to(torch.bfloat16) for name, p in start.named_parameters()}
        self.drops, self.params, self.shards = drops, {}, {}  # shards: a trainer name -> (vLLM's name, offset)
        for name, weight in weights.items():  # in the model's order: q, k, v and gate, up
            part = next((p for p in VLLM_STACKS if f".{p}." in name), None)
            vllm_name = name.replace(f".{part}.", f".{VLLM_STACKS[part]}.") if part else name
            held = self.params.get(vllm_name, weight[:0])
            self.shards[name] = (vllm_name, len(held))
            self.params[vllm_name] = torch.cat([held, weight])
        for name in ("model.embed_tokens.weight", "lm_head.weight"):  # the vocabulary padded to a multiple of 64
            rows = self.params[name]
            self.params[name] = torch.cat([rows, rows.new_zeros(-len(rows) % 64, rows.shape[1])])

    def named_parameters(self):
        return iter(self.params.items())

    def load_weights(self, weights):
        for name, tensor in weights:
            if not (self.drops and self.drops in name):
                vllm_name, offset = self.shards[name]
                self.params[vllm_name][offset : offset + len(tensor)] = tensor


SYNC_CASES = {  # what the sync does: (the names the loader drops, TRL syncs before step 1, what the check says)
    "synced": ("", True, None),
    "a loader that drops the weights": (".", True, "a stale or broken weight sync"),
    "a loader that drops q_proj, a stacked shard": (".q_proj.", True, "a stale or broken weight sync"),
    "no sync before step 2": ("", False, "TRL did not sync vLLM before step(s) [2]"),
}


@pytest.mark.parametrize("adapters", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("case", SYNC_CASES, ids=list(SYNC_CASES))
def test_the_sync_check_passes_trls_own_syncs_and_fails_a_stale_one(tmp_path, monkeypatch, adapters, case):
    """TRL's real VLLMGeneration.sync_weights (its PEFT merge, names and load_weights calls), watched as the check
    watches it, into a stand-in of vLLM's model, over two steps whose update moved the weights."""
    import copy

    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    from grpo_kit.patches import keep_base_exact

    drops, syncs_step_1, said = SYNC_CASES[case]
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=60)  # fmt: skip
    torch.manual_seed(0)
    start = Qwen2ForCausalLM(config)
    start.to(torch.bfloat16).save_pretrained(tmp_path / "start")  # the check's start model: bf16
    model = Qwen2ForCausalLM(config)
    model.load_state_dict(start.state_dict())  # fp32 weights, as the recipe trains them
    if adapters:
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "o_proj", "up_proj"]))
        keep_base_exact(model)
    trained = [p for n, p in model.named_parameters() if ("lora_B" in n if adapters else n.endswith("proj.weight"))]
    base = [p.detach().clone() for n, p in model.named_parameters() if "base_layer" in n]
    accelerator = Accelerator(cpu=True)
    generation = object.__new__(VLLMGeneration)  # TRL's class, its engine a stand-in
    generation.model, generation.accelerator, generation._dist = model, accelerator, DistributedBackend(accelerator)
    generation.mode, generation.enable_sleep_mode = "colocate", False
    runner = SimpleNamespace(model=Engine(copy.deepcopy(start), drops))
    executor = SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))
    generation.llm = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=executor), reset_prefix_cache=lambda: 0)
    monkeypatch.setattr(VLLMGeneration, "sync_weights", VLLMGeneration.sync_weights)  # put back after the test
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0))
    records = gpu_check.watch_syncs(tmp_path / "start", [trainer])

    generation.sync_weights()  # TRL, before step 0's generation round (its _last_loaded_step starts at -1)
    with torch.no_grad():  # step 0's update: every trained weight moved by far more than bf16's spacing
        for param in trained:
            param.add_(torch.randn_like(param) * 0.05)
    trainer.state.global_step = 1
    if syncs_step_1:
        generation.sync_weights()  # before step 1's round

    assert [r["step"] for r in records] == [0, 1][: 1 + syncs_step_1]
    assert records[0]["compared"] == sum(p.numel() for p in start.parameters())  # every weight, stacked or not
    assert records[0]["moved_since_start"] == 0 and records[0]["other_shape"] == records[0]["not_in_vllm"] == []
    found = gpu_check.sync_problems({"syncs": records}, steps=2, first_gradient=1)
    assert found == ([] if said is None else [found[0]]) and (said is None or said in found[0]), found
    after = [p for n, p in model.named_parameters() if "base_layer" in n]
    assert all(torch.equal(a, b) for a, b in zip(after, base, strict=True))  # the LoRA base as it was


@pytest.mark.slow
def test_the_sync_probe_runs_the_recipe_as_asked_and_writes_its_report(tmp_path):
    """A vLLM variant's command (`--_sync_probe REPORT START -- recipe args`): the recipe runs with its arguments,
    TRL's sync watched, and the report is written when training ends (no vLLM here: no sync to record)."""
    report, output = tmp_path / "vllm_sync.json", tmp_path / "output"
    probe = ["--_sync_probe", str(report), str(tmp_path / "start"), "--"]
    recipe = ["--smoke", "--max_steps", "1", "--warmup_steps", "0", "--output_dir", str(output)]
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *probe, *recipe]
    done = subprocess.run(command, cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(report.read_text()) == {"syncs": []}
    state = json.loads((output / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and (output / "model.safetensors").is_file()  # the recipe's own arguments


def test_the_sync_comparisons_time_is_taken_out_of_the_step_it_ran_in():
    """A sync at global step g runs inside the training step logged as g + 1 (TRL's `training_step` times its
    generation round): the check's own seconds there are not the run's."""
    log = [{"step": s, "step_time": 2.0, "completions/mean_length": 10.0, "grad_norm": g} for s, g in [(1, 0.0),
           (2, 0.5), (3, 0.5)]]  # fmt: skip
    plain = gpu_check.steps_measured(log, 4)
    checked = gpu_check.steps_measured(log, 4, {2: 0.5, 3: 1.0})  # the syncs at steps 1 and 2
    assert (plain["mean_step_s"], checked["mean_step_s"]) == (2.0, 1.25)
    assert checked["step_seconds"] == [2.0, 1.5, 1.0] and checked["generated_tokens_per_s"] == 80 / 2.5
    assert (checked["steps_with_gradient"], checked["first_step_with_gradient"]) == (2, 2)


@pytest.mark.parametrize(("variants", "steps", "vllm", "refused"), [("full-vllm", 1, True, True),
                         ("full,lora-vllm", 1, True, True), ("full", 1, True, False), ("full-vllm", 2, True, False),
                         ("full-vllm", 1, False, False)])  # fmt: skip
def test_a_vllm_variant_needs_two_steps_to_check_its_sync(monkeypatch, variants, steps, vllm, refused):
    """Refused where the variant would run; without vLLM it is skipped anyway, saying so."""
    monkeypatch.setattr(gpu_check, "available", lambda variant, dry_run: None if vllm else "vllm is not installed")
    args = SimpleNamespace(dry_run=False, steps=steps, completion=None, variants=variants)
    if refused:
        with pytest.raises(SystemExit, match="need at least 2"):
            gpu_check.chosen(args)
    else:
        assert gpu_check.chosen(args)[0]["steps"] == steps


def test_flash_attention_is_required_only_where_flash_attn_imports():
    result = passing("full")
    result["model"]["attention"] = "sdpa"
    assert gpu_check.problems(gpu_check.BY_NAME["full"], result, 3, flash=False) == []
    reason = gpu_check.flash_attention_here()  # not installed on this machine: said why
    assert reason is None or "flash-attn" in reason


def write_assets(folder):
    folder.mkdir(parents=True, exist_ok=True)
    facts = {"tokenizer_tokens": 627, "model_vocab": 151936, "max_prompt_tokens": 100, "gpu_memory_gib": 139.8}
    (folder / "assets.json").write_text(json.dumps(facts))
    return folder


def flags_of(command: list[str]) -> dict:
    return {command[i][2:]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}


def test_without_a_gradient_no_weight_moves_under_the_checks_settings(tmp_path):
    """AdamW's weight decay alone moves every fp32 weight (the old check's "100 % moved" with zero gradients); the
    check trains with it off and a constant rate, so a weight moves by its gradient only, by lr per step at most."""
    variant = gpu_check.BY_NAME["full"]
    command = gpu_check.recipe_command(variant, tmp_path, write_assets(tmp_path / "assets"), gpu_check.REAL, False)
    flags = flags_of(command)
    assert (flags["weight_decay"], flags["lr_scheduler_type"]) == ("0.0", "constant")

    def moved(weight_decay: float) -> float:
        weights = torch.nn.Parameter(torch.randn(10_000) * 0.02)
        start = weights.detach().clone()
        optimizer = torch.optim.AdamW([weights], lr=5e-6, betas=(0.9, 0.99), weight_decay=weight_decay)
        for _ in range(3):
            weights.grad = torch.zeros_like(weights)  # no reward spread: a zero policy gradient
            optimizer.step()
        return (weights.detach() != start).float().mean().item()

    assert moved(float(flags["weight_decay"])) == 0.0
    assert moved(0.1) == 1.0  # the recipe's weight decay: every weight "moved" without any gradient


def test_the_vllm_variant_trains_without_the_correction_its_restricted_sampling_would_zero(tmp_path):
    """vLLM's log-probabilities over the tokenizer's 627 allowed ids against TRL's over all 151,936: the sequence's
    importance ratio underflows to 0, and so would the loss and every gradient."""
    logits = torch.randn(128, 151936, generator=torch.Generator().manual_seed(0))
    token = torch.zeros(128, 1, dtype=torch.long)
    trl = logits.log_softmax(-1).gather(1, token).sum()
    vllm = logits[:, :627].log_softmax(-1).gather(1, token).sum()
    assert torch.exp(trl - vllm).item() == 0.0
    variant = gpu_check.BY_NAME["full-vllm"]
    command = gpu_check.recipe_command(variant, tmp_path, write_assets(tmp_path / "assets"), gpu_check.REAL, False)
    assert flags_of(command)["vllm_importance_sampling_correction"] == "false"


@pytest.mark.parametrize(("visible", "pinned"), [(None, "0"), ("", "0"), ("3,5,7", "3"), ("GPU-ab12", "GPU-ab12")])
def test_every_variant_runs_on_one_gpu(monkeypatch, visible, pinned):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpu_check.recipe_env()["CUDA_VISIBLE_DEVICES"] == pinned


@pytest.mark.parametrize(
    ("limit", "status"), [("the budget ran out (estimated ~90 s)", "not run"), ("--timeout", "failed")]
)
def test_a_variant_the_budget_stops_is_not_run_and_one_past_its_timeout_failed(monkeypatch, tmp_path, limit, status):
    monkeypatch.setattr(gpu_check, "recipe_command", lambda *a: ["python", "grpo_demo.py"])
    monkeypatch.setattr(gpu_check, "run_logged", lambda command, cwd, log, timeout: (None, timeout))
    result = gpu_check.run_variant(gpu_check.BY_NAME["lora"], tmp_path, gpu_check.REAL, False, 60, limit)
    assert result["status"] == status
    assert gpu_check.failures({"full": {"status": "passed"}, "lora": result}) == (
        [] if status == "not run" else ["lora: stopped after 60 s: --timeout"]
    )


def test_variants_the_budget_cannot_cover_are_not_run_and_fail_nothing_but_the_empty_check(monkeypatch, tmp_path):
    def built(command, cwd, log, timeout):  # the build, without building: its facts written as it would
        write_assets(tmp_path / "assets")
        return 0, 0.1

    monkeypatch.setattr(gpu_check, "run_logged", built)
    args = SimpleNamespace(dry_run=False, steps=None, completion=None, variants="full,lora", work=str(tmp_path))
    report = gpu_check.check(SimpleNamespace(**vars(args), budget=30, timeout=300))
    assert {name: v["status"] for name, v in report["variants"].items()} == {"full": "not run", "lora": "not run"}
    assert report["failures"] == ["no variant ran: nothing was checked"]


def adamw_realised(steps: int, dtype, seed: int = 0) -> float:
    """The mean |change| of 20,000 weights ~ N(0, 0.02) after `steps` AdamW steps (the recipe's lr 5e-6, betas 0.9 /
    0.99, no weight decay) on independent random gradients, in `dtype`, over `expected_move`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(20_000, generator=generator) * 0.02
    weights = torch.nn.Parameter(start.clone().to(dtype))
    optimizer = torch.optim.AdamW([weights], lr=5e-6, betas=(0.9, 0.99), weight_decay=0.0)
    for _ in range(steps):
        weights.grad = torch.randn(20_000, generator=generator).to(dtype)
        optimizer.step()
    moved = (weights.detach().float() - start.to(dtype).float()).abs().mean().item()
    return moved / gpu_check.expected_move([5e-6] * steps)


@pytest.mark.parametrize("steps", [1, 3, 5, 20])
def test_the_movement_bar_passes_a_correct_run_of_any_length_and_fails_pure_bf16_weights(steps):
    """Policy gradients change sign from step to step: AdamW's net move grows like sqrt(T), and the bar expects
    that. The bar of lr x T failed correct runs from 5 steps on (0.45 measured on the dry run, 0.45 here)."""
    import torch

    realised = adamw_realised(steps, torch.float32)
    assert realised >= 1.5 * gpu_check.MIN_REALISED  # a margin at every length: about 1.0
    assert adamw_realised(steps, torch.bfloat16) < gpu_check.MIN_REALISED  # the updates round away
    linear = realised * gpu_check.expected_move([5e-6] * steps) / (5e-6 * steps)
    assert (linear < gpu_check.MIN_REALISED) is (steps >= 5)  # what the old bar saw


RESUMES = [
    # (the resumed run's step, the last step's mean move, the resumed weights' mean difference, what the check says)
    (3, 1e-5, 0.0, None),  # bit for bit, as on a CPU
    ((1, 2, 3), 1e-5, 0.0, "trained steps [1, 2, 3], not step 3 alone"),  # started afresh: the same weights, seeded
    (3, 1e-5, 5e-7, None),  # a GPU's kernels summing in another order: far below a step
    (3, 1e-5, 2e-6, "differ from the uninterrupted run's by 0.20 of the last step's move"),  # another last step
    (2, 1e-5, 0.0, "ended at step 2, not 3"),  # resumed, then stopped early
    (3, 0.0, 0.0, "the last step moved no weight"),  # nothing to compare against
    (3, None, None, "no weights to compare"),  # a model not saved
]


@pytest.mark.parametrize(("step", "move", "gap", "said"), RESUMES)
def test_a_resume_passes_only_where_it_continues_the_run(step, move, gap, said):
    trained = list(step) if isinstance(step, tuple) else [step]
    resume = {"from_step": 2, "steps_trained": trained, "last_step_mean_abs_move": move, "mean_abs_difference": gap}
    found = gpu_check.resume_problems({"steps": trained[-1], "resume": resume}, 3)
    assert (found == []) if said is None else (len(found) == 1 and said in found[0]), found


@pytest.mark.slow
@pytest.mark.long
def test_the_dry_run_resumes_bit_for_bit_and_fails_a_resume_that_trains_another_step(tmp_path, monkeypatch):
    """On the CPU, the save-and-resume variant: the resumed run's weights are the uninterrupted run's exactly; a
    resume whose last step draws other samples (another seed, allowed) is caught."""
    assets = tmp_path / "assets"
    build = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--_build", str(assets), "--dry-run"]
    assert subprocess.run(build, cwd=ROOT, env=offline_env(tmp_path), capture_output=True).returncode == 0
    variant, shape = gpu_check.BY_NAME["full-resume"], dict(gpu_check.DRY_RUN)
    monkeypatch.setattr(gpu_check, "recipe_env", lambda: offline_env(tmp_path))
    result = gpu_check.run_variant(variant, tmp_path, shape, True, 600, "--timeout")
    assert result["status"] == "passed" and result["resume"]["mean_abs_difference"] == 0.0, result
    assert result["resume"]["last_step_mean_abs_move"] > 0

    command = gpu_check.recipe_command

    def another_seed_on_resume(*args, **kwargs):
        resumed = (args[5] if len(args) > 5 else kwargs.get("overrides") or {}).get("resume_from_checkpoint")
        extra = ["--seed", "7", "--allow_changed_settings", "true"] if resumed else []
        return command(*args, **kwargs) + extra

    monkeypatch.setattr(gpu_check, "recipe_command", another_seed_on_resume)
    result = gpu_check.run_variant(variant, tmp_path, shape, True, 600, "--timeout")
    assert result["status"] == "failed" and "the resume did not continue the run" in result["problems"][0], result
