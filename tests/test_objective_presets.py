"""The objective presets in configs/ (the reference's objective, Dr. GRPO, DAPO, GSPO, GDPO) and the Unsloth variant:
each is valid settings that the recipe's checks pass, sets what its source sets, and trains two smoke steps (the
Unsloth one on a GPU box only: its CPU run swaps the 4-bit base and the bitsandbytes optimizer out)."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest
from conftest import REWARD_NAMES, ROOT, refused, resolved, run_recipe

import grpo_demo
from grpo_kit import checks
from grpo_kit.answer_format import Tags

CONFIGS = ROOT / "configs"
# What each preset sets, as its source does (read from the papers and TRL's paper index; see each file's comments).
OBJECTIVES = {
    "reference_objective": dict(
        loss_type="grpo", scale_rewards="group", beta=0.04, epsilon=0.2, top_k=50,
        vllm_importance_sampling_correction=False,
    ),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", beta=0.0),
    "dapo": dict(
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, mask_truncated_completions=True, beta=0.0,
        steps_per_generation=16,
    ),
    "gspo": dict(
        importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4, beta=0.0,
        steps_per_generation=16,
    ),
    "gdpo": dict(multi_objective_aggregation="normalize_then_sum", loss_type="dapo", scale_rewards="group"),
}  # fmt: skip
UNSLOTH = "unsloth_llama8b_qlora"
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


pytestmark = pytest.mark.usefixtures("single_process")


@pytest.mark.parametrize("name", OBJECTIVES)
def test_each_objective_preset_is_valid_and_sets_its_objective(name, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        chosen = resolved(["--config", str(CONFIGS / f"{name}.yaml")])
    assert {key: getattr(chosen, key) for key in OBJECTIVES[name]} == OBJECTIVES[name]
    assert "clipping acts only" not in caplog.text  # at the recipe's batch shape, every setting it makes acts
    # Everything else is the recipe's: the preset changes the objective, not the model, data or batch.
    assert (chosen.model_name_or_path, chosen.learning_rate, chosen.num_generations) == (grpo_demo.MODEL_NAME, 5e-6, 16)
    _, args, _ = grpo_demo.parse_settings(["--config", str(CONFIGS / f"{name}.yaml")])  # TRL's own checks pass
    assert args.generation_batch_size % args.num_generations == 0
    # On the demo too, as benchmarks/demo_runs.py runs it (4 updates per generation batch where the preset has 4).
    demo = ["--demo", "--config", str(CONFIGS / f"{name}.yaml"), *demo_batch_shape(name)]
    _, args, _ = grpo_demo.parse_settings(demo)
    assert args.steps_per_generation // args.gradient_accumulation_steps == (
        4 if "steps_per_generation" in OBJECTIVES[name] else 1
    )


def demo_batch_shape(name: str) -> list[str]:
    """The demo accumulates 1 micro-step per optimizer step where the recipe accumulates 4: the off-policy presets'
    4 updates per generation batch are --steps_per_generation 4 there (benchmarks/demo_runs.py uses this)."""
    return ["--steps_per_generation", "4"] if "steps_per_generation" in OBJECTIVES[name] else []


def test_the_unsloth_preset_is_valid_on_a_gpu_box(gpu_extras):
    chosen = resolved(["--config", str(CONFIGS / f"{UNSLOTH}.yaml")])
    assert chosen.model_name_or_path == "meta-llama/Llama-3.1-8B-Instruct"
    assert (chosen.use_peft, chosen.load_in_4bit, chosen.use_vllm, chosen.optim) == (
        True,
        True,
        False,
        "paged_adamw_8bit",
    )
    assert (chosen.lora_r, chosen.lora_alpha, set(chosen.lora_target_modules)) == (32, 32, PROJECTIONS)
    assert (chosen.num_generations, chosen.per_device_train_batch_size, chosen.max_steps) == (6, 6, 250)
    assert chosen.max_prompt_tokens + chosen.max_completion_length == 1024
    assert (chosen.reasoning_tag, chosen.answer_tag) == ("think", "answer")
    assert dict(zip(REWARD_NAMES, chosen.reward_weights, strict=True)) == {
        "xmlcount_reward_func": 0.0,  # the source trained with three rewards: strict format, int, correctness
        "soft_format_reward_func": 0.0,
        "strict_format_reward_func": 1.0,
        "int_reward_func": 1.0,
        "correctness_reward_func": 1.0,
    }
    # vLLM is where it is not sound with a 4-bit base: refused, saying why.
    assert "every weight sync would merge the adapter into the quantized base" in refused(
        ["--config", str(CONFIGS / f"{UNSLOTH}.yaml"), "--use_vllm"]
    )


def test_the_unsloth_preset_on_a_machine_without_cuda_names_what_it_needs(monkeypatch):
    monkeypatch.setattr(checks, "cuda_available", lambda: False)
    message = refused(["--config", str(CONFIGS / f"{UNSLOTH}.yaml")])
    assert "load_in_4bit needs a CUDA GPU" in message
    assert "optim=paged_adamw_8bit is a bitsandbytes optimizer, for CUDA GPUs, and this machine has none" in message


def test_clipping_that_cannot_act_is_named(caplog):
    """Clip-higher and sequence-level ratios act only off-policy: with one update per generation batch, said."""
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        resolved(["--epsilon_high", "0.28"])
        resolved(["--config", str(CONFIGS / "gspo.yaml"), "--steps_per_generation", "4"])  # 4 / 4: one update
    warnings = [r.getMessage() for r in caplog.records if "clipping acts only" in r.getMessage()]
    assert len(warnings) == 2 and "--steps_per_generation 16" in warnings[0]
    assert warnings[1].startswith("epsilon_high=0.0004, epsilon=0.0003, importance_sampling_level=sequence:")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        resolved(["--epsilon_high", "0.28", "--num_iterations", "2"])  # two passes over each batch: it acts
        resolved(["--config", str(CONFIGS / "gdpo.yaml"), "--scale_rewards", "none"])
    assert "clipping acts only" not in caplog.text
    assert "scale_rewards=none is not used with multi_objective_aggregation=normalize_then_sum" in caplog.text


def test_the_readme_lists_every_preset_with_its_source():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Objectives", 1)[1].split("\n## ", 1)[0]
    for name in [*OBJECTIVES, UNSLOTH]:
        row = next((line for line in table.splitlines() if line.startswith(f"| `configs/{name}.yaml`")), None)
        assert row is not None, f"{name} is not in the README's preset table"
        assert re.search(r"arXiv:\d{4}\.\d{5}|TRL v0\.14|Unsloth", row), f"{name}: no source named"


# ----------------------------------------------------------------------------------------------------------------
# Two smoke steps each


def steps_of(out) -> list[dict]:
    state = json.loads((out / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


@pytest.mark.slow
@pytest.mark.parametrize("name", OBJECTIVES)
def test_each_objective_preset_trains_two_smoke_steps(name, tmp_path):
    args = ["--smoke", "--config", str(CONFIGS / f"{name}.yaml"), "--max_steps", "2", "--save_steps", "2"]
    result = run_recipe([*args, "--eval_every_steps", "0", "--final_eval", "false"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    out = tmp_path / "outputs" / f"smoke-{name}-GRPO"  # a preset's run of a --config: a folder of its own
    trained = json.loads((out / "run_record.json").read_text())["settings"]["training"]
    assert {key: trained[key] for key in OBJECTIVES[name]} == OBJECTIVES[name]  # what the trainer was built with
    steps = steps_of(out)
    assert [e["step"] for e in steps] == [1, 2] and all(math.isfinite(e["loss"]) for e in steps)
    assert ("kl" in steps[1]) == (name == "reference_objective")  # a KL term only where beta > 0
    # The off-policy presets generate once for both steps (16 micro-steps per generation batch): the second step
    # trains on the first one's completions, with a policy that has moved since, where clipping acts.
    generated = ["num_tokens" in e for e in steps]
    assert generated == ([True, False] if "steps_per_generation" in OBJECTIVES[name] else [True, True])
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_the_unsloth_preset_trains_on_cpu_with_its_4bit_base_and_8bit_optimizer_swapped_out(tmp_path):
    """The preset as it is, on the smoke model, less what needs CUDA (4-bit weights, bitsandbytes' optimizer):
    LoRA r 32 / alpha 32 on every projection, 6 generations, <think> tags from prompt to rewards, three rewards."""
    tiny = "outputs/smoke-assets/tiny-qwen2"  # the preset names its own model: point it back at the smoke one
    args = ["--smoke", "--config", str(CONFIGS / f"{UNSLOTH}.yaml"), "--model_name_or_path", tiny]
    args += ["--load_in_4bit", "false", "--optim", "adamw_torch", "--dtype", "float32", "--output_dir", "out"]
    args += ["--max_steps", "2", "--save_steps", "2", "--max_completion_length", "48", "--eval_every_steps", "0"]
    result = run_recipe(args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    out = tmp_path / "out"
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], set(adapter["target_modules"])) == (32, 32, PROJECTIONS)
    steps = steps_of(out)
    assert [e["step"] for e in steps] == [1, 2]
    for entry in steps:  # the logged reward is the weighted sum: strict format, int and correctness only
        three = sum(entry[f"rewards/{name}/mean"] for name in REWARD_NAMES[2:])
        assert entry["reward"] == pytest.approx(three, abs=1e-6)
    import pandas as pd

    table = pd.read_parquet(out / "completions" / "completions_00001.parquet")
    assert len(table) == 6 and table["prompt"].astype(str).nunique() == 1  # one prompt's 6 completions a step
    assert table["prompt"][0][0]["content"] == grpo_demo.system_prompt(Tags("think", "answer"))
    baseline = json.loads((out / "eval" / "baseline" / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "eval" / "baseline" / "completions.jsonl").open()]
    assert baseline["n"] == len(records) > 0  # evaluated in the <think> format: the tokenizer's tags are single
    built = json.loads((out / "run_record.json").read_text())["settings"]["model"]["model_name_or_path"]
    assert built == f"{tiny}.think.answer.seed3407"  # the smoke model in its tags and seed: a folder of its own
    tokens = json.loads((tmp_path / built / "tokenizer.json").read_text())["added_tokens"]
    assert {"<think>\n", "\n</think>\n"} <= {token["content"] for token in tokens}
