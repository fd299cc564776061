"""One run per output folder: a lock file names the process that holds it; a preset clears only a folder it wrote."""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import shutil
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

logger = logging.getLogger("grpo_demo")

LOCK_NAME = ".run.lock"


# What a run writes into its output folder: a preset clears these, and only these.
RUN_ENTRIES = (
    "run_record.json", "trainer_state.json", "training_args.bin", "curves.png", "README.md", "health.json", LOCK_NAME,
    "config.json", "generation_config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json",
    "adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json",
    "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "checkpoint-*", "eval", "wandb", "completions",
)  # fmt: skip


RUN_ONLY_ENTRIES = ("checkpoint-*", "eval", "wandb", "completions", LOCK_NAME)  # no model or user file looks so


def written_by_a_run(path: Path) -> bool:
    return any(path.match(pattern) for pattern in RUN_ENTRIES)


def read_json(path: str | Path, default=None):
    """A JSON file of a run (record, state, summary), or `default` when it is missing or cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def disk_full(err: BaseException) -> bool:
    """Whether `err` (or what caused it) is a full disk or quota; safetensors reports one as its own error type."""
    while err is not None:
        if getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _started(pid: int) -> str | None:
    """When process `pid` started (Linux: /proc/<pid>/stat), to tell it from a later process given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, alive
        pass
    return started is None or _started(pid) in (None, started)  # a reused pid is another process


def _slurm_run() -> dict:
    """The Slurm job this process runs in and how often it was requeued (Slurm sets SLURM_RESTART_COUNT from the first
    requeue on); empty outside Slurm."""
    job = os.environ.get("SLURM_JOB_ID")
    return {"slurm_job": job, "slurm_restart": int(os.environ.get("SLURM_RESTART_COUNT") or 0)} if job else {}


def claim(output_dir: str | Path) -> Path:
    """Hold `output_dir` for this process until it exits: `<output_dir>/.run.lock` with its pid and host (and Slurm
    job). A lock whose process is gone (a killed run), or left by an earlier run of this requeued Slurm job (which
    may have run on another machine: Slurm ends one run of a job before it starts the next), is taken over, saying
    so; a live one stops this run with a message."""
    folder = Path(output_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        sys.exit(f"output_dir={output_dir}: cannot be made ({err.strerror}): choose another --output_dir")
    path = folder / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _started(os.getpid()), **_slurm_run()}
    while True:
        try:
            with path.open("x", encoding="utf-8") as f:
                json.dump({**me, "since": datetime.now(UTC).isoformat(timespec="seconds"), "command": sys.argv}, f)
            break
        except FileExistsError:
            try:
                holder = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                holder = {}  # being written, or damaged
            same_host = holder.get("host") == me["host"]
            if holder.get("pid") == me["pid"] and same_host:
                return path  # this process holds it already
            if isinstance(holder.get("pid"), int) and same_host and not _alive(holder["pid"], holder.get("started")):
                logger.warning("Taking over %s: its run (pid %d) is gone", path, holder["pid"])
                path.unlink(missing_ok=True)
                continue
            job = me.get("slurm_job")
            if job and holder.get("slurm_job") == job and (holder.get("slurm_restart") or 0) < me["slurm_restart"]:
                logger.warning("Taking over %s: Slurm job %s held it before it was requeued", path, job)
                path.unlink(missing_ok=True)
                continue
            where = "" if same_host else f" on {holder.get('host')}"
            sys.exit(
                f"output_dir={output_dir} is in use by another run (pid {holder.get('pid')}{where}, since "
                f"{holder.get('since')}): wait for it to end, or choose another --output_dir "
                f"(if that run is over, delete {path})"
            )
    atexit.register(lambda: path.unlink(missing_ok=True) if _held_by_me(path) else None)
    return path


def _held_by_me(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid()
    except (OSError, ValueError):
        return False


def clear_preset_folder(output_dir: str | Path, preset: str) -> None:
    """Empty a preset's own output folder for a new run (its lock stays): only when the runs in it were that
    preset's (their run record says so) or it holds nothing else; otherwise stop, naming it."""
    folder = Path(output_dir)
    contents = [p for p in folder.iterdir() if p.name != LOCK_NAME] if folder.is_dir() else []
    if not contents:
        return
    foreign = sorted(p.name for p in contents if not written_by_a_run(p))
    settings = (read_json(folder / "run_record.json") or {}).get("settings") or {}
    ours = bool((settings.get("run") or settings.get("recipe") or {}).get(preset))
    if not ours or foreign:
        sys.exit(
            f"--{preset} starts afresh in {folder}, which holds files a --{preset} run did not write"
            f"{': ' + ', '.join(foreign[:5]) if foreign else ''}: move them, or give the preset another --output_dir"
        )
    logger.warning("--%s starts afresh: clearing %s", preset, folder)
    for path in contents:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
