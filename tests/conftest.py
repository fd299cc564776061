"""Shared helpers: run the recipe as a user would, offline, in a scratch folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REWARD_NAMES = [
    "xmlcount_reward_func",
    "soft_format_reward_func",
    "strict_format_reward_func",
    "int_reward_func",
    "correctness_reward_func",
]


def offline_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user with no network, no Hub cache and no wandb login."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HF_")) and k != "NETRC"}
    env.update(
        HOME=str(home),
        HF_HOME=str(home / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def run_recipe(args: list[str], cwd: Path, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """`python grpo_demo.py ARGS` in `cwd`, offline; stdout and stderr captured together."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, str(ROOT / "grpo_demo.py"), *args],
        cwd=cwd,
        env=offline_env(cwd, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
