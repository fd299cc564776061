"""The Hugging Face Hub, asked once: when it cannot be reached, the run says so at once and works offline (from the
local cache and folders), instead of retrying every download and failing minutes later."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

logger = logging.getLogger("grpo_demo")

PROBE_SECONDS = 3.0


def needs_hub(values: dict) -> bool:
    """Whether the run would fetch its model or its data set from the Hub."""
    return not Path(values["model_name_or_path"]).expanduser().is_dir() or not values["dataset"]


def reachable(timeout: float = PROBE_SECONDS) -> bool:
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def work_offline() -> None:
    """Offline mode for this process and its children: huggingface_hub, transformers and datasets read the cache
    only (their flags are read at import, so the imported modules' flags are set too)."""
    import datasets.config
    import huggingface_hub.constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True


def go_offline_if_unreachable(values: dict) -> bool:
    """Probe the Hub once when the run needs it; unreachable: say so once and work offline. True when offline."""
    import huggingface_hub.constants

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return True
    if not needs_hub(values) or reachable():
        return False
    logger.warning(
        "The Hugging Face Hub cannot be reached: working offline, from the local cache and folders only "
        "(--dataset DIR and a local --model_name_or_path work without it)"
    )
    work_offline()
    return True
