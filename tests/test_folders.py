"""One run per output folder, and presets that clear only what they wrote."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import transformers.trainer_utils
from conftest import ROOT, offline_env, refused

from grpo_kit import RecipeError, layout, patches, presets, runs


def write_lock(folder, pid: int, host: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lock = {"pid": pid, "host": host or socket.gethostname(), "since": "2026-11-30T12:00:00+00:00"}
    (folder / layout.LOCK).write_text(json.dumps(lock))


def test_a_folder_held_by_a_live_run_is_refused(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(tmp_path / "run", other.pid)
        with pytest.raises(RecipeError) as stop:
            runs.claim(tmp_path / "run")
        assert f"is in use by another run (pid {other.pid}, since 2026-11-30T12:00:00+00:00)" in str(stop.value)
        assert "wait for it to end, or choose another --output_dir" in str(stop.value)
    finally:
        other.kill()
        other.wait()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_lock(tmp_path / "run", gone.pid)
    with caplog.at_level("WARNING", logger="grpo_demo"):
        path = runs.claim(tmp_path / "run")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"its run (pid {gone.pid}) is gone" in caplog.text
    assert runs.claim(tmp_path / "run") == path  # the holder may claim again


def test_a_lock_from_another_machine_names_its_file(tmp_path):
    write_lock(tmp_path / "run", 1, host="another-node")
    with pytest.raises(RecipeError, match=r"pid 1 on another-node, .*\(if that run is over, delete .*\.run\.lock\)"):
        runs.claim(tmp_path / "run")


def test_our_pid_on_another_machine_is_another_run(tmp_path):
    """Pids are per machine: a lock with this process's pid, written on another host, is that host's run."""
    write_lock(tmp_path / "run", os.getpid(), host="another-node")
    with pytest.raises(RecipeError, match=rf"in use by another run \(pid {os.getpid()} on another-node, "):
        runs.claim(tmp_path / "run")
    assert json.loads((tmp_path / "run" / layout.LOCK).read_text())["host"] == "another-node"  # left alone


def test_a_run_that_exits_frees_its_folder(tmp_path, caplog):
    claim = f"from grpo_kit import runs; runs.claim({str(tmp_path / 'run')!r}); print('held')"
    done = subprocess.run([sys.executable, "-c", claim], cwd=ROOT, env=offline_env(tmp_path), capture_output=True)
    assert done.returncode == 0 and done.stdout.strip() == b"held", done.stderr[-2000:]
    assert not (tmp_path / "run" / layout.LOCK).exists()  # removed at exit
    with caplog.at_level("WARNING", logger="grpo_demo"):
        runs.claim(tmp_path / "run")  # free: claimed at once, nothing taken over
    assert "Taking over" not in caplog.text


def test_a_lock_left_by_a_requeued_slurm_jobs_earlier_run_is_taken_over(tmp_path, monkeypatch, caplog):
    """A preempted job requeued by Slurm may start on other machines; a run killed there left its lock."""
    write_lock(tmp_path / "run", 1, host="node07")
    lock = json.loads((tmp_path / "run" / layout.LOCK).read_text())
    (tmp_path / "run" / layout.LOCK).write_text(json.dumps({**lock, "slurm_job": "4242", "slurm_restart": 0}))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(RecipeError, match="pid 1 on node07"):  # the same run of the job: another run beside it
        runs.claim(tmp_path / "run")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with caplog.at_level("WARNING", logger="grpo_demo"):
        path = runs.claim(tmp_path / "run")
    assert "Slurm job 4242 held it before it was requeued" in caplog.text
    assert json.loads(path.read_text())["slurm_restart"] == 1
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job's lock is not this one's to take
    (tmp_path / "run" / layout.LOCK).write_text(json.dumps({**lock, "slurm_job": "4242", "slurm_restart": 0}))
    with pytest.raises(RecipeError, match="pid 1 on node07"):
        runs.claim(tmp_path / "run")


def test_a_preset_clears_only_a_folder_its_runs_wrote(tmp_path):
    folder = tmp_path / "smoke-GRPO"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(RecipeError, match="holds files a --smoke run did not write: notes.txt: move them"):
        runs.clear_preset_folder(folder, "smoke")
    assert (folder / "notes.txt").read_text() == "mine"

    (folder / "checkpoint-2").mkdir()
    (folder / "run_record.json").write_text(json.dumps({"settings": {"run": {"smoke": True}}}))
    with pytest.raises(RecipeError, match="notes.txt"):  # a smoke run's folder, with the user's notes added
        runs.clear_preset_folder(folder, "smoke")
    (folder / "notes.txt").unlink()
    write_lock(folder, os.getpid())
    runs.clear_preset_folder(folder, "smoke")
    assert [p.name for p in folder.iterdir()] == [layout.LOCK]  # its own lock stays


def a_smoke_runs_folder(folder):
    """A folder as a --smoke run leaves it, file by file (wandb's offline run too)."""
    wandb_run = "wandb/offline-run-20261201_234724-d4dykqdh"
    written = [
        "run_record.json", "trainer_state.json", "model.safetensors", "config.json", "README.md", "curves.png",
        "checkpoint-2/model.safetensors", "checkpoint-2/optimizer.pt", "checkpoint-2/rng_state.pth",
        "checkpoint-2/trainer_state.json", "completions/completions_00001.parquet", "eval/baseline/summary.json",
        "eval/final/completions.jsonl", "eval/comparison.json", f"{wandb_run}/run-d4dykqdh.wandb",
        "eval/checkpoint-2/summary.json", "eval/checkpoint-2-gsm8k/lm_eval_results.json",  # --eval_only of a checkpoint
        f"{wandb_run}/files/media/table/completions_12_61ab9d893a727069f872.table.json", f"{wandb_run}/logs/debug.log",
    ]  # fmt: skip
    for name in written:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("run")
    (folder / f"{wandb_run}/tmp/code").mkdir(parents=True)
    (folder / "wandb/latest-run").symlink_to(wandb_run.removeprefix("wandb/"))
    (folder / "run_record.json").write_text(json.dumps({"settings": {"run": {"smoke": True}}}))


def test_a_preset_keeps_a_users_files_at_any_depth_and_names_them(tmp_path):
    folder = tmp_path / "smoke-GRPO"
    a_smoke_runs_folder(folder)
    users = ["checkpoint-best/model.safetensors", "eval/my_notes.txt", "wandb/my_export.csv", "checkpoint-2/notes.md"]
    for name in users:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("mine")
    with pytest.raises(RecipeError) as stop:
        runs.clear_preset_folder(folder, "smoke")
    assert str(stop.value) == (
        f"--smoke starts afresh in {folder}, which holds files a --smoke run did not write: checkpoint-2/notes.md, "
        "checkpoint-best/, eval/my_notes.txt, wandb/my_export.csv: move them, or give the preset another --output_dir"
    )
    assert all((folder / name).read_text() == "mine" for name in users)
    assert (folder / "checkpoint-2/optimizer.pt").is_file()  # nothing cleared

    for name in users:
        (folder / name).unlink()
    (folder / "checkpoint-best").rmdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (folder / "wandb/offline-run-20261201_234724-d4dykqdh/logs/debug-core.log").symlink_to(outside / "keep.txt")
    write_lock(folder, os.getpid())
    runs.clear_preset_folder(folder, "smoke")
    assert [p.name for p in folder.iterdir()] == [layout.LOCK]  # every file the run wrote, its folders too
    assert (outside / "keep.txt").read_text() == "mine"  # a link is removed, never what it points to


@pytest.mark.parametrize("setting", ["model_name_or_path", "dataset"])
def test_a_preset_never_clears_what_its_run_reads(tmp_path, setting):
    """`--smoke --model_name_or_path outputs/smoke-GRPO/checkpoint-4`: a new run starting from the last one's end."""
    folder = tmp_path / "smoke-GRPO"
    a_smoke_runs_folder(folder)
    start = folder / "checkpoint-2"
    with pytest.raises(RecipeError) as stop:
        runs.clear_preset_folder(folder, "smoke", {"model_name_or_path": None, setting: str(start)})
    assert str(stop.value) == (
        f"--smoke starts afresh in {folder}, clearing what its runs wrote there, and this run reads --{setting} "
        f"{start} inside it: copy that out of {folder} first, or give the preset another --output_dir"
    )
    assert (start / "model.safetensors").read_text() == "run" and (folder / "run_record.json").is_file()
    runs.clear_preset_folder(folder, "smoke", {setting: str(tmp_path / "smoke-GRPO-start")})  # elsewhere: cleared
    assert not folder.exists() or not any(folder.iterdir())
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # a path that exists as no file: nothing read, no traceback
    runs.clear_preset_folder(folder, "smoke", {setting: str(tmp_path / "loop")})


def prepare_smoke(model: str, resume: str | None = None) -> None:
    """`presets.prepare` as `python grpo_demo.py --smoke` calls it, in the working folder."""
    run = SimpleNamespace(smoke=True, demo=False, eval_only=False, ask=None, dataset=presets.smoke.DATA_DIR)
    vars(run).update(tiny_model="qwen2", reasoning_tag="reasoning", answer_tag="answer")  # the smoke's own terms
    training_args = SimpleNamespace(
        output_dir="outputs/smoke-GRPO", resume_from_checkpoint=resume, process_index=0, seed=42,
        main_process_first=lambda **kwargs: contextlib.nullcontext(),
    )  # fmt: skip
    presets.prepare(run, training_args, SimpleNamespace(model_name_or_path=model), None)


def test_smoke_from_a_checkpoint_of_its_own_folder_is_refused_and_the_checkpoint_kept(tmp_path, monkeypatch):
    """`python grpo_demo.py --smoke --model_name_or_path outputs/smoke-GRPO/checkpoint-2`."""
    monkeypatch.chdir(tmp_path)
    a_smoke_runs_folder(tmp_path / "outputs/smoke-GRPO")
    start = "outputs/smoke-GRPO/checkpoint-2"
    with pytest.raises(RecipeError, match=f"this run reads --model_name_or_path {start} inside it: copy that out"):
        prepare_smoke(start)
    assert (tmp_path / start / "model.safetensors").read_text() == "run"


def test_smoke_resuming_a_checkpoint_of_its_own_folder_clears_nothing(tmp_path, monkeypatch):
    """`python grpo_demo.py --smoke --resume_from_checkpoint outputs/smoke-GRPO/checkpoint-2`: it goes on there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(presets.smoke, "prepare", lambda *args: None)  # its tiny model and data: not needed here
    a_smoke_runs_folder(tmp_path / "outputs/smoke-GRPO")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    prepare_smoke(presets.smoke.MODEL_DIRS["qwen2"], resume="outputs/smoke-GRPO/checkpoint-2")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_reused_pid_is_not_the_run_that_held_the_lock(tmp_path, caplog):
    write_lock(tmp_path / "run", 1)  # pid 1 is alive, but it is not the process that wrote the lock
    lock = json.loads((tmp_path / "run" / layout.LOCK).read_text())
    (tmp_path / "run" / layout.LOCK).write_text(json.dumps({**lock, "started": "0"}))
    with caplog.at_level("WARNING", logger="grpo_demo"):
        runs.claim(tmp_path / "run")
    assert "its run (pid 1) is gone" in caplog.text


def test_a_full_disk_is_told_from_other_errors():
    import errno

    assert runs.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    wrapped = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")  # safetensors
    assert runs.disk_full(wrapped)
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as quota:
            raise ValueError("saving failed") from quota
    except ValueError as err:
        assert runs.disk_full(err)
    assert not runs.disk_full(OSError(errno.EACCES, "Permission denied"))
    # torch.save's zip writer on a full disk (the optimizer state of a checkpoint)
    assert runs.disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1216 vs 1114"))
    assert not runs.disk_full(RuntimeError("[enforce fail at inline_container.cc:300] . file not found: archive/x"))


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        # the value after a secret's name, or after its "=", wherever it is
        (["grpo_demo.py", "--hub_token", "hf_abc", "--max_steps", "3"], ["grpo_demo.py", "--hub_token", "<redacted>",
                                                                          "--max_steps", "3"]),
        (["x.py", "--hub-token=abc"], ["x.py", "--hub-token=<redacted>"]),
        (["x.py", "--wandb_api_key", "k"], ["x.py", "--wandb_api_key", "<redacted>"]),
        # a Hub token's shape anywhere else
        (["x.py", "--model_name_or_path", "hf_" + "a" * 30], ["x.py", "--model_name_or_path", "<redacted>"]),
        # settings that only sound like one stay
        (["x.py", "--max_prompt_tokens", "256", "--max_completion_length", "9"],
         ["x.py", "--max_prompt_tokens", "256", "--max_completion_length", "9"]),
    ],
)  # fmt: skip
def test_no_token_reaches_a_file_or_a_printed_command(argv, shown, monkeypatch, tmp_path):
    assert runs.public(argv) == shown
    monkeypatch.setattr(sys, "argv", argv)
    runs.claim(tmp_path / "run")
    assert json.loads((tmp_path / "run" / layout.LOCK).read_text())["command"] == shown
    assert "hf_a" not in runs.resume_command() and "hf_abc" not in runs.resume_command()


class Line(torch.nn.Module):
    """The smallest model a Trainer trains: y = w x + b, its loss returned."""

    def __init__(self):
        super().__init__()
        self.line = torch.nn.Linear(1, 1)

    def forward(self, x, labels=None):
        return {"loss": ((self.line(x) - labels) ** 2).mean()}


def test_checkpoint_rotation_removes_only_the_runs_checkpoints(tmp_path):
    """A real trainer's rotation (save_total_limit 2): a user's `checkpoint-2-keep` and `checkpoint-best` stay; of
    the run's checkpoints, the newest two."""
    from transformers import Trainer, TrainingArguments

    out = tmp_path / "run"
    users = [out / "checkpoint-2-keep", out / "checkpoint-best"]
    for folder in users:
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_text("mine")
    args = TrainingArguments(
        output_dir=str(out), max_steps=4, save_steps=1, save_total_limit=2, per_device_train_batch_size=2,
        report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip
    rows = [{"x": torch.tensor([1.0]), "labels": torch.tensor([2.0])}] * 8
    trainer = Trainer(model=Line(), args=args, train_dataset=rows)
    patches.rotate_after_save(trainer, runs.rotate_checkpoints)
    trainer.train()
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint-2-keep", "checkpoint-3", "checkpoint-4", "checkpoint-best",
    ]  # fmt: skip
    assert all((folder / "model.safetensors").read_text() == "mine" for folder in users)


def test_every_process_of_a_run_rotates_so(tmp_path):
    """`runs.start`, which every process of a run calls, puts the rotation in place (on a process that writes no
    run record too)."""
    out = tmp_path / "run"
    (out / "checkpoint-1-keep").mkdir(parents=True)
    state = SimpleNamespace(global_step=0, best_model_checkpoint=None)
    args = SimpleNamespace(output_dir=str(out), save_total_limit=1, should_save=True, resume_from_checkpoint=None)

    def save(model, trial):  # the trainer's save, its rotation included
        (out / f"checkpoint-{state.global_step}").mkdir()
        if args.save_total_limit:
            transformers.trainer_utils.rotate_checkpoints(str(out), args.save_total_limit, use_mtime=True)

    trainer = SimpleNamespace(args=args, state=state, accelerator=SimpleNamespace(is_main_process=False))
    trainer._save_checkpoint, trainer._get_output_dir = save, lambda trial: str(out)
    trainer._get_train_sampler, trainer.add_callback = lambda dataset=None: None, lambda callback: None
    assert runs.start(trainer, {}, None) is None
    for state.global_step in (1, 2):
        trainer._save_checkpoint(None, None)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1-keep", "checkpoint-2"]


@pytest.mark.parametrize(
    ("steps", "limit", "keep", "left"),
    [
        ((2, 9, 10), 2, (), {9, 10}),  # by step: checkpoint-10 sorts before checkpoint-9 by name, and is newer
        ((9, 10, 11), 2, (11,), {10, 11}),  # the one just saved kept, and the newest other one
        ((100, 8, 99), 1, (), {100}),  # whatever order the folders were made in
        ((1, 9, 10, 11, 12), 3, (12, 1), {1, 11, 12}),  # the best (checkpoint-1) kept beside the newest two
    ],
)
def test_checkpoint_rotation_keeps_the_newest_steps(tmp_path, steps, limit, keep, left):
    for step in steps:
        (tmp_path / f"checkpoint-{step}").mkdir()
    runs.rotate_checkpoints(tmp_path, limit, tuple(str(tmp_path / f"checkpoint-{step}") for step in keep))
    assert {p.name for p in tmp_path.iterdir()} == {f"checkpoint-{step}" for step in left}


def test_rotation_during_training_keeps_the_checkpoints_of_the_newest_steps(tmp_path):
    """Saving steps 8 to 11 with save_total_limit 2 (the trainer's save, then the rotation `runs.start` puts in
    place): past step 9 the names no longer sort as the steps do."""
    state = SimpleNamespace(global_step=0, best_model_checkpoint=None)
    args = SimpleNamespace(output_dir=str(tmp_path), save_total_limit=2, should_save=True, resume_from_checkpoint=None)
    trainer = SimpleNamespace(args=args, state=state, accelerator=SimpleNamespace(is_main_process=False))
    trainer._save_checkpoint = lambda model, trial: (tmp_path / f"checkpoint-{state.global_step}").mkdir()
    trainer._get_output_dir = lambda trial: str(tmp_path)
    trainer._get_train_sampler, trainer.add_callback = lambda dataset=None: None, lambda callback: None
    assert runs.start(trainer, {}, None) is None
    for state.global_step in (8, 9, 10, 11):
        trainer._save_checkpoint(None, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-11"]


def test_resuming_where_every_checkpoint_holds_the_model_alone_is_refused(tmp_path, single_process):
    """A retry of a run stopped under --save_only_model (the Slurm script requeues one): no checkpoint resumes, and
    starting afresh would rotate the saved models out; it stops, naming the one to start a new run from."""
    from safetensors.torch import save_file

    out = tmp_path / "outputs/model-only"
    for step in (2, 3):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}/trainer_state.json").write_text(json.dumps({"global_step": step}))
        save_file({"w": torch.zeros(4)}, out / f"checkpoint-{step}/model.safetensors")
    newest = "outputs/model-only/checkpoint-3"
    assert refused(["--output_dir", "outputs/model-only", "--resume_from_checkpoint", "latest"]) == (
        f"--resume_from_checkpoint latest: {newest} holds the model alone (--save_only_model true saved no optimizer "
        "state): no run resumes from it, and a new run here would write over it. Start a new run from its weights: "
        f"--model_name_or_path {newest} --output_dir <another folder>"
    )


@pytest.mark.parametrize("text", ["[]", "null", '"x"', "[1]"])
def test_a_run_file_holding_json_that_is_no_object_reads_as_damaged(tmp_path, text):
    """A lock or run record cut or overwritten to `[]`, `null`, a string: read as absent, never `.get` on a list."""
    (tmp_path / layout.RECORD).write_text(text)
    assert layout.read_record(tmp_path) is None
    assert layout.read_json(tmp_path / layout.RECORD, {}) == {}


def test_a_checkpoint_is_named_as_the_trainer_names_it_and_a_copy_is_not():
    assert [name for name in ("checkpoint-0", "checkpoint-12", "checkpoint-02", "checkpoint-2-keep", "checkpoint-")
            if layout.CHECKPOINT.fullmatch(name)] == ["checkpoint-0", "checkpoint-12"]  # fmt: skip
    assert not layout.RUN_FILES.fullmatch("checkpoint-02/model.safetensors")  # a user's copy: never cleared


def test_a_run_that_wrote_nothing_leaves_no_empty_folder(tmp_path):
    """A run that fails before writing (offline, a data set to fetch) leaves no empty outputs/<run>/ behind; a folder
    that holds anything, or was there before, stays."""
    lock = runs.claim(tmp_path / "outputs" / "run")
    runs.release(lock, [tmp_path / "outputs" / "run", tmp_path / "outputs"])  # what exiting does (atexit)
    assert list(tmp_path.iterdir()) == []
    lock = runs.claim(tmp_path / "outputs" / "kept")
    (tmp_path / "outputs" / "kept" / "run_record.json").write_text("{}")
    runs.release(lock, [tmp_path / "outputs" / "kept", tmp_path / "outputs"])
    assert [p.name for p in (tmp_path / "outputs" / "kept").iterdir()] == ["run_record.json"]


def test_a_run_continued_from_another_folders_checkpoint_names_it_in_its_record(tmp_path):
    rows = {"prompt": [[{"role": "user", "content": "1 + 1?"}]], "answer": ["2"]}
    record = runs.write_run_record(tmp_path / "new", {}, rows, 0, resumed_from=tmp_path / "old" / "checkpoint-2")
    assert record["continues"] == str(tmp_path / "old" / "checkpoint-2")
    assert "continues" not in runs.write_run_record(tmp_path / "fresh", {}, rows, 0)


@pytest.mark.parametrize(
    ("argv", "printed"),
    [
        (["grpo_demo.py", "--max_steps", "9"], "python grpo_demo.py --max_steps 9 --resume_from_checkpoint latest"),
        # an evaluation or a question has no checkpoint: the command that starts it again, as it was
        (["grpo_demo.py", "--eval_only", "--model_name_or_path", "m"], "python grpo_demo.py --eval_only "
                                                                       "--model_name_or_path m"),
        (["grpo_demo.py", "--ask=hi", "--smoke"], "python grpo_demo.py --ask=hi --smoke"),
        (["grpo_demo.py", "--eval-only", "--smoke"], "python grpo_demo.py --eval-only --smoke"),
        (["grpo_demo.py", "--eval_only", "false"],
         "python grpo_demo.py --eval_only false --resume_from_checkpoint latest"),
    ],
)  # fmt: skip
def test_the_printed_command_that_goes_on_is_one_the_recipe_takes(argv, printed):
    assert runs.resume_command(argv) == printed
