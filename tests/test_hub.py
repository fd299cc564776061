"""A Hub that cannot be reached is found out once, in seconds, and the run goes on offline from the cache."""

from __future__ import annotations

import socket

import datasets.config
import huggingface_hub.constants
import pytest

from grpo_kit import RecipeError, online


@pytest.fixture
def hub_flags_on(monkeypatch):
    """The library flags as on a machine where no one asked for offline mode (restored after the test)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


HUB_RUN = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "dataset": None}


def test_an_unreachable_hub_turns_offline_mode_on_and_says_so_once(hub_flags_on, monkeypatch, caplog):
    probes = []

    def unreachable(address, timeout):
        probes.append((address, timeout))
        raise OSError("Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    with caplog.at_level("WARNING", logger="grpo_demo"):
        assert online.go_offline_if_unreachable(HUB_RUN) is True
        assert online.go_offline_if_unreachable(HUB_RUN) is True  # already offline: not asked again
    assert probes == [(("huggingface.co", 443), online.PROBE_SECONDS)]
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert caplog.text.count("The Hugging Face Hub cannot be reached: working offline") == 1


def test_a_run_of_local_files_does_not_ask(hub_flags_on, monkeypatch, tmp_path):
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed the Hub"))
    assert online.go_offline_if_unreachable({"model_name_or_path": str(tmp_path), "dataset": str(tmp_path)}) is False
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False


def test_pushing_to_an_unreachable_hub_is_refused_before_anything_loads(hub_flags_on, monkeypatch, tmp_path):
    def unreachable(address, timeout):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    local = {"model_name_or_path": str(tmp_path), "dataset": str(tmp_path), "output_dir": "outputs/run"}
    with pytest.raises(RecipeError) as stop:
        online.go_offline_if_unreachable({**local, "push_to_hub": True, "eval_only": False, "ask": None})
    assert str(stop.value) == (
        "push_to_hub: the Hugging Face Hub cannot be reached (no network, or HF_HUB_OFFLINE is set), and the run would "
        "fail at its first push: drop --push_to_hub, and upload the saved model later (hf upload <your-repo> "
        "outputs/run)"
    )
    assert online.go_offline_if_unreachable({**local, "push_to_hub": True, "eval_only": True, "ask": None})


def test_pushing_offline_is_refused_by_the_recipe(tmp_path):
    from conftest import refused

    message = refused(["--smoke", "--push_to_hub", "true", "--output_dir", str(tmp_path / "run")])
    assert "push_to_hub: the Hugging Face Hub cannot be reached" in message


def test_asking_a_local_model_does_not_ask_the_hub(hub_flags_on, monkeypatch, tmp_path):
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed the Hub"))
    asked = {"model_name_or_path": str(tmp_path), "dataset": None, "ask": "What is 2 + 2?"}
    assert online.go_offline_if_unreachable(asked) is False  # --ask reads no data set


@pytest.mark.parametrize(
    ("endpoint", "address"),
    [
        (None, ("huggingface.co", 443)),
        ("http://127.0.0.1:8080", ("127.0.0.1", 8080)),  # a mirror on its own port
        ("http://mirror.local", ("mirror.local", 80)),
        ("https://hf-mirror.com", ("hf-mirror.com", 443)),
    ],
)
def test_the_hub_probe_asks_the_endpoint_the_user_set(monkeypatch, endpoint, address):
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    else:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert online.hub_address() == address
