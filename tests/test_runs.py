"""The recipe run as a user runs it: `python grpo_demo.py ...` in a subprocess, offline, in a fresh folder. Slow.

One smoke run is shared by the checks of what a run leaves; then resuming after a kill, stopping on SIGTERM or
Ctrl-C and resuming, two processes (stopping together too), LoRA and its merge (on both tiny models), a copied recipe
with `<think>` tags, the Llama swap (a smoke run, its resume, a copied recipe whose MODEL_NAME names Llama), and the
messages a user without network gets.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import REWARD_NAMES, ROOT, assert_same_final_weights, offline_env, run_printed, run_recipe
from safetensors.torch import load_file

import grpo_demo
from grpo_kit import evaluation, generation, layout, presets, runs, smoke, stopping

pytestmark = pytest.mark.slow
TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`python grpo_demo.py --smoke --report_to wandb` (weight decay 0: any change in the weights comes from the
    rewards' gradient)."""
    folder = tmp_path_factory.mktemp("smoke-run")
    result = run_recipe(["--smoke", "--report_to", "wandb", "--weight_decay", "0"], cwd=folder)
    assert result.returncode == 0, result.stdout[-4000:]
    return folder, folder / "outputs" / "smoke-GRPO", result.stdout


def test_a_run_leaves_checkpoints_logs_and_a_trained_model(smoke_run):
    folder, out, _ = smoke_run
    for step in (2, 4):  # save_steps 2, max_steps 4
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
            assert (out / f"checkpoint-{step}" / name).is_file(), f"checkpoint-{step}/{name} missing"
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2, 3, 4]
    assert all(f"rewards/{name}/mean" in entry for entry in steps for name in REWARD_NAMES)
    assert sorted(p.name for p in (out / "completions").glob("*.parquet")) == [
        f"completions_0000{step}.parquet" for step in (1, 2, 3, 4)
    ]
    base = load_file(folder / "outputs" / "smoke-assets" / "tiny-qwen2" / "model.safetensors")
    trained = load_file(out / "model.safetensors")
    assert base.keys() == trained.keys()
    assert any(not base[name].equal(trained[name]) for name in base), "GRPO left every weight unchanged"
    assert (out / "curves.png").stat().st_size > 10_000
    assert layout.not_written_by_a_run(out) == []  # every file a run's: a preset's next run may clear them all


def test_the_console_holds_the_settings_steps_verdict_and_where_things_are(smoke_run):
    """What `--smoke` prints, in at most 60 lines: its settings, a line per step, the comparison table with the paired
    verdict, the health line and where each thing was written; no completions table, no library warning."""
    folder, out, stdout = smoke_run
    lines = stdout.splitlines()
    assert len(lines) <= 60, f"{len(lines)} lines"
    assert "GRPO on GSM8K: outputs/smoke-assets/tiny-qwen2 -> outputs/smoke-GRPO" in lines
    assert (
        "  batch      2 prompts x 4 generations = 8 completions per step (8 per device x 1 accumulation x 1 " in stdout
    )
    assert [line.split("  ")[0] for line in lines if line.startswith("step ")] == [f"step {n}/4" for n in (1, 2, 3, 4)]
    assert "| accuracy, strict (answer block) | " in stdout and "Paired, strict: " in stdout
    # 4 steps: most checks need more to judge, and say so (truncation and no_signal: off in the preset)
    assert "Training health: no finding, but too few steps to judge 4 of 5 checks (4 logged) (outputs/smoke-GRPO/" \
        "health.json)" in lines  # fmt: skip
    for name, path in (("model", ""), ("curves", "/curves.png"), ("completions", "/completions")):
        assert f"  {name:<12} outputs/smoke-GRPO{path}" in lines, name
    assert not [line for line in lines if "Warning" in line or "┃" in line or "{'loss'" in line or "%|" in line]
    assert stdout.count("wandb sync ") == 2  # said once at the start, and by wandb as it finishes
    # The closing hint, run as printed: the trained model answers a held-out question
    asked = run_printed(stdout, "Ask it: ", folder)
    assert asked.returncode == 0, asked.stdout[-3000:]
    assert "outputs/smoke-GRPO answers (sampled, seed 42):" in asked.stdout
    assert "The Hugging Face Hub cannot be reached" not in asked.stdout  # a local model: the Hub is not asked


def test_a_run_logs_to_wandb_offline_without_credentials(smoke_run):
    _, out, stdout = smoke_run
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb")), "no offline wandb run files"
    assert "wandb sync" in stdout


def test_a_run_records_what_it_ran(smoke_run):
    folder, out, _ = smoke_run
    record = json.loads((out / "run_record.json").read_text())
    assert record["seed"] == 42
    assert record["versions"]["trl"] == "1.16.0" and record["versions"]["vllm"] is None
    assert len(record["recipe"]["commit"] or "") == 40
    assert record["data"]["rows"] == 64 and len(record["data"]["sha256"]) == 64
    assert record["settings"]["training"]["learning_rate"] == 5e-6
    assert record["settings"]["model"]["model_name_or_path"] == "outputs/smoke-assets/tiny-qwen2"
    # What the trainer loaded: fp32 weights and sdpa on a CPU, every parameter trained.
    model = record["model"]
    assert (model["weights_dtype"], model["attention"]) == (["float32"], "sdpa")
    assert model["trainable_parameters"] == model["parameters"] > 0
    # Resuming reads only tensors and numpy arrays (the RNG state): nothing needs arbitrary unpickling.
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
            torch.load(out / "checkpoint-2" / name, weights_only=True)


def test_a_run_says_what_goes_wrong_while_it_goes_wrong(smoke_run):
    """The smoke model is random: it never stops writing and rarely writes a tag, so every step truncates nearly all
    completions and most earn nothing, and the smoke preset leaves the truncation and no_signal checks off (findings
    on its own model); the other checks watch, and a check its 4 steps are too few for says so."""
    _, out, stdout = smoke_run
    assert "Training health: first step's loss" in stdout
    assert "Training health, step" not in stdout
    record = json.loads((out / "health.json").read_text())
    assert record["status"] == "too few steps" and record["findings"] == []
    assert list(record["too_few_steps"]) == ["format_only", "length_runaway", "entropy_collapse", "not_learning"]
    assert record["not_learning_reads"] == "eval_accuracy_strict (8 questions)"  # the accuracy measured as it trains
    state = json.loads((out / "trainer_state.json").read_text())
    marks = [e["health/format_only"] for e in state["log_history"] if "loss" in e]
    assert len(marks) == 4 and set(marks) <= {0.0, 1.0}
    wandb_files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert b"health/format_only" in wandb_files[0].read_bytes()  # a curve in wandb


NAN_AT_STEP_3 = """
import math
import trl

original = trl.GRPOTrainer.compute_loss


def compute_loss(self, model, inputs, *args, **kwargs):
    loss = original(self, model, inputs, *args, **kwargs)
    return loss * math.nan if self.state.global_step == 2 else loss  # the loss of step 3


trl.GRPOTrainer.compute_loss = compute_loss

import grpo_demo

grpo_demo.main()
"""


def test_a_non_finite_loss_stops_the_run_with_a_checkpoint_it_resumes_from(tmp_path):
    script = tmp_path / "nan_at_step_3.py"
    script.write_text(NAN_AT_STEP_3)
    args = ["--smoke", "--max_steps", "5", "--save_steps", "2", "--output_dir", "outputs/nan"]
    stopped = run_recipe(args, cwd=tmp_path, script=script)
    assert stopped.returncode == 3, stopped.stdout[-3000:]
    assert "Stopped at step 3: the gradients are not finite" in stopped.stdout
    assert "Traceback" not in stopped.stdout
    out = tmp_path / "outputs" / "nan"
    record = json.loads((out / "health.json").read_text())
    assert record["status"] == "stopped" and record["stopped"]["step"] == 3
    assert ("not_finite", 3) in [(f["check"], f["step"]) for f in record["findings"]]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = {e["step"]: e["loss"] for e in history if "loss" in e}
    assert math.isnan(losses[3]) and math.isfinite(losses[2])  # logged as it was
    # Checkpoint 3 holds the weights before step 3's update (skipped), and checkpoint 2 is still there.
    before, at_stop = (load_file(out / f"checkpoint-{step}" / "model.safetensors") for step in (2, 3))
    assert all(torch.equal(before[name], at_stop[name]) for name in before)
    assert all(torch.isfinite(tensor).all() for tensor in at_stop.values())
    assert not (out / "model.safetensors").exists() and not (out / "eval" / "final").exists()  # not a finished run

    resumed = run_recipe([*args, "--resume_from_checkpoint", "latest"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "Resuming from outputs/nan/checkpoint-3" in resumed.stdout
    assert logged_steps(resumed.stdout) == 2
    assert all(torch.isfinite(t).all() for t in load_file(out / "model.safetensors").values())
    assert json.loads((out / "health.json").read_text())["status"] == "findings"  # the stop's finding, kept


DIVERGING = """
import math

from grpo_kit import checks

checks.MAX_LEARNING_RATE = math.inf  # a rate the checks refuse (5e6 for 5e-6), let through to see the run diverge

import grpo_demo

grpo_demo.main()
"""


def test_a_run_that_diverges_stops_on_its_non_finite_loss_not_in_sampling(tmp_path):
    script = tmp_path / "diverging.py"
    script.write_text(DIVERGING)
    args = ["--smoke", "--max_steps", "6", "--learning_rate", "5e6", "--output_dir", "outputs/diverging"]
    stopped = run_recipe(args, cwd=tmp_path, script=script)
    assert stopped.returncode == 3, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout
    assert re.search(r"Stopped at step \d: the gradients are not finite", stopped.stdout)
    assert "a new run with --learning_rate 500000 (now 5e+06)" in stopped.stdout


# ----------------------------------------------------------------------------------------------------------------
# Resuming


# Four of the smoke preset's 64 training prompts (60 held out), two a step: an epoch is two steps, so every resume
# below starts in a later epoch, whose prompts and their order must be the ones the run that never stopped drew.
RUN = ["--smoke", "--max_steps", "6", "--save_steps", "2", "--validation_rows", "60"]


def logged_steps(stdout: str) -> int:
    """Optimizer steps a run logged to the console (one `step N/M  reward ...` line per step)."""
    return len(re.findall(r"^step \d+/\d+  reward ", stdout, re.MULTILINE))


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """`RUN` uninterrupted, into outputs/whole: (its working folder, where the runs that stop and resume go too)."""
    folder = tmp_path_factory.mktemp("resuming")
    whole = run_recipe([*RUN, "--output_dir", "outputs/whole"], cwd=folder)
    assert whole.returncode == 0, whole.stdout[-3000:]
    assert logged_steps(whole.stdout) == 6
    return folder


def test_a_run_killed_after_a_checkpoint_resumes_where_it_stopped(whole_run):
    killed_dir = whole_run / "outputs" / "killed"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "grpo_demo.py"), *RUN, "--output_dir", "outputs/killed"],
        cwd=whole_run,
        env=offline_env(whole_run),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600
    while not (killed_dir / "checkpoint-2" / "trainer_state.json").is_file():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed_dir / "model.safetensors").exists()  # it really died mid-run

    resumed = run_recipe([*RUN, "--output_dir", "outputs/killed", "--resume_from_checkpoint", "latest"], cwd=whole_run)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    start = int(re.search(r"Resuming from outputs/killed/checkpoint-(\d+)", resumed.stdout)[1])
    assert logged_steps(resumed.stdout) == 6 - start  # the steps before its checkpoint were not trained again
    assert "GSM8K baseline:" not in resumed.stdout  # the start model was measured when the run started
    record = json.loads((killed_dir / "run_record.json").read_text())
    assert "--resume_from_checkpoint" not in record["command"]  # the start's command, kept
    assert [entry["from"] for entry in record["resumes"]] == [f"outputs/killed/checkpoint-{start}"]
    assert "--resume_from_checkpoint" in record["resumes"][0]["command"]

    state = {
        name: json.loads((whole_run / "outputs" / name / "trainer_state.json").read_text())
        for name in ("whole", "killed")
    }
    assert state["killed"]["global_step"] == state["whole"]["global_step"] == 6

    def per_step(name, key):
        return {e["step"]: e[key] for e in state[name]["log_history"] if key in e}

    for key in ("learning_rate", "rewards/xmlcount_reward_func/mean", "num_tokens"):
        whole_values, resumed_values = per_step("whole", key), per_step("killed", key)
        assert all(resumed_values[s] == pytest.approx(whole_values[s]) for s in range(start + 1, 7)), key
    assert_same_final_weights(killed_dir, whole_run / "outputs" / "whole")


SIGNAL_IN_A_STEP = """
import os
import signal

import trl

STEP, RANK = int(os.environ["SIGNAL_IN_STEP"]), int(os.environ.get("SIGNAL_RANK", "0"))
original = trl.GRPOTrainer.compute_loss


def compute_loss(self, model, inputs, *args, **kwargs):
    if self.state.global_step == STEP - 1 and self.accelerator.process_index == RANK:
        os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))  # this process alone, in the middle of the step
    return original(self, model, inputs, *args, **kwargs)


trl.GRPOTrainer.compute_loss = compute_loss

import grpo_demo

grpo_demo.main()
"""


def test_sigterm_in_a_step_saves_that_step_exits_75_and_resumes_to_the_same_weights(whole_run):
    """What Slurm sends before a time limit or preemption: the step in progress finishes and is saved, the run
    stops with exit code 75, and resuming it gives the weights of a run that never stopped."""
    script = whole_run / "sigterm_in_step_3.py"
    script.write_text(SIGNAL_IN_A_STEP)
    args, out = [*RUN, "--output_dir", "outputs/sigterm"], whole_run / "outputs" / "sigterm"
    stopped = run_recipe(args, cwd=whole_run, script=script, SIGNAL="SIGTERM", SIGNAL_IN_STEP="3")
    assert stopped.returncode == stopping.EXIT_STOPPED == 75, stopped.stdout[-3000:]
    assert "SIGTERM: finishing step 3 of 6, saving it, then stopping (exit 75)" in stopped.stdout
    assert "Stopped at step 3: SIGTERM received. Saved: checkpoint-3. Continue the run: python " in stopped.stdout
    assert "Traceback" not in stopped.stdout
    # Step 3's checkpoint (save_steps 2 would not have made it), complete; not a finished run; the folder free.
    assert runs.missing_parts(out / "checkpoint-3") == []
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3
    assert not (out / "model.safetensors").exists() and not (out / "eval" / "final").exists()
    assert not (out / ".run.lock").exists()

    # The printed command, as printed (the run's own settings, resuming from latest)
    resumed = run_printed(stopped.stdout, "Continue the run: ", whole_run, SIGNAL="SIGTERM", SIGNAL_IN_STEP="3")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "Resuming from outputs/sigterm/checkpoint-3" in resumed.stdout
    assert logged_steps(resumed.stdout) == 3
    assert_same_final_weights(out, whole_run / "outputs" / "whole")


SIGNAL_BEFORE_THE_FIRST_STEP = """
import os
import signal

from grpo_kit import evaluation, models

WHERE = os.environ["SIGNAL_WHERE"]
loading, measuring = models.init_kwargs, evaluation.evaluate


def init_kwargs(*args, **kwargs):  # the settings of the weights about to load
    if WHERE == "loading":
        os.kill(os.getpid(), signal.SIGTERM)
    return loading(*args, **kwargs)


def evaluate(*args, **kwargs):  # the baseline evaluation
    if WHERE == "baseline":
        os.kill(os.getpid(), signal.SIGTERM)
    return measuring(*args, **kwargs)


models.init_kwargs, evaluation.evaluate = init_kwargs, evaluate

import grpo_demo

grpo_demo.main()
"""


@pytest.mark.parametrize("where", ["loading", "baseline"])
def test_sigterm_before_the_first_step_stops_at_once_and_the_printed_command_starts_it_again(where, tmp_path):
    """A scheduler's stop while the weights load or the start model is measured: nothing is trained, nothing to save,
    so no step is taken and no evaluation finished; exit 75 and a stop record that slurm/grpo.sbatch reads as a
    requeue with nothing lost (a run without a newer checkpoint: its cap on such runs applies)."""
    script = tmp_path / "sigterm_before.py"
    script.write_text(SIGNAL_BEFORE_THE_FIRST_STEP)
    args, out = [*RUN, "--output_dir", "outputs/early"], tmp_path / "outputs" / "early"
    record = tmp_path / "stop.json"
    stopped = run_recipe(args, cwd=tmp_path, script=script, SIGNAL_WHERE=where, GRPO_STOP_RECORD=str(record))
    assert stopped.returncode == stopping.EXIT_STOPPED == 75, stopped.stdout[-3000:]
    assert "SIGTERM before the first step: nothing trained since it started, nothing to save. Stopped (exit 75). " \
        "Start it again: python " in stopped.stdout  # fmt: skip
    assert "Traceback" not in stopped.stdout and logged_steps(stopped.stdout) == 0
    assert not list(out.glob("checkpoint-*")) and not (out / "eval" / "baseline").exists()  # stopped at once
    assert json.loads(record.read_text()) == {
        "exit": 75, "step": None, "checkpoint": None, "resumed_from": None,
        "reason": "SIGTERM received before the first step", "reached": None,
    }  # fmt: skip
    again = run_printed(stopped.stdout, "Start it again: ", tmp_path, SIGNAL_WHERE="nowhere")
    assert again.returncode == 0, again.stdout[-3000:]
    assert logged_steps(again.stdout) == 6


SIGNAL_THEN_FAIL = """
import os
import signal

import trl

original = trl.GRPOTrainer.compute_loss


def compute_loss(self, model, inputs, *args, **kwargs):
    if self.state.global_step == int(os.environ["FAIL_IN_STEP"]) - 1:  # a preemption's SIGTERM, which ends the
        os.kill(os.getpid(), signal.SIGTERM)  # vLLM server too: the step cannot get its completions
        self.args.use_vllm, self.args.vllm_mode = True, "server"  # generated by that server (as far as the stop sees)
        raise ConnectionError("the vLLM server is gone")
    return original(self, model, inputs, *args, **kwargs)


trl.GRPOTrainer.compute_loss = compute_loss

import grpo_demo

grpo_demo.main()
"""


def test_a_step_that_fails_after_a_preemption_records_the_newest_checkpoint_and_the_step_reached(tmp_path):
    """What slurm/grpo.sbatch reads to requeue a run that torchrun reports as exit 1: SIGTERM in step 4, whose step
    then fails as it would without its vLLM server. The record names checkpoint-2 (save_steps 2) and step 3 reached
    (step 3 lost), and the error is raised as it was."""
    script = tmp_path / "signal_then_fail.py"
    script.write_text(SIGNAL_THEN_FAIL)
    record = tmp_path / "stop.json"
    failed = run_recipe(
        [*RUN, "--output_dir", "outputs/failed"], tmp_path, script, FAIL_IN_STEP="4", GRPO_STOP_RECORD=str(record)
    )
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "ConnectionError: the vLLM server is gone" in failed.stdout
    assert json.loads(record.read_text()) == {
        "exit": 1, "step": 2, "checkpoint": "outputs/failed/checkpoint-2", "resumed_from": None,
        "reason": "SIGTERM received, then the step in progress failed (ConnectionError)", "reached": 3,
    }  # fmt: skip


def test_sigterm_under_save_only_model_exits_1_naming_the_checkpoint_to_start_a_new_run_from(tmp_path):
    """Its checkpoints hold no optimizer state: a resume would skip them all and start at step 0, so the stop must
    not exit 75, which a supervisor retries."""
    script = tmp_path / "sigterm_in_step_3.py"
    script.write_text(SIGNAL_IN_A_STEP)
    args, out = (
        [*RUN, "--save_only_model", "true", "--output_dir", "outputs/model-only"],
        tmp_path / "outputs/model-only",
    )
    stopped = run_recipe(args, cwd=tmp_path, script=script, SIGNAL="SIGTERM", SIGNAL_IN_STEP="3")
    assert stopped.returncode == 1, stopped.stdout[-3000:]
    model_only = "--save_only_model true: checkpoints hold the model alone, no optimizer state, so a stopped or crashed"
    assert f"{model_only} run cannot be resumed: SIGTERM, SIGUSR1 or SIGHUP saves the step's model and exits 1" in (
        stopped.stdout
    )
    assert "SIGTERM: finishing step 3 of 6, saving it, then stopping (exit 1)" in stopped.stdout
    assert (
        f"Stopped at step 3: SIGTERM received. Saved: checkpoint-3. {model_only} run cannot be resumed: "
        "--model_name_or_path outputs/model-only/checkpoint-3 starts a new run from its weights"
    ) in stopped.stdout
    assert "Traceback" not in stopped.stdout
    assert (out / "checkpoint-3" / "model.safetensors").is_file() and not (out / "checkpoint-3/optimizer.pt").exists()
    retried = run_recipe([*args, "--resume_from_checkpoint", "latest"], cwd=tmp_path)  # what a retry does anyway
    assert retried.returncode == 1 and "Traceback" not in retried.stdout, retried.stdout[-3000:]
    assert "outputs/model-only/checkpoint-3 holds the model alone (--save_only_model true saved no " in retried.stdout
    assert (out / "checkpoint-3" / "model.safetensors").is_file()


def test_a_closed_terminal_saves_the_step_in_progress_and_exits_75(tmp_path):
    """The recipe's output on a terminal that hangs up in step 6 of 8 (the window closed, ssh lost), then SIGHUP:
    writing to the terminal fails from then on, and the run still saves its step and exits 75, resumable."""
    import pty

    out = tmp_path / "outputs" / "hangup"
    terminal, screen = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "grpo_demo.py"), "--smoke", "--max_steps", "8", "--output_dir", str(out)],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=screen,
        stderr=screen,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),  # as a terminal's, even if pytest runs nohup
    )
    os.close(screen)
    said = b""
    while b"step 5/8 " not in said:  # step 5 logged: step 6 under way
        assert process.poll() is None, said[-3000:].decode(errors="replace")
        with contextlib.suppress(OSError):
            said += os.read(terminal, 65536)
    os.close(terminal)  # the terminal hangs up
    process.send_signal(signal.SIGHUP)
    assert process.wait(timeout=300) == stopping.EXIT_STOPPED == 75
    step = json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert 6 <= step < 8 and runs.missing_parts(out / f"checkpoint-{step}") == []  # the step it was in, resumable
    assert not (out / "model.safetensors").exists() and not (out / ".run.lock").exists()


def test_ctrl_c_saves_the_step_in_progress_says_so_and_frees_its_folder(tmp_path):
    out = tmp_path / "outputs" / "stopped"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "grpo_demo.py"), "--smoke", "--max_steps", "200", "--output_dir", str(out)],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As from a terminal: a shell's background job (CI may be one) starts its children ignoring Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    while not (out / "checkpoint-2" / "trainer_state.json").is_file():
        assert process.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == stopping.EXIT_INTERRUPTED == 130, output[-3000:]
    assert "Ctrl-C again stops at once, without a checkpoint" in output
    step = int(re.search(r"Stopped at step (\d+): Ctrl-C \(SIGINT\) received. Saved: checkpoint-\1\. ", output)[1])
    assert runs.missing_parts(out / f"checkpoint-{step}") == []  # the step it was in, saved: resumable
    assert "Traceback" not in output
    assert not (out / ".run.lock").exists()  # the folder is free for the resume


# ----------------------------------------------------------------------------------------------------------------
# Two processes (accelerate launch, CPU)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TWO = ["--smoke", "--max_steps", "2", "--save_steps", "2", "--report_to", "wandb"]


def launch_two(args: list[str], cwd: Path, script: Path = ROOT / "grpo_demo.py", **env: str):
    """`accelerate launch --config_file configs/cpu_ddp.yaml SCRIPT ARGS`: two processes on the CPU, offline."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "configs" / "cpu_ddp.yaml"), "--main_process_port", str(free_port()),
        str(script), *args,
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=cwd,
        env=offline_env(cwd, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """`TWO` under two processes, uninterrupted, into <folder>/run: (folder, output, console)."""
    folder = tmp_path_factory.mktemp("two-processes")
    result = launch_two([*TWO, "--output_dir", str(folder / "run")], folder)
    assert result.returncode == 0, result.stdout[-4000:]
    return folder, folder / "run", result.stdout


def test_two_processes_train_one_run_and_evaluate_it_together(two_process_run):
    folder, out, stdout = two_process_run

    # One checkpoint, written once: the model and optimizer by the main process, an RNG state by each process.
    checkpoint = out / "checkpoint-2"
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"):
        assert (checkpoint / name).is_file(), name
    # One set of logs: one wandb run, one run record, each step logged once.
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1
    assert stdout.count("Run record:") == 1
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    assert [e["step"] for e in state["log_history"] if "eval_accuracy_strict" in e] == [0, 2]

    # Every process generated for its own prompts; the logged rewards cover both processes' completions.
    per_process, generations = (
        presets.SETTINGS["smoke"]["per_device_train_batch_size"],
        presets.SETTINGS["smoke"]["num_generations"],
    )
    for entry in steps:
        table = pd.read_parquet(out / "completions" / f"completions_{entry['step']:05d}.parquet")
        assert len(table) == 2 * per_process
        prompts = table["prompt"].astype(str).value_counts()
        assert len(prompts) == 2 * per_process // generations and set(prompts) == {generations}
        for name in REWARD_NAMES:
            assert entry[f"rewards/{name}/mean"] == pytest.approx(table[name].mean(), abs=1e-6), name

    # One evaluation of each kind, of every test question, generated in two shares: the same completions as one
    # process generating them all from the saved weights.
    for name in ("baseline", "final"):  # the report's table header, printed once
        assert len(re.findall(rf"GSM8K {name} \(recipe protocol, 32 questions\): ", stdout)) == 1, name
    final = json.loads((out / "eval" / "final" / "summary.json").read_text())
    assert (final["n"], final["processes"]) == (32, 2)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = grpo_demo.get_gsm8k_questions("test", str(folder / "outputs" / "smoke-assets" / "gsm8k-generated"))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    alone, records = evaluation.evaluate(
        model, tokenizer, rows, grpo_demo.ANSWER_FORMAT, max_new_tokens=48, batch_size=64, model_name=str(out)
    )
    together = [json.loads(line)["completion"] for line in (out / "eval" / "final" / "completions.jsonl").open()]
    same = sum(a == b for a, b in zip(together, [r["completion"] for r in records], strict=True))
    assert same >= 30  # greedy on a near-random model: a float near-tie may flip in another batch shape, rarely
    assert final["accuracy_strict"] == alone["accuracy_strict"] and final["format_rate"] == alone["format_rate"]


def test_two_processes_stop_together_when_one_gets_sigterm_and_resume_to_the_same_weights(two_process_run):
    """Process 1 alone gets SIGTERM in step 1: both finish that step, save it together and stop; the resumed run
    ends with the weights of the run that never stopped."""
    folder, whole, _ = two_process_run
    script, out = folder / "sigterm_in_step_1.py", folder / "stopped"
    script.write_text(SIGNAL_IN_A_STEP)
    args = [*TWO, "--output_dir", str(out)]
    record = folder / "stop.json"  # where slurm/grpo.sbatch asks for the stop every process agreed on
    stopped = launch_two(
        args, folder, script, SIGNAL="SIGTERM", SIGNAL_IN_STEP="1", SIGNAL_RANK="1", GRPO_STOP_RECORD=str(record)
    )
    # The main process, which got no signal, stopped at step 1 for it; accelerate launch exits 1 when a process
    # does not exit 0, naming the processes' own exit code.
    assert stopped.returncode == 1, stopped.stdout[-4000:]
    assert "Stopped at step 1: SIGTERM received. Saved: checkpoint-1." in stopped.stdout
    assert re.search(r"exitcode\s*:\s*75", stopped.stdout)
    # One checkpoint of step 1, each process's part in it; nobody trained step 2.
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-1"]
    assert runs.missing_parts(out / "checkpoint-1") == []
    assert all((out / "checkpoint-1" / f"rng_state_{rank}.pth").is_file() for rank in (0, 1))
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1
    assert json.loads(record.read_text()) == {
        "exit": 75, "step": 1, "checkpoint": f"{out}/checkpoint-1", "resumed_from": None, "reason": "SIGTERM received",
        "reached": 1,
    }  # fmt: skip

    resumed = launch_two([*args, "--resume_from_checkpoint", "latest"], folder)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"Resuming from {out}/checkpoint-1" in resumed.stdout
    assert logged_steps(resumed.stdout) == 1  # step 2 alone (a seeded rerun from step 0 ends on the same weights)
    assert_same_final_weights(out, whole)


# ----------------------------------------------------------------------------------------------------------------
# LoRA: train with --use_peft, merge with the documented command


@pytest.mark.parametrize(
    ("tiny_model", "architecture"), [("qwen2", "Qwen2ForCausalLM"), ("llama3", "LlamaForCausalLM")]
)
def test_lora_run_trains_only_the_adapter_and_merges_into_a_model(tmp_path, tiny_model, architecture):
    """The same seven projections by name on both architectures, the same merge."""
    out, merged_dir = tmp_path / "outputs" / "lora", tmp_path / "outputs" / "lora-merged"
    r, alpha = 4, 16
    args = [
        "--smoke", "--tiny_model", tiny_model, "--use_peft", "--lora_r", str(r), "--lora_alpha", str(alpha),
        "--output_dir", str(out), "--max_steps", "3", "--save_steps", "3", "--weight_decay", "0",
        "--learning_rate", "1e-3",
    ]  # fmt: skip
    result = run_recipe(args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    base_file = tmp_path / "outputs" / "smoke-assets" / f"tiny-{tiny_model}" / "model.safetensors"

    # The run saved an adapter, not a model: LoRA A and B for every projection of both layers, nothing else.
    assert not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], set(config["target_modules"])) == (r, alpha, TARGETS)
    adapter = load_file(out / "adapter_model.safetensors")
    assert len(adapter) == 2 * len(TARGETS) * 2
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter)
    optimizer = torch.load(out / "checkpoint-3" / "optimizer.pt", weights_only=True)
    assert sum(len(group["params"]) for group in optimizer["param_groups"]) == len(adapter)  # the base was frozen
    assert all(tensor.abs().sum() > 0 for name, tensor in adapter.items() if ".lora_B." in name)  # B starts at 0

    merged_run = subprocess.run(
        [sys.executable, "-m", "grpo_kit.merge", "--adapter", str(out), "--output", str(merged_dir)],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert merged_run.returncode == 0, merged_run.stderr[-4000:]
    assert json.loads((merged_dir / "config.json").read_text())["architectures"] == [architecture]
    # Merged = base + (alpha / r) B A on the targeted projections; every other weight is the base's.
    base_weights, merged_weights = load_file(base_file), load_file(merged_dir / "model.safetensors")
    assert merged_weights.keys() == base_weights.keys()
    for name, weight in base_weights.items():
        module = name.removesuffix(".weight").split(".")[-1]
        if module in TARGETS:
            prefix = "base_model.model." + name.removesuffix(".weight")
            delta = adapter[f"{prefix}.lora_B.weight"] @ adapter[f"{prefix}.lora_A.weight"] * (alpha / r)
            torch.testing.assert_close(merged_weights[name], weight + delta, rtol=0, atol=1e-6)
            assert not merged_weights[name].equal(weight), name
        else:
            assert merged_weights[name].equal(weight), name


# ----------------------------------------------------------------------------------------------------------------
# A copied and edited recipe behaves as itself


def test_a_copied_recipe_with_think_tags_trains_evaluates_and_asks_in_its_own_format(tmp_path, monkeypatch):
    """A user copies grpo_demo.py to my_recipe.py and sets REASONING_TAG = "think". Its run asks for, rewards and
    evaluates the `<think>` format, and its --ask asks in it (what each part does with a tag it is given:
    test_rewards.py, test_evaluation.py, and on a real model test_real_model.py)."""
    source = (ROOT / "grpo_demo.py").read_text(encoding="utf-8")
    line = 'REASONING_TAG = "reasoning"'
    assert source.count(line) == 1
    copy = tmp_path / "my_recipe.py"
    copy.write_text(source.replace(line, 'REASONING_TAG = "think"'), encoding="utf-8")

    result = run_recipe(["--smoke", "--max_steps", "1", "--warmup_steps", "0"], tmp_path, copy)
    assert result.returncode == 0, result.stdout[-4000:]
    run = tmp_path / "outputs" / "smoke-GRPO"
    baseline = json.loads((run / "eval" / "baseline" / "summary.json").read_text())
    assert baseline["tags"] == ["<think>", "</think>", "<answer>", "</answer>"]
    assert "<think>" in baseline["first_prompt"] and "<reasoning>" not in baseline["first_prompt"]
    record = json.loads((run / "run_record.json").read_text())
    assert record["settings"]["run"]["reasoning_tag"] == "think"

    spec = importlib.util.spec_from_file_location("my_recipe", copy)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    asked = []  # --ask puts the question in the copy's format
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(generation, "sample", lambda model, tokenizer, messages, *rest: asked.append(messages) or "")
    recipe.main(["--smoke", "--model_name_or_path", str(run), "--ask", "Ava has 12 shells."])
    assert "<think>" in asked[0][0]["content"] and asked[0][1]["content"] == "Ava has 12 shells."

    think = "<think>\nSome steps.\n</think>\n<answer>\n18\n</answer>\n"
    reasoning = "<reasoning>\nSome steps.\n</reasoning>\n<answer>\n18\n</answer>\n"
    assert (
        recipe.SYSTEM_PROMPT == "\nRespond in the following format:\n<think>\n...\n</think>\n<answer>\n...\n</answer>\n"
    )
    scores = {
        func.__name__: [func(prompts=[[]], completions=[t], answer=["18"])[0] for t in (think, reasoning)]
        for func in recipe.REWARD_FUNCS
    }
    assert scores == {
        "xmlcount_reward_func": [0.5, 0.25],  # the reasoning tags no longer count
        "soft_format_reward_func": [0.5, 0.0],  # a <reasoning> block is no longer the format
        "strict_format_reward_func": [0.5, 0.0],
        "int_reward_func": [0.5, 0.5],  # reads only the answer block, whose tag is unchanged
        "correctness_reward_func": [2.0, 2.0],
    }


# ----------------------------------------------------------------------------------------------------------------
# The Llama swap: a tiny Llama with Llama 3's chat conventions through the same runs


@pytest.fixture(scope="module")
def llama_smoke_run(tmp_path_factory):
    """`python grpo_demo.py --smoke --tiny_model llama3` (weight decay 0: any change in the weights comes from the
    rewards' gradient)."""
    folder = tmp_path_factory.mktemp("llama-smoke-run")
    result = run_recipe(["--smoke", "--tiny_model", "llama3", "--weight_decay", "0"], cwd=folder)
    assert result.returncode == 0, result.stdout[-4000:]
    return folder, folder / "outputs" / "smoke-llama3-GRPO"


def test_a_llama_smoke_run_trains_the_llama_model_in_folders_of_its_own(llama_smoke_run):
    from transformers import AutoTokenizer

    folder, out = llama_smoke_run
    assets = folder / "outputs" / "smoke-assets"
    assert sorted(p.name for p in assets.iterdir()) == ["gsm8k-generated", "tiny-llama3"]  # no Qwen2 model built
    record = json.loads((out / "run_record.json").read_text())
    assert record["settings"]["model"]["model_name_or_path"] == "outputs/smoke-assets/tiny-llama3"
    assert record["settings"]["training"]["run_name"] == "smoke-llama3-GRPO-generated"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    for step in (2, 4):
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
            assert (out / f"checkpoint-{step}" / name).is_file(), f"checkpoint-{step}/{name} missing"
    steps = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    assert all(f"rewards/{name}/mean" in e for e in steps for name in REWARD_NAMES)
    base, trained = load_file(assets / "tiny-llama3" / "model.safetensors"), load_file(out / "model.safetensors")
    assert base.keys() == trained.keys()
    assert any(not base[name].equal(trained[name]) for name in base), "GRPO left every weight unchanged"
    comparison = json.loads((out / "eval" / "comparison.json").read_text())
    assert (comparison["baseline"]["n"], comparison["final"]["n"]) == (32, 32)
    # The trained model keeps Llama 3's end tokens and pads with the token reserved for it.
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|end_of_text|>", "<|finetune_right_pad_id|>")
    ends = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") in ends


def test_a_llama_run_resumed_from_its_checkpoint_ends_as_the_whole_run(llama_smoke_run):
    """The smoke run cut after its step-2 checkpoint (its folder without what came later), then resumed."""
    folder, whole = llama_smoke_run
    cut = folder / "outputs" / "llama-cut"
    cut.mkdir()
    shutil.copytree(whole / "checkpoint-2", cut / "checkpoint-2")
    shutil.copy(whole / "run_record.json", cut / "run_record.json")
    args = ["--smoke", "--tiny_model", "llama3", "--weight_decay", "0", "--output_dir", "outputs/llama-cut"]
    resumed = run_recipe([*args, "--resume_from_checkpoint", "latest"], cwd=folder)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "Resuming from outputs/llama-cut/checkpoint-2" in resumed.stdout
    assert logged_steps(resumed.stdout) == 2  # steps 3 and 4
    state = {p.name: json.loads((p / "trainer_state.json").read_text()) for p in (whole, cut)}
    assert state["llama-cut"]["global_step"] == state["smoke-llama3-GRPO"]["global_step"] == 4
    assert_same_final_weights(cut, whole)


def test_editing_model_name_in_a_copied_recipe_trains_a_llama_under_its_names(tmp_path, tiny_llama_dir, gsm8k_dir):
    """A user copies grpo_demo.py and sets MODEL_NAME to Llama-3.2-1B-Instruct: here a local folder of that name that
    holds the tiny Llama (nothing is downloaded). The copy trains that model, in outputs/Llama-1B-GRPO."""
    model = shutil.copytree(tiny_llama_dir, tmp_path / "models" / "Llama-3.2-1B-Instruct")
    source = (ROOT / "grpo_demo.py").read_text(encoding="utf-8")
    line = 'MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"'
    assert source.count(line) == 1
    copy = tmp_path / "my_recipe.py"
    copy.write_text(source.replace(line, f'MODEL_NAME = "{model}"'), encoding="utf-8")
    args = [
        "--dataset", str(gsm8k_dir), "--report_to", "none", "--max_steps", "1", "--warmup_steps", "0",
        "--num_generations", "4",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--max_completion_length", "16",
        "--eval_limit", "8", "--eval_every_steps", "0",
    ]  # fmt: skip
    result = run_recipe(args, tmp_path, copy)
    assert result.returncode == 0, result.stdout[-4000:]
    out = tmp_path / "outputs" / "Llama-1B-GRPO"
    record = json.loads((out / "run_record.json").read_text())
    assert record["settings"]["model"]["model_name_or_path"] == str(model)
    assert record["settings"]["training"]["run_name"] == "Llama-1B-GRPO-gsm8k"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((out / "eval" / "final" / "summary.json").read_text())["n"] == 8


# ----------------------------------------------------------------------------------------------------------------
# A user without network gets a message, not a traceback


def test_an_unreachable_hub_names_the_local_options_and_the_commands_run_as_printed(tmp_path):
    result = run_recipe(["--max_steps", "1", "--warmup_steps", "0", "--report_to", "none"], cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stdout
    assert not (tmp_path / "outputs").exists()  # a run that wrote nothing leaves no empty folder
    script = ROOT / "grpo_demo.py"
    smoke_line = f"python {script} --smoke (the whole recipe, seconds)"
    assert "--dataset DIR (a folder with train.jsonl and test.jsonl), or try the recipe on generated problems: " in (
        result.stdout
    )
    # Each printed command, run as printed: --demo's is the one test_demo.py runs whole (a slow, 2-minute run)
    assert f"{smoke_line} or python {script} --demo (GRPO learning, ~2 min)" in result.stdout
    smoke = run_printed(
        result.stdout.replace(" (the whole recipe, seconds) or", "\n"), "generated problems: ", tmp_path
    )
    assert smoke.returncode == 0, smoke.stdout[-3000:]
    assert (tmp_path / "outputs" / "smoke-GRPO" / "model.safetensors").is_file()


def test_a_missing_model_offline_is_a_short_message(tmp_path):
    data = smoke.write_gsm8k_folder(tmp_path / "data", n_train=4, n_test=2)
    args = ["--dataset", str(data), "--model_name_or_path", "nobody/no-such-model", "--report_to", "none"]
    result = run_recipe(args, cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stdout
    assert "Could not load the model 'nobody/no-such-model'" in result.stdout
