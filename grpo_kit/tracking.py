"""wandb that is real with credentials and offline without them, never prompting."""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

logger = logging.getLogger("grpo_demo")

WANDB_PROJECT = "gsm8k-grpo"


def has_wandb_credentials() -> bool:
    """True when wandb would find an API key without asking: the environment or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        return path.is_file() and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_enabled(args) -> bool:
    return "wandb" in (args.report_to or [])


def configure_wandb(args) -> None:
    """Point wandb at the run's output folder and go offline, saying so, when there are no credentials."""
    if not wandb_enabled(args):
        return
    os.environ.setdefault("WANDB_PROJECT", WANDB_PROJECT)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_DIR", str(Path(args.output_dir).resolve()))  # run files beside the checkpoints
    if os.environ.get("WANDB_MODE") is None and not has_wandb_credentials():
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("No wandb credentials found (wandb login, or WANDB_API_KEY): logging offline.")
    if os.environ.get("WANDB_MODE") == "offline":
        logger.warning("wandb is offline; upload the run later with: %s", sync_command())


def sync_command() -> str:
    return f"wandb sync {os.environ.get('WANDB_DIR', '.')}/wandb/offline-run-*"


def finish(trainer) -> None:
    """Close the trackers (and the process group); repeat how to upload an offline run."""
    trainer.end()
    if wandb_enabled(trainer.args) and os.environ.get("WANDB_MODE") == "offline":
        logger.info("wandb ran offline; upload with: %s", sync_command())
