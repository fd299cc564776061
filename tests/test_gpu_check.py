"""benchmarks/gpu_check.py, the GPU acceptance check: its whole code path on the CPU (--dry-run), and the rules it
decides by (generation settings, pass/fail, the time plan) without running anything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
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
    assert 0.1 < full["movement"]["realised_over_expected"] <= 1.5  # AdamW moved about lr per step
    assert lora["movement"]["measured_on"] == "LoRA B matrices" and lora["movement"]["moved_fraction"] > 0.5
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
    total = gpu_check.BUILD_ESTIMATE_S + sum(v.estimate(steps, completion) for v in gpu_check.VARIANTS)
    assert total < gpu_check.BUDGET_S == 480  # every variant, with room to spare in 8 minutes
    assert f"{total:.0f} s" in gpu_check.__doc__  # the docstring states the estimate the code makes


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
