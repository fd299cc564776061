"""slurm/grpo.sbatch, unchanged, submitted with sbatch to a real Slurm: three virtual nodes on this machine
(slurm/ci/cluster.sh; .ci/run starts them as root after `apt-get install slurm-wlm munge`). Every node trains the
smoke model with transformers generation (--no_vllm) on gloo, and each test sends what Slurm sends: the time
limit's warning, scancel, a preemption's SIGTERM to the steps, USR1 to the batch shell. The server path runs against
a stand-in `vllm` on the serving node (there is no vLLM here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_same_final_weights, offline_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-cluster")]

STEPS = 50  # long enough that a stop sent once a step is logged lands while the run trains
RECIPE = ["--smoke", "--max_steps", str(STEPS), "--save_steps", "1000", "--eval_every_steps", "0"]
NO_VLLM = ["--no_vllm", "--gpus_per_node", "1", "--accelerate_config", "configs/cpu_ddp.yaml"]
HANG = 900  # seconds: a job that takes longer than this is stuck (a guard, not a measure)


@pytest.fixture(scope="session")  # once per worker: other modules' tests may run between the tier's, under xdist
def cluster():
    """The running cluster ($SLURM_CONF), its three nodes up (idle, or still ending another test's job: a job waits
    for them); skipped, saying why, where there is none."""
    if not shutil.which("sbatch"):
        pytest.skip("no Slurm here: as root, apt-get install slurm-wlm munge, then slurm/ci/cluster.sh start")
    nodes = subprocess.run(["sinfo", "--noheader", "--format=%D %t"], capture_output=True, text=True)
    states = dict(reversed(line.split()) for line in nodes.stdout.splitlines() if len(line.split()) == 2)
    up = sum(int(count) for state, count in states.items() if state in ("idle", "alloc", "mix", "comp"))
    if nodes.returncode != 0 or up != 3:
        said = (nodes.stderr.strip().splitlines() or [nodes.stdout.strip().replace("\n", ", ")])[-1]
        pytest.skip(f"no 3-node Slurm cluster up (as root: slurm/ci/cluster.sh start, export SLURM_CONF): {said}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """A job of slurm/grpo.sbatch submitted from the repository's root, its files under `folder`."""

    def __init__(self, folder: Path, sbatch: list[str], script: list[str], recipe: list[str], **env: str):
        self.folder, self.out = folder, folder / "run"
        folder.mkdir(parents=True, exist_ok=True)
        environment = offline_env(folder, **env)
        environment["PATH"] = f"{Path(sys.executable).parent}:{environment['PATH']}"
        command = [
            "sbatch", "--parsable", "--gpus-per-node=0", f"--output={folder}/job.out", *sbatch, "slurm/grpo.sbatch",
            "--log_dir", str(folder / "logs"), "--main_port", str(free_port()), *script,
            "--", *recipe, "--output_dir", str(self.out),
        ]  # fmt: skip
        submitted = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, check=True)
        self.id = submitted.stdout.strip().split(";")[0]

    def info(self) -> dict[str, str]:
        shown = subprocess.run(["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def log(self) -> str:
        path = self.folder / "job.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def train_log(self, run: int, node: str = "n1") -> str:
        path = self.folder / "logs" / self.id / f"run-{run}" / f"train-{node}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def queued(self) -> bool:
        """Whether the job is still in the queue (pending, running or completing)."""
        listed = subprocess.run(["squeue", "--noheader", "-j", self.id], capture_output=True, text=True)
        return bool(listed.stdout.strip())

    def until(self, what: str, ready) -> None:
        """Wait until `ready()`; fail at once if the job has left the queue without it."""
        deadline = time.monotonic() + HANG
        while not ready():
            ended = not self.queued() and not ready()
            assert not ended and time.monotonic() < deadline, (
                f"job {self.id}: no {what}{' before it ended' if ended else ''}: {self.info()}\n{self.log()[-3000:]}"
            )
            time.sleep(0.5)

    def step(self, run: int, step: int) -> None:
        """Wait until run `run` has logged step `step` (the main process's step line, on n1)."""
        self.until(f"step {step} in run {run}", lambda: f"step {step}/{STEPS} " in self.train_log(run))

    def running(self, run: int) -> None:
        """Wait until run `run` of the job runs and its script has started (its first line: its traps are set)."""
        self.until(f"run {run}", lambda: f"job {self.id}, run {run}:" in self.log())

    def done(self) -> dict[str, str]:
        """Wait until the job has left the queue for good; its last state."""
        self.until("end", lambda: not self.queued())
        return self.info()

    def scancel(self, *options: str) -> None:
        subprocess.run(["scancel", *options, self.id], check=True)


@pytest.fixture(scope="session")
def whole(cluster, tmp_path_factory):
    """The run uninterrupted on the three nodes: it finishes, and is not requeued."""
    job = Job(tmp_path_factory.mktemp("whole"), [], NO_VLLM, RECIPE)
    state = job.done()
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "0"), job.log()[-3000:]
    assert "training finished" in job.log()
    assert sorted(p.name for p in (job.folder / "logs" / job.id / "run-0").glob("train-*.log")) == [
        "train-n1.log", "train-n2.log", "train-n3.log",
    ]  # fmt: skip
    return job.out


def stopped_and_resumed(job: Job, whole: Path, why: str) -> int:
    """The job's first run stopped on `why` with a checkpoint of the step in progress on every node (one RNG state
    per process), requeued once; the second run resumed from it and finished with the uninterrupted run's weights.
    The step it stopped at."""
    state = job.done()
    log = job.log()
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    saved = re.search(rf"training stopped \({why}\), saved at step (\d+): requeueing job {job.id} \(requeue 1 of", log)
    assert saved, log[-3000:]
    step = int(saved[1])
    assert 0 < step < STEPS
    checkpoint = job.out / f"checkpoint-{step}"
    assert all((checkpoint / f"rng_state_{rank}.pth").is_file() for rank in range(3))  # every node's part
    resumed = job.train_log(1)
    assert f"Resuming from {checkpoint}" in resumed
    assert f"step {step + 1}/{STEPS} " in resumed and f"step {step}/{STEPS} " not in resumed  # not trained again
    assert "training finished" in log.split(f"job {job.id}, run 1:")[1]
    assert_same_final_weights(job.out, whole)
    return step


def test_the_time_limit_saves_the_step_on_every_node_requeues_once_and_resumes_to_the_same_weights(whole, tmp_path):
    """`--signal=B:USR1@N` before a short time limit: once training runs, the limit is brought within N of now. The
    warning comes at slurmctld's next time-limit check, which can be tens of seconds away: the training step is held
    (SIGSTOP) until the batch shell has it, so that it lands mid-run however fast the steps are, then let go (SIGCONT).
    The requeued run gets a limit it will not reach."""
    job = Job(tmp_path, ["--time=15", "--signal=B:USR1@600"], NO_VLLM, RECIPE)
    job.step(0, 2)
    job.scancel("--signal=STOP")  # the training step's processes, not the batch shell
    subprocess.run(["scontrol", "update", f"JobId={job.id}", "TimeLimit=5"], check=True)  # 5 min: within 600 s
    job.until("time-limit warning", lambda: "SIGUSR1: asking the training to save its step and stop" in job.log())
    subprocess.run(["scontrol", "update", f"JobId={job.id}", "TimeLimit=60"], check=True)  # the next run's
    job.scancel("--signal=CONT")
    step = stopped_and_resumed(job, whole, "SIGUSR1 received")
    assert f"Stopped at step {step}: SIGUSR1 received. Saved: checkpoint-{step}." in job.train_log(0)


def test_scancel_ends_the_job_without_requeueing_it(cluster, tmp_path):
    job = Job(tmp_path, [], NO_VLLM, RECIPE)
    job.step(0, 2)
    job.scancel()
    state = job.done()
    assert (state["JobState"], state["Restarts"]) == ("CANCELLED", "0")
    log = job.log()
    assert "SIGTERM: Slurm is ending the job (scancel, the time limit, or a preemption's grace time is over)" in log
    assert "requeueing" not in log
    assert not (job.folder / "logs" / job.id / "run-1").exists()


def test_a_preemptions_sigterm_to_the_steps_saves_the_step_and_requeues(whole, tmp_path):
    """What a preemption with a grace time sends (PreemptMode=CANCEL, GraceTime > 0): SIGTERM to every process of
    the job's steps, the batch shell only once the grace time is over. No step is lost beyond the checkpoint."""
    job = Job(tmp_path, [], NO_VLLM, RECIPE)
    job.step(0, 3)
    job.scancel("--signal=TERM")  # the steps, not the batch shell
    step = stopped_and_resumed(job, whole, "SIGTERM received")
    assert step >= 3  # the step in progress when it came, saved: nothing trained is lost
    assert "SIGTERM: Slurm is ending the job" not in job.log()


def test_usr1_to_the_batch_shell_mid_run_is_the_time_limit_warning(whole, tmp_path):
    job = Job(tmp_path, [], NO_VLLM, RECIPE)
    job.step(0, 3)
    job.scancel("--signal=USR1", "--batch")
    stopped_and_resumed(job, whole, "SIGUSR1 received")
    assert job.log().count("SIGUSR1: asking the training to save its step and stop") == 1


STAND_IN_VLLM = """#!{python}
# vLLM's server as far as slurm/grpo.sbatch sees it: `vllm serve MODEL ... --port P`, its arguments recorded;
# answers /health when STUB_HEALTHY=1, else never does.
import http.server, json, os, sys, time
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({{"args": sys.argv[1:], "node": os.environ.get("SLURMD_NODENAME")}}) + "\\n")
if os.environ.get("STUB_HEALTHY") != "1":
    time.sleep(3600)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("0.0.0.0", port), Health).serve_forever()
"""


def stand_in_vllm(folder: Path) -> dict[str, str]:
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text(STAND_IN_VLLM.format(python=sys.executable))
    (bin_dir / "vllm").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(folder / "vllm.jsonl")}


def test_the_server_path_serves_from_the_first_node_sized_from_the_recipe_and_waits_for_its_health(cluster, tmp_path):
    """One node serves, two train; vLLM's sizes are derived (1 GPU / tensor parallel 1, the smoke preset's prompt cap
    256 + completion 48); training starts once the server answers, and fails here (no vllm installed): a failure,
    not requeued."""
    port = free_port()
    env = stand_in_vllm(tmp_path)
    job = Job(tmp_path, [], ["--gpus_per_node", "1", "--accelerate_config", "configs/cpu_ddp.yaml", "--vllm_port",
                             str(port)], RECIPE, STUB_HEALTHY="1", **env)  # fmt: skip
    state = job.done()
    log = job.log()
    assert f"vLLM answers at http://n1:{port}/health" in log
    served = [json.loads(line) for line in (tmp_path / "vllm.jsonl").read_text().splitlines()]
    assert [call["node"] for call in served] == ["n1"]
    args = served[0]["args"]
    assert args[:2] == ["serve", "outputs/smoke-assets/tiny-qwen2"]  # the model the recipe trains: --smoke's
    sizes = {name: args[args.index(name) + 1] for name in ("--data-parallel-size", "--tensor-parallel-size",
                                                           "--max-model-len")}  # fmt: skip
    assert sizes == {"--data-parallel-size": "1", "--tensor-parallel-size": "1", "--max-model-len": str(256 + 48)}
    assert sorted(p.name for p in (tmp_path / "logs" / job.id / "run-0").glob("train-*.log")) == [
        "train-n2.log", "train-n3.log",
    ]  # fmt: skip
    assert (state["JobState"], state["Restarts"]) == ("FAILED", "0")
    assert re.search(r"training failed \(exit \d+\): not requeued", log)  # srun: the first task's failure ends the rest


def test_runs_that_stop_before_training_stop_requeueing_after_the_cap(cluster, tmp_path):
    """USR1 while the server has not answered yet, in every run: no checkpoint is ever saved. The first run is
    requeued, the second (--max_stalled_runs 2, the default) is not, saying why."""
    job = Job(tmp_path, [], ["--gpus_per_node", "1", "--accelerate_config", "configs/cpu_ddp.yaml"], RECIPE,
              **stand_in_vllm(tmp_path))  # fmt: skip
    for run in (0, 1):
        job.running(run)
        job.scancel("--signal=USR1", "--batch")
    state = job.done()
    log = job.log()
    assert state["Restarts"] == "1" and state["JobState"] == "FAILED", log[-3000:]
    assert log.count("SIGUSR1 before the training started: it did not start") == 2
    assert "without a newer checkpoint (1 run(s) in a row): requeueing" in log
    assert (
        "without a newer checkpoint (2 run(s) in a row): not requeued: 2 runs in a row stopped before they saved a "
        "newer checkpoint (--max_stalled_runs 2)"
    ) in log
    assert not (tmp_path / "logs" / job.id / "run-2").exists()
