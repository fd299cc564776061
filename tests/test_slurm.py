"""The Slurm launch (slurm/grpo.sbatch), run without a cluster: stand-ins for Slurm's commands, vLLM's server and
accelerate record what each node would run. The first node serves vLLM, the others train under accelerate launch
with their machine ranks; training waits for the server's health check; a stop signal before the time limit is
passed on to the training, and the job requeues itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, resolved

from grpo_kit import checks

TIMEOUT = 300  # a script that ends while a child it started holds its output would hang the test: it fails instead
BATCH = ROOT / "slurm" / "grpo.sbatch"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"

STUB = """#!{python}
# A stand-in for a command of Slurm's or the cluster's: records its call as a JSON line in $STUB_LOG (name,
# arguments, the node it runs on, the launcher's variables) and acts as the real one does for slurm/grpo.sbatch.
import json, os, signal, subprocess, sys, time
from pathlib import Path

name, args = Path(sys.argv[0]).name, sys.argv[1:]
log = Path(os.environ["STUB_LOG"])
node = os.environ.get("SLURMD_NODENAME")


def record(**extra):
    names = ("PET_SIGNALS_TO_HANDLE", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "GRPO_STOP_RECORD", "VLLM_HOST_IP")
    env = {{k: os.environ[k] for k in names if k in os.environ}}
    with log.open("a") as f:
        f.write(json.dumps({{"name": name, "args": args, "node": node, "env": env, **extra}}) + "\\n")


def wait_for_a_signal(*signals):
    got = []
    for number in signals:
        signal.signal(number, lambda n, f: got.append(signal.Signals(n).name))
    return got


if name == "scontrol":  # `show hostnames LIST`: the nodes, one a line; `requeue JOB`: recorded
    record()
    if args[:2] == ["show", "hostnames"]:
        print("\\n".join(os.environ["STUB_NODES"].split()))
elif name == "srun":  # the command once per node of --nodelist, as real srun runs a step (src/srun signals.c):
    # every task in a session of its own (slurmstepd's); SIGUSR1 reaches every process of the step unchanged;
    # SIGTERM makes srun kill the whole step with SIGKILL ("forcing job termination").
    split = next(i for i, arg in enumerate(args) if not arg.startswith("--"))  # options are written --name=value
    options, command = dict(arg[2:].partition("=")[::2] for arg in args[:split]), args[split:]
    record(options=options, command=command)
    children = []

    def forward(number, frame):
        if number == signal.SIGTERM:
            print("srun: forcing job termination", file=sys.stderr, flush=True)
            number = signal.SIGKILL
        for child in children:
            try:
                os.killpg(child.pid, number)
            except ProcessLookupError:
                pass

    for number in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(number, forward)
    for rank, host in enumerate(options["nodelist"].split(",")):
        out = open(options["output"].replace("%N", host), "a") if "output" in options else None
        # SLURM_NODEID counts the step's nodes (measured on Slurm 22.05): with one task per node, the task's rank.
        env = {{**os.environ, "SLURMD_NODENAME": host, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank)}}
        children.append(subprocess.Popen(command, env=env, stdout=out, stderr=out and subprocess.STDOUT,
                                         start_new_session=True))
    sys.exit(max(child.wait() for child in children))
elif name == "vllm":  # the vLLM server: serves until SIGTERM; SIGUSR1 ends it (Python's default), recorded
    record()
    signal.signal(signal.SIGUSR1, lambda n, f: (record(signalled=["SIGUSR1"]), sys.exit(1)))
    got = wait_for_a_signal(signal.SIGTERM)
    while not got:
        signal.pause()
elif name == "sleep":  # a nap: recorded as it starts, and if SIGTERM ends it (most tests use a `sleep` that returns)
    signal.signal(signal.SIGTERM, lambda n, f: (record(signalled=["SIGTERM"]), sys.exit(143)))
    record()
    time.sleep(float(args[0]))
elif name == "curl":  # the health check: fails STUB_HEALTHY_AFTER times, then answers ("never": never does)
    record()
    after = os.environ.get("STUB_HEALTHY_AFTER", "0")
    calls = sum(json.loads(line)["name"] == "curl" for line in log.read_text().splitlines())
    sys.exit(0 if after != "never" and calls > int(after) else 7)
elif name == "accelerate":  # one node's launcher: STUB_TRAIN ok (exit 0), fail (1), or stop: waits for a signal,
    # then (as the recipe's processes do) the main one writes the stop record of step STUB_STEP, resumed from
    # STUB_RESUMED (where STUB_REACHED is set: the step in progress failed after the signal, the run had reached
    # that step), and the launcher exits 1, as torchrun does whatever its processes exit with
    print(f"accelerate on {{node}}")
    mode = os.environ.get("STUB_TRAIN", "ok")
    if mode == "stop":
        got = wait_for_a_signal(signal.SIGTERM, signal.SIGUSR1)
        Path(f"{{log}}.training-on-{{node}}").write_text(str(os.getpid()))
        while not got:
            signal.pause()
        if os.environ["SLURM_PROCID"] == "0":
            resumed, reached = os.environ.get("STUB_RESUMED"), os.environ.get("STUB_REACHED")
            stop = {{"exit": 75, "step": int(os.environ.get("STUB_STEP", "3")), "checkpoint": "out/checkpoint-3",
                    "resumed_from": int(resumed) if resumed else None, "reason": f"{{got[0]}} received"}}
            if reached:
                stop |= {{"exit": 1, "reached": int(reached), "reason": f"{{got[0]}} received, then the step in "
                         "progress failed (ConnectionError)"}}
            Path(os.environ["GRPO_STOP_RECORD"]).write_text(json.dumps(stop))
        record(signalled=got)
        sys.exit(1)
    record()
    sys.exit(0 if mode == "ok" else 1)
"""


@pytest.fixture
def stubs(tmp_path):
    """A folder of stand-ins for scontrol, srun, vllm, curl, accelerate, and sleep (which returns at once)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("scontrol", "srun", "vllm", "curl", "accelerate"):
        (folder / name).write_text(STUB.format(python=sys.executable))
        (folder / name).chmod(0o755)
    (folder / "sleep").write_text("#!/bin/sh\n")
    (folder / "sleep").chmod(0o755)
    return folder


def batch_env(tmp_path, stubs, nodes: int, **extra: str) -> dict[str, str]:
    """A Slurm job's environment on its first node, `nodes` nodes gpu01, gpu02... allocated."""
    names = [f"gpu{i:02d}" for i in range(1, nodes + 1)]
    return {
        "PATH": f"{stubs}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": f"gpu[01-{nodes:02d}]",
        "STUB_NODES": " ".join(names),
        "STUB_LOG": str(tmp_path / "calls.jsonl"),
        "LOG_DIR": str(tmp_path / "logs"),
        "VLLM_MAX_MODEL_LEN": "1042",  # given: deriving it runs the recipe's settings (one test does)
        **extra,
    }


def calls(env: dict[str, str]) -> list[dict]:
    path = Path(env["STUB_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def per_node(recorded: list[dict]) -> dict[str, list[list[str]]]:
    """What each node ran: {node: [[command, arguments...], ...]}."""
    nodes: dict[str, list[list[str]]] = {}
    for call in recorded:
        if call["node"]:
            nodes.setdefault(call["node"], []).append([call["name"], *call["args"]])
    return nodes


def train_command(
    rank: int, machines: int, processes: int, config: str, model: str, port: str, extra: list[str], length="1042"
):
    return [
        "accelerate", "launch", "--machine_rank", str(rank),
        "--config_file", config, "--num_machines", str(machines), "--num_processes", str(processes),
        "--main_process_ip", "gpu02", "--main_process_port", "29500",
        "grpo_demo.py", *(["--model_name_or_path", model] if model else []),
        "--use_vllm", "true", "--vllm_mode", "server",
        "--vllm_server_host", "gpu01", "--vllm_server_port", port, "--vllm_max_model_length", length,
        "--resume_from_checkpoint", "latest", *extra,
    ]  # fmt: skip


RECIPE = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"]  # 64 completions per step


@pytest.mark.slow  # the recipe resolves its settings in a subprocess
@pytest.mark.parametrize(
    ("nodes", "args", "env", "gpus", "config", "model", "port", "parallel", "length"),
    [
        (3, ["--", *RECIPE], {}, 8, "configs/zero2.yaml", MODEL, "8000", ("8", "1"), "1042"),  # 1 serves, 2 train
        (  # settings from the environment and the command line (which wins); vLLM's sizes derived from them
            4,
            [
                "--zero3",
                "--model",
                "Qwen/Qwen2.5-7B-Instruct",
                "--vllm_port",
                "8200",
                "--vllm_tensor_parallel",
                "2",
                "--",
                *RECIPE,
                "--max_completion_length",
                "300",
            ],
            {"GPUS_PER_NODE": "4", "VLLM_PORT": "8100"},
            4,
            "configs/zero3.yaml",
            "Qwen/Qwen2.5-7B-Instruct",
            "8200",
            ("2", "2"),  # 4 GPUs / tensor parallel 2: two engines
            str(256 + 300),  # the prompt cap and the completion length as the recipe resolves them
        ),
    ],
    ids=["defaults", "settings"],
)
def test_the_first_node_serves_vllm_and_the_others_train_with_their_ranks(
    tmp_path, stubs, nodes, args, env, gpus, config, model, port, parallel, length
):
    env = batch_env(tmp_path, stubs, nodes, **env)
    del env["VLLM_MAX_MODEL_LEN"]  # derived from the recipe's settings
    result = subprocess.run(
        ["bash", str(BATCH), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    machines = nodes - 1
    serve = [
        "vllm", "serve", model, "--data-parallel-size", parallel[0], "--tensor-parallel-size", parallel[1],
        "--max-model-len", length, "--host", "0.0.0.0", "--port", port,
        "--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
        "--max-logprobs", "-1", "--enable-scale-out",
    ]  # fmt: skip
    extra = args[args.index("--") + 1 :]
    expected = {"gpu01": [serve]}
    for rank in range(machines):
        named = model if "--model" in args else None  # unnamed: the recipe's own (served as it resolves it)
        command = train_command(rank, machines, machines * gpus, config, named, port, extra, length)
        expected[f"gpu{rank + 2:02d}"] = [command]
    recorded = calls(env)
    assert per_node(recorded) == expected

    # The steps as Slurm is asked for them; training started once the server answered.
    steps = [call["options"] for call in recorded if call["name"] == "srun"]
    logs = tmp_path / "logs" / "77" / "run-0"
    train_nodes = ",".join(f"gpu{i:02d}" for i in range(2, nodes + 1))
    assert steps == [
        {"nodes": "1", "ntasks": "1", "nodelist": "gpu01", "output": f"{logs}/vllm-gpu01.log"},
        {"nodes": str(machines), "ntasks": str(machines), "ntasks-per-node": "1", "nodelist": train_nodes,
         "kill-on-bad-exit": "1"},
    ]  # fmt: skip
    names = [call["name"] for call in recorded]
    assert names.index("curl") < names.index("accelerate")
    assert next(call for call in recorded if call["name"] == "curl")["args"][-1] == f"http://gpu01:{port}/health"
    # Each node's log; the launcher passes SIGUSR1 on to its processes and gives them time to save; the main process
    # is told where to write a resumable stop; the weight sync's address is set, never vLLM's 0.0.0.0.
    assert sorted(p.name for p in logs.iterdir() if p.name.endswith(".log")) == sorted(
        ["settings.log", "vllm-gpu01.log", *(f"train-gpu{i:02d}.log" for i in range(2, nodes + 1))]
    )
    launchers = [call for call in recorded if call["name"] == "accelerate"]
    assert all("SIGUSR1" in c["env"]["PET_SIGNALS_TO_HANDLE"].split(",") for c in launchers)
    assert {c["env"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] for c in launchers} == {"240"}
    assert {c["env"]["GRPO_STOP_RECORD"] for c in launchers} == {str(logs / "stop.json")}
    assert all(c["env"]["VLLM_HOST_IP"] not in ("", "0.0.0.0") for c in launchers)
    assert not any(call["name"] == "scontrol" and call["args"][0] == "requeue" for call in recorded)


def test_without_vllm_every_node_trains_with_the_recipes_model(tmp_path, stubs):
    env = batch_env(tmp_path, stubs, 3)
    result = subprocess.run(
        ["bash", str(BATCH), "--no_vllm", "--", *RECIPE], cwd=ROOT, env=env, capture_output=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    launches = per_node(calls(env))
    assert sorted(launches) == ["gpu01", "gpu02", "gpu03"]
    for rank, node in enumerate(("gpu01", "gpu02", "gpu03")):
        [launch] = launches[node]
        assert launch[:4] == ["accelerate", "launch", "--machine_rank", str(rank)]
        recipe = launch[launch.index("grpo_demo.py") + 1 :]
        assert recipe == ["--use_vllm", "false", "--resume_from_checkpoint", "latest", *RECIPE]  # no model named
        assert launch[launch.index("--num_processes") + 1] == "24"
        assert launch[launch.index("--main_process_ip") + 1] == "gpu01"
    assert not any(call["name"] in ("vllm", "curl") for call in calls(env))


def test_the_settings_the_launch_passes_are_valid_recipe_settings(tmp_path, stubs, fake_cuda, monkeypatch):
    """What each training process gets, checked by the recipe as it would check it there (16 processes, ZeRO-2,
    vLLM installed): server mode is accepted, pointed at the serving node."""
    env = batch_env(tmp_path, stubs, 3)
    assert (
        subprocess.run(
            ["bash", str(BATCH), "--", *RECIPE], cwd=ROOT, env=env, capture_output=True, timeout=TIMEOUT
        ).returncode
        == 0
    )
    launch = next(call["args"] for call in calls(env) if call["name"] == "accelerate")
    recipe_args = launch[launch.index("grpo_demo.py") + 1 :]
    launched = {"WORLD_SIZE": "16", "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}
    for name, value in launched.items():  # as accelerate launch and torchrun set them
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(checks, "installed_version", {"vllm": "0.30.0"}.get)
    monkeypatch.chdir(tmp_path)
    chosen = resolved(recipe_args)
    server = (chosen.use_vllm, chosen.vllm_mode, chosen.vllm_server_host, chosen.vllm_server_port)
    assert server == (True, "server", "gpu01", 8000)
    assert chosen.resume_from_checkpoint is None  # nothing to resume yet: a fresh start, said
    # 16 processes x 4 completions x 1 accumulation step: the reference's 4 prompts of 16 completions per step.
    assert 16 * chosen.per_device_train_batch_size * chosen.gradient_accumulation_steps // chosen.num_generations == 4


def test_training_waits_for_the_servers_health_check_and_gives_up_with_a_message(tmp_path, stubs):
    env = batch_env(tmp_path, stubs, 3, STUB_HEALTHY_AFTER="never", VLLM_WAIT="30")
    result = subprocess.run(["bash", str(BATCH)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1
    log = tmp_path / "logs" / "77" / "run-0" / "vllm-gpu01.log"
    assert (
        f"the vLLM server on gpu01 did not answer http://gpu01:8000/health within 30 s (--vllm_wait): see {log}"
        in result.stderr
    )
    recorded = calls(env)
    assert [call["name"] for call in recorded].count("curl") == 4  # at 0, 10, 20 and 30 s
    assert "accelerate" not in [call["name"] for call in recorded]  # training never started


def test_a_stop_signal_reaches_every_training_node_and_the_job_requeues_itself(tmp_path, stubs):
    """Slurm's SIGUSR1 before the time limit (--signal=B:USR1@300) reaches the batch script only."""
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop")
    batch = start_batch(env)
    started = [Path(f"{env['STUB_LOG']}.training-on-{node}") for node in ("gpu02", "gpu03")]
    while not all(path.exists() for path in started):
        assert batch.poll() is None, batch.communicate()
        time.sleep(0.01)
    batch.send_signal(signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert batch.returncode == 1, stderr  # what the launchers exited with
    recorded = calls(env)
    assert {call["node"]: call["signalled"] for call in recorded if call["name"] == "accelerate"} == {
        "gpu02": ["SIGUSR1"],
        "gpu03": ["SIGUSR1"],
    }
    assert [call["args"] for call in recorded if call["name"] == "scontrol"][-1] == ["requeue", "77"]
    assert "SIGUSR1: asking the training to save its step and stop" in stdout
    assert "training stopped (SIGUSR1 received), saved at step 3: requeueing job 77 (requeue 1 of at most 20)" in stdout


def test_training_that_fails_on_its_own_is_not_requeued(tmp_path, stubs):
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="fail")
    result = subprocess.run(["bash", str(BATCH)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1
    assert "training failed (exit 1): not requeued" in result.stderr
    assert not any(call["name"] == "scontrol" and call["args"][0] == "requeue" for call in calls(env))


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_batch_left_running():
    """A test that fails midway leaves no batch script behind: its process group is killed (one that waits for a
    server that never answers would otherwise run for a day)."""
    yield
    while STARTED:
        batch = STARTED.pop()
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
            batch.communicate()


def start_batch(env: dict[str, str], *args: str) -> subprocess.Popen:
    """The batch script in a process group of its own: the batch step, which Slurm signals as a whole."""
    STARTED.append(subprocess.Popen(
        ["bash", str(BATCH), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ))  # fmt: skip
    return STARTED[-1]


def training_started(env: dict[str, str], batch: subprocess.Popen, nodes=("gpu02", "gpu03")) -> list[int]:
    """Wait until every training node's launcher waits for a signal; their pids."""
    started = [Path(f"{env['STUB_LOG']}.training-on-{node}") for node in nodes]
    while not all(path.exists() and path.read_text() for path in started):
        assert batch.poll() is None, batch.communicate()
        time.sleep(0.01)
    return [int(path.read_text()) for path in started]


def requeued(env: dict[str, str]) -> bool:
    return any(call["name"] == "scontrol" and call["args"][0] == "requeue" for call in calls(env))


def test_sigterm_to_the_batch_step_ends_the_job_killing_the_training_and_is_not_requeued(tmp_path, stubs):
    """scancel (and the time limit itself) signals every step with SIGTERM, the batch shell and srun in it too:
    srun answers with SIGKILL to its tasks, so nothing saves, and a job Slurm is ending must not be requeued."""
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop")
    batch = start_batch(env)
    training_started(env, batch)
    os.killpg(batch.pid, signal.SIGTERM)
    stdout, stderr = batch.communicate(timeout=60)
    assert batch.returncode != 0
    assert "SIGTERM: Slurm is ending the job (scancel, the time limit, or a preemption's grace time is over)" in stdout
    assert "the job ended on SIGTERM (training exit" in stderr and "not requeued" in stderr
    assert "srun: forcing job termination" in stderr
    assert not any(call.get("signalled") for call in calls(env))  # killed, not asked to save
    assert not requeued(env)


def test_a_preemptions_sigterm_to_the_training_processes_saves_and_requeues(tmp_path, stubs):
    """With a grace time, Slurm signals the steps' processes (not the batch shell): the training saves, writes its
    stop record, and the job requeues on it."""
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop")
    batch = start_batch(env)
    for pid in training_started(env, batch):
        os.kill(pid, signal.SIGTERM)
    stdout, stderr = batch.communicate(timeout=60)
    assert batch.returncode == 1, stderr
    assert "training stopped (SIGTERM received), saved at step 3: requeueing job 77" in stdout
    assert requeued(env)


@pytest.mark.parametrize(
    ("resumed", "stalled_before", "outcome"),
    [
        ("2", "0", "requeueing job 77"),  # checkpoint-3 is newer than the run's start: progress
        ("3", "0", "without a newer checkpoint (1 run(s) in a row): requeueing"),
        ("3", "1", "not requeued: 2 runs in a row stopped before they saved a newer checkpoint (--max_stalled_runs 2)"),
    ],
    ids=["progress", "first-stall", "second-stall"],
)
def test_a_stop_requeues_while_its_checkpoint_advances_or_up_to_the_cap(
    tmp_path, stubs, resumed, stalled_before, outcome
):
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop", STUB_RESUMED=resumed)
    env["SLURM_RESTART_COUNT"] = "1"
    (tmp_path / "logs" / "77").mkdir(parents=True)
    (tmp_path / "logs" / "77" / "stalled-runs").write_text(stalled_before)
    batch = start_batch(env)
    training_started(env, batch)
    batch.send_signal(signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert outcome in stdout + stderr
    assert requeued(env) == ("not requeued" not in outcome)


@pytest.mark.parametrize(
    ("resumed", "outcome"),
    [
        ("2", "steps 4-5 lost), newest checkpoint at step 3: requeueing job 77"),  # newer than its start: progress
        ("3", "steps 4-5 lost) without a newer checkpoint (1 run(s) in a row): requeueing job 77"),
    ],
    ids=["progress", "stall"],
)
def test_a_step_that_fails_after_a_preemptions_sigterm_says_what_is_lost_and_requeues(
    tmp_path, stubs, resumed, outcome
):
    """A preemption's SIGTERM reaches the vLLM server's step as well: the training's step in progress then fails
    (its main process loses the server mid-generation), and its stop record names the newest complete checkpoint
    and the step the run had reached. Requeued as any stop is, by whether that checkpoint is newer than the run's
    start; the steps after it stated as lost."""
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop", STUB_RESUMED=resumed, STUB_REACHED="5")
    batch = start_batch(env)
    for pid in training_started(env, batch):
        os.kill(pid, signal.SIGTERM)
    stdout, stderr = batch.communicate(timeout=60)
    assert batch.returncode == 1, stderr
    assert (
        "training stopped (SIGTERM received, then the step in progress failed (ConnectionError); " + outcome
    ) in stdout, stdout + stderr
    assert requeued(env)


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            ["--gpus_per_node", "99999999999999999999"],
            {},
            "--gpus_per_node 99999999999999999999: expected a whole number from 1 to 9999999",
        ),  # fmt: skip
        (["--gpus_per_node", "0"], {}, "--gpus_per_node 0: expected a whole number from 1 to 9999999"),
        ([], {"VLLM_PORT": "70000"}, "--vllm_port 70000: expected a whole number from 1 to 65535"),
        (["--main_port", "80a"], {}, "--main_port 80a: expected a whole number from 1 to 65535"),
        (["--max_requeues", "-1"], {}, "--max_requeues -1: expected a whole number from 0 to 9999999"),
        (
            ["--vllm_tensor_parallel", "16"],
            {},
            "--vllm_tensor_parallel 16: the serving node has 8 GPUs (--gpus_per_node)",
        ),
        ([], {"NO_VLLM": "yes"}, "NO_VLLM=yes: expected 1 (no vLLM server) or 0"),
        (["--vllm_port"], {}, "--vllm_port needs a value"),
        (["--nodes", "3"], {}, "unknown option --nodes (--help lists them; the recipe's settings go after --)"),
        (["--log_dir", ""], {}, "--log_dir is empty: name a folder for the logs (logs, by default)"),
        (
            ["--model", "A/x", "--", "--model_name_or_path", "B/y"],
            {},
            "--model A/x is served and --model_name_or_path B/y (after --) trained: name the model once (--model)",
        ),
    ],
    ids=[
        "overflow",
        "zero-gpus",
        "port-env",
        "port-text",
        "negative",
        "tensor-parallel",
        "no-vllm",
        "no-value",
        "sbatch-option",
        "log-dir-empty",
        "two-models",
    ],  # fmt: skip
)
def test_a_bad_setting_is_refused_with_a_message_before_anything_runs(tmp_path, stubs, args, env, said):
    env = batch_env(tmp_path, stubs, 3, **env)
    result = subprocess.run(
        ["bash", str(BATCH), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 1
    assert result.stderr == f"slurm/grpo.sbatch: {said}\n"
    assert [call["name"] for call in calls(env)] == []  # nothing started, not even the node list asked for


@pytest.mark.parametrize("restart", ["0", "2"])
def test_the_recipes_model_is_served_and_a_requeued_run_resumes_from_the_newest_checkpoint(tmp_path, stubs, restart):
    env = batch_env(tmp_path, stubs, 2, SLURM_RESTART_COUNT=restart)
    given = ["--model_name_or_path=B/y", "--resume_from_checkpoint", "outputs/run/checkpoint-5", *RECIPE]
    result = subprocess.run(
        ["bash", str(BATCH), "--", *given], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    launches = per_node(calls(env))
    assert launches["gpu01"][0][:3] == ["vllm", "serve", "B/y"]  # the model the recipe trains is the one served
    [launch] = launches["gpu02"]
    recipe = launch[launch.index("grpo_demo.py") + 1 :]
    assert recipe[recipe.index("--model_name_or_path") + 1] == "B/y"
    # the first run resumes where the user said; a requeued one from the newest checkpoint (latest), said so
    told = [a for i, a in enumerate(recipe[1:], 1) if recipe[i - 1] == "--resume_from_checkpoint"]
    assert told == (["latest", "outputs/run/checkpoint-5"] if restart == "0" else ["latest"])
    assert ("--resume_from_checkpoint after -- is left out" in result.stdout) == (restart != "0")


def test_max_requeues_0_never_requeues(tmp_path, stubs):
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop")
    batch = start_batch(env, "--max_requeues", "0")
    training_started(env, batch)
    batch.send_signal(signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert "saved at step 3: not requeued: job 77 was requeued 0 times (--max_requeues 0)" in stderr
    assert not requeued(env)


def test_the_requeues_stop_at_max_requeues(tmp_path, stubs):
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop", MAX_REQUEUES="4")
    env["SLURM_RESTART_COUNT"] = "4"
    batch = start_batch(env)
    training_started(env, batch)
    batch.send_signal(signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert "not requeued: job 77 was requeued 4 times (--max_requeues 4); resubmit this script to go on" in stderr
    assert not requeued(env)


def test_the_time_limit_warning_as_the_script_asks_for_it_reaches_the_training_and_never_the_server(tmp_path, stubs):
    """Delivered as Slurm delivers the script's own `#SBATCH --signal`: with `B:` to the batch shell alone, without it
    to every process of the job's steps, where the vLLM server dies of SIGUSR1 (Python's default)."""
    directive = next(line for line in BATCH.read_text().splitlines() if line.startswith("#SBATCH --signal="))
    env = batch_env(tmp_path, stubs, 3, STUB_TRAIN="stop")
    batch = start_batch(env)
    training = training_started(env, batch)
    if directive.split("=", 1)[1].startswith("B:"):
        batch.send_signal(signal.SIGUSR1)
    else:
        server = next(Path(p) for p in Path("/proc").iterdir() if p.name.isdigit() and _runs(p, "vllm"))
        for pid in [*training, int(server.name)]:
            os.kill(pid, signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert requeued(env), stderr
    assert not any(call["name"] == "vllm" and call.get("signalled") for call in calls(env))  # served to the end


def _runs(proc: Path, name: str) -> bool:
    try:
        return Path((proc / "cmdline").read_bytes().split(b"\0")[0].decode()).name == name or (
            proc / "cmdline"
        ).read_bytes().split(b"\0")[1].decode().endswith(f"/{name}")
    except (OSError, IndexError):
        return False


def test_a_stop_while_the_server_starts_does_not_start_the_training_and_requeues(tmp_path, stubs):
    env = batch_env(tmp_path, stubs, 3, STUB_HEALTHY_AFTER="never", VLLM_WAIT="100000")
    batch = start_batch(env)
    while "curl" not in [call["name"] for call in calls(env)]:
        assert batch.poll() is None, batch.communicate()
        time.sleep(0.01)
    batch.send_signal(signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert batch.returncode == 1, stderr
    assert "SIGUSR1 before the training started: it did not start" in stdout
    assert "training stopped (SIGUSR1) without a newer checkpoint (1 run(s) in a row): requeueing job 77" in stdout
    assert "accelerate" not in [call["name"] for call in calls(env)]
    assert requeued(env)


def test_a_signal_ends_the_nap_between_two_health_checks(tmp_path, stubs):
    """The script naps 10 s between two health checks of the server: a stop signal ends the nap (its `sleep` killed)
    rather than waiting it out, which would come off the time limit's 300 s, or a scancel's 30 s (KillWait)."""
    (stubs / "sleep").write_text(STUB.format(python=sys.executable))
    env = batch_env(tmp_path, stubs, 3, STUB_HEALTHY_AFTER="never", VLLM_WAIT="100000")
    batch = start_batch(env)
    while not any(call["name"] == "sleep" for call in calls(env)):
        assert batch.poll() is None, batch.communicate()
        time.sleep(0.01)
    batch.send_signal(signal.SIGUSR1)
    stdout, stderr = batch.communicate(timeout=60)
    assert "SIGUSR1 before the training started: it did not start" in stdout, stderr
    naps = [call for call in calls(env) if call["name"] == "sleep" and call["args"] == ["10"]]
    assert [call.get("signalled") for call in naps] == [None, ["SIGTERM"]], naps  # one nap, ended by the signal


WAIT_UNDER_SIGNALS = r"""
eval "$(sed -n '/^wait_for() {/,/^}/p' "$1")"
traps=0
trap 'traps=$((traps + 1))' USR1
/bin/sleep 100000 >/dev/null &  # a child that lives on, as the server's srun does: `wait` on a lost status blocks
other=$!
for ((i = 0; i < 1000; i++)); do
  (kill -USR1 $$ && exit 3) &  # each child signals the script as it ends: the signal lands as the child is reaped
  status=0
  wait_for $! || status=$?
  echo "$status"
done
kill "$other"
echo "traps $traps"
"""


def test_wait_for_never_waits_for_a_child_gone_under_a_stream_of_signals():
    """bash (5.2) checks for a trap between reaping a child and recording it: a signal that lands as the child ends
    loses its status, bash lists the child as running, and a second `wait` blocks while any other child lives (the
    script hung so on the nap between two health checks, until the job's time limit). Each of 1000 children sends the
    signal itself as it ends, however loaded the machine: each status is the child's (3), or 255 where bash lost it,
    never 138 (128 + SIGUSR1: the signal read as the child's status), and every signal was trapped while it waited."""
    shell = subprocess.Popen(
        ["bash", "-c", WAIT_UNDER_SIGNALS, "wait", str(BATCH)], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, _ = shell.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        raise AssertionError("wait_for waited for a child that had ended") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)  # the child that lives on, where the script did not end it
        shell.wait()
    *statuses, traps = stdout.splitlines() or ["(nothing)"]
    assert (shell.returncode, traps) == (0, "traps 1000")  # one signal from each child, each trapped
    assert len(statuses) == 1000 and set(statuses) <= {"3", "255"}, sorted(set(statuses))
    print(f"{statuses.count('255')} statuses lost of 1000")


def test_the_training_exit_status_survives_a_signal_that_lands_as_the_training_ends(tmp_path, stubs):
    """SIGUSR1 interrupts the script's `wait`, and the launchers (told by it) exit at once: the script reports
    their status (1), never the interrupted wait's 138, however the two interleave (five tries)."""
    for attempt in range(5):
        (tmp_path / str(attempt)).mkdir()
        env = batch_env(tmp_path / str(attempt), stubs, 3, STUB_TRAIN="stop")
        batch = start_batch(env)
        training_started(env, batch)
        batch.send_signal(signal.SIGUSR1)
        stdout, stderr = batch.communicate(timeout=60)
        assert batch.returncode == 1, (attempt, stdout, stderr)


@pytest.mark.slow  # the recipe resolves its settings in a subprocess
def test_vllm_serves_the_model_a_config_file_names_and_a_requeue_with_checkpoints_resolves(tmp_path, stubs):
    """The length cap and the model are read from the settings the training gets: a --config file's model is the
    one served, and a requeued run's folder, which holds checkpoints, is resumed (not refused as another run's)."""
    from safetensors.torch import save_file

    checkpoint = tmp_path / "out" / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    save_file({"w": torch.zeros(2)}, checkpoint / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({}, checkpoint / name)
    config = tmp_path / "llama.yaml"
    config.write_text("model_name_or_path: meta-llama/Llama-3.2-1B-Instruct\nmax_completion_length: 300\n")
    env = batch_env(tmp_path, stubs, 2, SLURM_RESTART_COUNT="1")
    del env["VLLM_MAX_MODEL_LEN"]  # read from the recipe's settings
    args = ["--", "--config", str(config), "--output_dir", str(tmp_path / "out"), *RECIPE]
    result = subprocess.run(
        ["bash", str(BATCH), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    serve = per_node(calls(env))["gpu01"][0]
    assert serve[:3] == ["vllm", "serve", "meta-llama/Llama-3.2-1B-Instruct"]
    assert serve[serve.index("--max-model-len") + 1] == str(256 + 300)
