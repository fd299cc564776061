"""The services a run talks to, and what it does without them: the Hugging Face Hub, asked once (unreachable: the
run says so at once and works offline, from the local cache and folders, instead of retrying every download and
failing minutes later), and wandb, real with credentials and offline without them, never prompting."""

import logging
import netrc
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from grpo_kit import RecipeError, offline_commands

logger = logging.getLogger("grpo_demo")

PROBE_SECONDS = 3.0


def go_offline_if_unreachable(values: dict) -> bool:
    """Probe the Hub once if the run would fetch its model or data set there, or push to it; unreachable: say so,
    work offline. A run that would push its model (`--push_to_hub`) is refused then, before anything loads."""
    import huggingface_hub.constants

    pushes = values.get("push_to_hub") and not values.get("eval_only") and values.get("ask") is None
    offline = huggingface_hub.constants.HF_HUB_OFFLINE or _unreachable(values, pushes)
    if offline and pushes:
        raise RecipeError(
            "push_to_hub: the Hugging Face Hub cannot be reached (no network, or HF_HUB_OFFLINE is set), and the "
            "run would fail at its first push: drop --push_to_hub, and upload the saved model later "
            f"(hf upload <your-repo> {values.get('output_dir')})"
        )
    return bool(offline)


def hub_address() -> tuple[str, int]:
    """(host, port) of the Hub this process talks to: HF_ENDPOINT's (a mirror's port, http's 80), else the Hub's."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        port = endpoint.port
    except ValueError:  # a port that is no number: the libraries would fail on it too, the probe says unreachable
        port = None
    return endpoint.hostname or "huggingface.co", port or (80 if endpoint.scheme == "http" else 443)


def _unreachable(values: dict, pushes: bool) -> bool:
    import huggingface_hub.constants

    needs_data = values.get("ask") is None  # --ask reads its model alone
    if (
        Path(values["model_name_or_path"]).expanduser().is_dir()
        and (values["dataset"] or not needs_data)
        and not pushes
    ):
        return False
    try:
        socket.create_connection(hub_address(), timeout=PROBE_SECONDS).close()
        return False
    except OSError:
        logger.warning(
            "The Hugging Face Hub cannot be reached: working offline, from the local cache and folders only "
            "(--dataset DIR and a local --model_name_or_path work without it; so do %s)",
            offline_commands(),
        )
    # This process and its children read the cache only; the libraries read the flag at import: set theirs too.
    import datasets.config

    os.environ["HF_HUB_OFFLINE"] = "1"
    huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    return True


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


def offline_wandb(args) -> bool:
    return "wandb" in (args.report_to or []) and os.environ.get("WANDB_MODE") == "offline"


def configure_wandb(args) -> None:
    """Point wandb at the run's output folder and go offline, saying so, when there are no credentials."""
    if "wandb" not in (args.report_to or []):
        return
    os.environ.setdefault("WANDB_PROJECT", "gsm8k-grpo")
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_DIR", str(Path(args.output_dir).resolve()))  # run files beside the checkpoints
    why = "wandb is offline"
    if os.environ.get("WANDB_MODE") is None and not has_wandb_credentials():
        os.environ["WANDB_MODE"] = "offline"
        why = "No wandb credentials found (wandb login, or WANDB_API_KEY): logging offline"
    if offline_wandb(args):  # said once here; wandb prints its run's own command as it finishes
        logger.warning("%s; upload the run later with: %s", why, sync_command())


def sync_command() -> str:
    return f"wandb sync {os.environ.get('WANDB_DIR', '.')}/wandb/offline-run-*"


def finish(trainer) -> None:
    """Close the trackers (and the process group)."""
    trainer.end()
