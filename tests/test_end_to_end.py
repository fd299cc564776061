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
