"""One run per output folder, and presets that clear only what they wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from grpo_kit import folders


def write_lock(folder, pid: int, host: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lock = {"pid": pid, "host": host or socket.gethostname(), "since": "2026-11-30T12:00:00+00:00"}
    (folder / folders.LOCK_NAME).write_text(json.dumps(lock))


def test_a_folder_held_by_a_live_run_is_refused(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(tmp_path / "run", other.pid)
        with pytest.raises(SystemExit) as stop:
            folders.claim(tmp_path / "run")
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
        path = folders.claim(tmp_path / "run")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"its run (pid {gone.pid}) is gone" in caplog.text
    assert folders.claim(tmp_path / "run") == path  # the holder may claim again


def test_a_lock_from_another_machine_names_its_file(tmp_path):
    write_lock(tmp_path / "run", 1, host="another-node")
    with pytest.raises(SystemExit, match=r"pid 1 on another-node, .*\(if that run is over, delete .*\.run\.lock\)"):
        folders.claim(tmp_path / "run")


def test_a_lock_left_by_a_requeued_slurm_jobs_earlier_run_is_taken_over(tmp_path, monkeypatch, caplog):
    """A preempted job requeued by Slurm may start on other machines; a run killed there left its lock."""
    write_lock(tmp_path / "run", 1, host="node07")
    lock = json.loads((tmp_path / "run" / folders.LOCK_NAME).read_text())
    (tmp_path / "run" / folders.LOCK_NAME).write_text(json.dumps({**lock, "slurm_job": "4242", "slurm_restart": 0}))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(SystemExit, match="pid 1 on node07"):  # the same run of the job: another run beside it
        folders.claim(tmp_path / "run")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with caplog.at_level("WARNING", logger="grpo_demo"):
        path = folders.claim(tmp_path / "run")
    assert "Slurm job 4242 held it before it was requeued" in caplog.text
    assert json.loads(path.read_text())["slurm_restart"] == 1
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job's lock is not this one's to take
    (tmp_path / "run" / folders.LOCK_NAME).write_text(json.dumps({**lock, "slurm_job": "4242", "slurm_restart": 0}))
    with pytest.raises(SystemExit, match="pid 1 on node07"):
        folders.claim(tmp_path / "run")


def test_a_preset_clears_only_a_folder_its_runs_wrote(tmp_path):
    folder = tmp_path / "smoke-GRPO"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="holds files a --smoke run did not write: notes.txt: move them"):
        folders.clear_preset_folder(folder, "smoke")
    assert (folder / "notes.txt").read_text() == "mine"

    (folder / "checkpoint-2").mkdir()
    (folder / "run_record.json").write_text(json.dumps({"settings": {"run": {"smoke": True}}}))
    with pytest.raises(SystemExit, match="notes.txt"):  # a smoke run's folder, with the user's notes added
        folders.clear_preset_folder(folder, "smoke")
    (folder / "notes.txt").unlink()
    write_lock(folder, os.getpid())
    folders.clear_preset_folder(folder, "smoke")
    assert [p.name for p in folder.iterdir()] == [folders.LOCK_NAME]  # its own lock stays


def test_a_reused_pid_is_not_the_run_that_held_the_lock(tmp_path, caplog):
    write_lock(tmp_path / "run", 1)  # pid 1 is alive, but it is not the process that wrote the lock
    lock = json.loads((tmp_path / "run" / folders.LOCK_NAME).read_text())
    (tmp_path / "run" / folders.LOCK_NAME).write_text(json.dumps({**lock, "started": "0"}))
    with caplog.at_level("WARNING", logger="grpo_demo"):
        folders.claim(tmp_path / "run")
    assert "its run (pid 1) is gone" in caplog.text


def test_a_full_disk_is_told_from_other_errors():
    import errno

    assert folders.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    wrapped = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")  # safetensors
    assert folders.disk_full(wrapped)
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as quota:
            raise ValueError("saving failed") from quota
    except ValueError as err:
        assert folders.disk_full(err)
    assert not folders.disk_full(OSError(errno.EACCES, "Permission denied"))
