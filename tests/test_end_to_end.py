"""The recipe run as a user runs it: `python grpo_demo.py --smoke`, offline, in a fresh folder."""

from __future__ import annotations

import json
import time

from conftest import REWARD_NAMES, run_recipe
from safetensors.torch import load_file


def test_smoke_run_trains_checkpoints_and_logs_to_wandb_offline(tmp_path):
    out = tmp_path / "outputs" / "run"
    # weight_decay 0: any change in the weights must come from the rewards' gradient, not from decay alone.
    args = ["--smoke", "--report_to", "wandb", "--weight_decay", "0", "--output_dir", str(out)]
    result = run_recipe(args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]

    for step in (2, 4):  # save_steps 2, max_steps 4
        checkpoint = out / f"checkpoint-{step}"
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
            assert (checkpoint / name).is_file(), f"{checkpoint / name} missing"

    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2, 3, 4]
    for name in REWARD_NAMES:
        assert all(f"rewards/{name}/mean" in entry for entry in steps), name

    # No credentials in this environment: wandb went offline, kept its files in the run folder, said how to sync.
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb")), "no offline wandb run files"
    assert "wandb sync" in result.stdout

    # GSM8K-style accuracy: measured in training (steps 2 and 4), before and after, and compared.
    accuracy_steps = [e["step"] for e in state["log_history"] if "eval_accuracy_strict" in e]
    assert accuracy_steps == [2, 4]
    comparison = json.loads((out / "eval" / "comparison.json").read_text())
    assert comparison["baseline"]["n"] == comparison["final"]["n"] == 32
    assert comparison["baseline"]["model"] == "outputs/smoke-assets/tiny-qwen2"
    assert (out / "eval" / "final" / "completions.jsonl").read_text().count("\n") == 32

    base = load_file(tmp_path / "outputs" / "smoke-assets" / "tiny-qwen2" / "model.safetensors")
    trained = load_file(out / "model.safetensors")
    assert base.keys() == trained.keys()
    changed = [name for name in base if not base[name].equal(trained[name])]
    assert changed, "GRPO left every weight unchanged"


def test_smoke_preset_as_documented_is_quick_and_leaves_a_run_folder(tmp_path):
    start = time.monotonic()
    result = run_recipe(["--smoke"], cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stdout[-4000:]
    assert elapsed < 120, f"--smoke took {elapsed:.0f} s"
    run = tmp_path / "outputs" / "smoke-GRPO"
    assert (run / "model.safetensors").is_file()
    assert (run / "checkpoint-4" / "trainer_state.json").is_file()
    assert not (run / "wandb").exists()  # the preset reports to no tracker unless asked


def test_eval_only_and_ask_on_a_trained_run(tmp_path):
    out = tmp_path / "outputs" / "smoke-GRPO"  # the preset's own folder, which a new --smoke training run clears
    args = ["--smoke", "--max_steps", "2", "--eval_every_steps", "0", "--final_eval", "false"]
    assert run_recipe(args, cwd=tmp_path).returncode == 0
    assert not (out / "eval").exists()

    evaluated = run_recipe(
        ["--smoke", "--eval_only", "--model_name_or_path", str(out), "--eval_limit", "5"], cwd=tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stdout[-3000:]
    summary = json.loads((out / "eval" / "final" / "summary.json").read_text())
    assert summary["n"] == 5 and summary["model"] == str(out)
    assert "| accuracy, strict (answer block) |" in evaluated.stdout

    asked = run_recipe(["--smoke", "--model_name_or_path", str(out), "--ask", "Ava has 3 apples."], cwd=tmp_path)
    assert asked.returncode == 0, asked.stdout[-3000:]
    assert (out / "model.safetensors").is_file() and (out / "eval" / "final").is_dir()  # asking clears nothing
