"""Reliability: a killed run resumes where it stopped, bad settings and bad rows are caught early, runs are recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, offline_env, run_recipe
from safetensors.torch import load_file

import grpo_demo
from grpo_kit.smoke import write_gsm8k_folder

RUN = ["--smoke", "--max_steps", "6", "--save_steps", "2"]


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_end(tmp_path):
    whole = run_recipe([*RUN, "--output_dir", "outputs/whole"], cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-3000:]

    killed_dir = tmp_path / "outputs" / "killed"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "grpo_demo.py"), *RUN, "--output_dir", "outputs/killed"],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not (killed_dir / "checkpoint-2" / "trainer_state.json").is_file():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed_dir / "model.safetensors").exists()  # it really died mid-run

    resumed = run_recipe([*RUN, "--output_dir", "outputs/killed", "--resume_from_checkpoint", "latest"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "Resuming from outputs/killed/checkpoint-" in resumed.stdout

    state = {
        name: json.loads((tmp_path / "outputs" / name / "trainer_state.json").read_text())
        for name in ("whole", "killed")
    }
    assert state["killed"]["global_step"] == state["whole"]["global_step"] == 6

    # Same learning-rate schedule and same data for the steps the resumed run trained.
    def per_step(name, key):
        return {e["step"]: e[key] for e in state[name]["log_history"] if key in e}

    resumed_steps = sorted(per_step("killed", "learning_rate"))
    assert resumed_steps[-1] == 6
    for key in ("learning_rate", "rewards/xmlcount_reward_func/mean", "num_tokens"):
        whole_values, resumed_values = per_step("whole", key), per_step("killed", key)
        assert all(resumed_values[s] == pytest.approx(whole_values[s]) for s in resumed_steps), key

    whole_weights = load_file(tmp_path / "outputs" / "whole" / "model.safetensors")
    resumed_weights = load_file(killed_dir / "model.safetensors")
    for name, tensor in whole_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-4, atol=1e-6)


def test_every_invalid_setting_is_named_in_seconds_before_any_model_loads(tmp_path):
    args = [
        "--num_generations", "1",
        "--max_completion_length", "0",
        "--max_prompt_tokens", "-5",
        "--reward_weights", "1.0", "2.0",
        "--dataset", str(tmp_path / "missing"),
        "--model_name_or_path", "./no-such-model",
    ]  # fmt: skip
    start = time.monotonic()
    result = run_recipe(args, cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert "Traceback" not in result.stdout
    for expected in (
        "num_generations=1: GRPO compares completions within a group, so it needs at least 2",
        "max_completion_length=0: must be a positive number",
        "max_prompt_tokens=-5: must be a positive number",
        "reward_weights has 2 values for 5 rewards: give 5",
        f"dataset={tmp_path / 'missing'}: no train.jsonl there",
        "model_name_or_path=./no-such-model: no such folder",
    ):
        assert expected in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--per_device_train_batch_size", "10"],
            "generation batch 40 completions (per_device_train_batch_size 10 x 1 process(es) x 4 steps) is not "
            "divisible by num_generations=16: use --per_device_train_batch_size 16",
        ),
        (["--generation_batch_size", "24"], "generation batch 24 completions"),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps=0: must be at least 1"),
        (["--eval_batch_size", "0"], "eval_batch_size=0: must be at least 1"),
        (["--eval_every_steps", "-1"], "eval_every_steps=-1: 0 turns in-training accuracy off"),
        (["--resume_from_checkpoint", "nowhere/checkpoint-5"], "resume_from_checkpoint=nowhere/checkpoint-5: no such"),
        (["--no_such_setting", "3"], "Unknown settings: ['--no_such_setting', '3']"),
    ],
)
def test_each_invalid_setting_has_its_own_message(capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        grpo_demo.parse_settings(args)
    assert message in str(stop.value)


def test_bad_tag_names_are_refused(monkeypatch):
    monkeypatch.setattr(grpo_demo, "REASONING_TAG", "my tag")
    with pytest.raises(SystemExit, match=r"REASONING_TAG='my tag': a tag name is a letter"):
        grpo_demo.parse_settings([])


def test_a_folder_with_checkpoints_is_never_overwritten_silently(tmp_path):
    (tmp_path / "run" / "checkpoint-300").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-300" / "trainer_state.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        grpo_demo.parse_settings(["--output_dir", str(tmp_path / "run")])
    assert "already holds checkpoint-300: resume it with --resume_from_checkpoint latest" in str(stop.value)
    assert "or start a new run with another --output_dir" in str(stop.value)
    _, args, _ = grpo_demo.parse_settings(["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", "latest"])
    assert args.resume_from_checkpoint == "latest"


def _write(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


BAD_ROWS = [
    {"question": "Good one", "answer": "2 + 2 = 4\n#### 4"},
    {"question": "No marker", "answer": "the answer is 4"},  # no '####'
    {"question": "   ", "answer": "#### 4"},  # empty question
    {"question": "Words", "answer": "#### four"},  # gold is no number
    {"question": "Another good one", "answer": "#### 1,000"},
    {"question": "Empty gold", "answer": "####"},  # gold is no number
]


def test_bad_rows_are_counted_named_and_dropped(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="grpo_demo"):
        data = grpo_demo.get_gsm8k_questions("train", _write(tmp_path / "d", BAD_ROWS))
    assert data["question"] == ["Good one", "Another good one"]
    assert data["answer"] == ["4", "1000"]
    assert "1 train rows with no '####' answer (row ids [1])" in caplog.text
    assert "1 train rows with an empty question (row ids [2])" in caplog.text
    assert "2 train rows with a gold answer that is no number (row ids [3, 5])" in caplog.text


def test_strict_data_stops_on_the_first_kind_of_bad_row(tmp_path):
    with pytest.raises(SystemExit, match=r"Bad data: 1 train rows with no '####' answer \(row ids \[1\]\)"):
        grpo_demo.get_gsm8k_questions("train", _write(tmp_path / "d", BAD_ROWS), strict=True)


def test_nothing_left_after_filtering_stops_with_a_message(tmp_path):
    with pytest.raises(SystemExit, match="No usable train rows"):
        grpo_demo.get_gsm8k_questions("train", _write(tmp_path / "d", BAD_ROWS[1:4]))


def test_remote_code_is_off_unless_asked():
    _, args, _ = grpo_demo.parse_settings([])
    assert args.trust_remote_code is False


def test_run_record_and_safe_checkpoints(tmp_path):
    data = write_gsm8k_folder(tmp_path / "data", n_train=16, n_test=4, seed=3)
    result = run_recipe(["--smoke", "--dataset", str(data), "--max_steps", "2", "--seed", "7"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    run = tmp_path / "outputs" / "smoke-GRPO"
    record = json.loads((run / "run_record.json").read_text())
    assert record["seed"] == 7
    assert set(record["versions"]) == {
        "python", "torch", "transformers", "trl", "peft", "datasets", "accelerate", "wandb", "flash-attn", "vllm",
    }  # fmt: skip
    assert record["versions"]["trl"] == "1.16.0" and record["versions"]["vllm"] is None
    assert len(record["recipe"]["commit"] or "") == 40
    assert {"gpu_count", "gpus", "cuda"} <= set(record["hardware"])
    assert record["data"]["rows"] == 16 and len(record["data"]["sha256"]) == 64
    assert record["settings"]["training"]["learning_rate"] == 5e-6
    assert record["settings"]["model"]["model_name_or_path"] == "outputs/smoke-assets/tiny-qwen2"
    assert record["settings"]["recipe"]["dataset"] == str(data)
    # Resuming reads only tensors and numpy arrays (the RNG state): nothing needs arbitrary unpickling.
    from transformers.trainer_pt_utils import safe_globals  # numpy arrays and dtypes, nothing else

    with safe_globals():
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
            torch.load(run / "checkpoint-2" / name, weights_only=True)


def test_the_same_data_gives_the_same_fingerprint_and_other_data_another(tmp_path):
    from grpo_kit.record import data_fingerprint

    a = grpo_demo.get_gsm8k_questions("train", str(write_gsm8k_folder(tmp_path / "a", 8, 1, seed=1)))
    b = grpo_demo.get_gsm8k_questions("train", str(write_gsm8k_folder(tmp_path / "b", 8, 1, seed=1)))
    c = grpo_demo.get_gsm8k_questions("train", str(write_gsm8k_folder(tmp_path / "c", 8, 1, seed=2)))
    assert data_fingerprint(a) == data_fingerprint(b) != data_fingerprint(c)


@pytest.fixture(autouse=True)
def _no_world_size(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(ROOT if os.access(ROOT, os.W_OK) else "/tmp")
