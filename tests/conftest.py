"""Shared helpers: the recipe run as a user runs it (offline, in a scratch folder), its settings resolved or refused,
and a tiny model in its format."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REWARD_NAMES = [
    "xmlcount_reward_func",
    "soft_format_reward_func",
    "strict_format_reward_func",
    "int_reward_func",
    "correctness_reward_func",
]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # on 2 shared cores, torch's thread pools fight: 5-20x slower


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
        **ONE_THREAD,
        **extra,
    )
    return env


def assert_same_final_weights(run: Path, whole: Path) -> None:
    """`run`'s saved weights are `whole`'s bit for bit: a resume restores everything the steps after it depend on
    (weights, optimizer, scheduler, RNG, the data order), and the CPU's kernels (gloo's sums too) are deterministic."""
    import torch
    from safetensors.torch import load_file

    whole_weights, run_weights = load_file(whole / "model.safetensors"), load_file(run / "model.safetensors")
    assert run_weights.keys() == whole_weights.keys()
    for name, tensor in whole_weights.items():
        torch.testing.assert_close(run_weights[name], tensor, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")


def run_recipe(args: list[str], cwd: Path, script: Path = ROOT / "grpo_demo.py", timeout: int = 900, **env: str):
    """`python grpo_demo.py ARGS` (or another recipe file) in `cwd`, offline; stdout and stderr captured together."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=offline_env(cwd, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def run_printed(output: str, lead: str, cwd: Path, **env: str):
    """Run the command a run printed after `lead` (to the end of that line) as a user would paste it: `python ...`
    with this interpreter, offline, in `cwd`."""
    import shlex

    line = output.split(lead, 1)[1].splitlines()[0]
    parts = shlex.split(line)
    assert parts[0] == "python", line
    return subprocess.run(
        [sys.executable, *parts[1:]], cwd=cwd, env=offline_env(cwd, **env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=900,
    )  # fmt: skip


def resolved(argv: list[str]) -> types.SimpleNamespace:
    """The recipe's resolved, checked settings (without building the trainer's arguments, which set up a device)."""
    import grpo_demo
    from grpo_kit import settings

    return types.SimpleNamespace(**settings.resolve(argv, grpo_demo.recipe_defaults(), grpo_demo.REWARD_FUNCS))


def refused(argv: list[str]) -> str:
    """The message the recipe stops with for `argv` (it must stop)."""
    from grpo_kit import RecipeError

    with pytest.raises(RecipeError) as stop:
        resolved(argv)
    return str(stop.value)


@pytest.fixture
def single_process(monkeypatch, tmp_path):
    """One process, no DeepSpeed, and a scratch working folder (outputs/ is relative): settings as `python
    grpo_demo.py` resolves them in a fresh folder (a module's tests take it with `pytest.mark.usefixtures`)."""
    for name in ("WORLD_SIZE", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session", autouse=True)
def offline_hub():
    """Tests never reach the Hub: offline mode as HF_HUB_OFFLINE=1 gives it (test_hub.py tests the probe)."""
    import datasets.config
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch thread in the test process too (see ONE_THREAD)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny():
    """(tokenizer, model): the smoke preset's tiny Qwen2 and tokenizer, in the recipe's answer format."""
    import grpo_demo
    from grpo_kit import smoke

    rows = smoke.make_problems(64)
    tokenizer = smoke.build_tokenizer(smoke.corpus(grpo_demo.ANSWER_FORMAT, rows), grpo_demo.ANSWER_FORMAT.tags)
    return tokenizer, smoke.build_tiny_model(tokenizer)


@pytest.fixture(scope="session")
def tiny_dir(tiny, tmp_path_factory):
    """The tiny model and its tokenizer saved in a folder, as a model on disk."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer, model = tiny
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def base_model_dir(tiny_dir, tmp_path_factory):
    """The tiny model saved without a chat template, as a base (not instruct) model comes."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("tiny-base") / "tiny-base"
    shutil.copytree(tiny_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """The smoke preset's tiny Llama model and tokenizer with Llama 3's chat conventions, saved in a folder as
    `--smoke --tiny_model llama3` builds them."""
    import grpo_demo
    from grpo_kit import smoke

    fmt, folder = grpo_demo.ANSWER_FORMAT, tmp_path_factory.mktemp("tiny-llama3")
    tokenizer = smoke.build_tokenizer(smoke.corpus(fmt, smoke.make_problems(64), "llama3"), fmt.tags, kind="llama3")
    smoke.build_tiny_model(tokenizer, kind="llama3").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def gsm8k_dir(tmp_path_factory):
    """A folder of generated GSM8K-format problems: 64 train, 32 test."""
    from grpo_kit import smoke

    return smoke.write_gsm8k_folder(tmp_path_factory.mktemp("gsm8k"), n_train=64, n_test=32)


def real_gsm8k() -> Path | None:
    """Real GSM8K (train.jsonl, test.jsonl): $GSM8K_DIR, else `shared/data/gsm8k` beside the repository or a folder
    above it (the project's shared data), or beside the checkout a local clone was made from; None where there is
    none. Never copied into the repository."""
    if os.environ.get("GSM8K_DIR"):
        return Path(os.environ["GSM8K_DIR"])
    places = [ROOT]
    origin = subprocess.run(["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True, text=True)
    if origin.returncode == 0 and Path(origin.stdout.strip()).is_dir():  # a clone of a checkout on this machine
        places.append(Path(origin.stdout.strip()).resolve())
    found = (parent / "shared" / "data" / "gsm8k" for place in places for parent in place.parents)
    return next((path for path in found if (path / "test.jsonl").is_file()), None)


@pytest.fixture(scope="session")
def real_gsm8k_dir():
    """Real GSM8K for the `real_model` tier; the tier is skipped, saying why, without it."""
    folder = real_gsm8k()
    if folder is None or not all((folder / f"{split}.jsonl").is_file() for split in ("train", "test")):
        pytest.skip("real GSM8K not found: set GSM8K_DIR to a folder with train.jsonl and test.jsonl")
    return folder


@pytest.fixture(scope="session")
def real_model_dir():
    """SmolLM2-135M-Instruct as a model folder (benchmarks/smollm2.py, built once and reused); the `real_model` tier
    is skipped, saying why, where its wheel or the gguf package is not installed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import smollm2

    if reason := smollm2.missing():
        pytest.skip(reason)
    return smollm2.ensure()


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine that says it has an Ampere-or-newer CUDA GPU with flash-attn installed, for settings only: nothing
    is placed on it, and the trainer's arguments (which would set up the device) are not built."""
    pretend_cuda(monkeypatch)


@pytest.fixture
def gpu_extras(fake_cuda, monkeypatch):
    """A CUDA machine with the GPU extras installed, as far as the checks can tell."""
    from grpo_kit import checks

    versions = {"vllm": "0.30.0", "bitsandbytes": "0.50.2", "flash-attn": "2.8.3"}
    monkeypatch.setattr(checks, "installed_version", versions.get)
    return versions


def pretend_cuda(monkeypatch) -> None:
    """See `fake_cuda`; for a `pytest.MonkeyPatch.context()` of a test's own."""
    import importlib.util
    import sys
    import types

    import torch
    import trl  # noqa: F401  (imported first: its import-time checks must see the real machine)
    from trl import GRPOConfig, ModelConfig  # noqa: F401

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else find_spec(name, *a)
    )


# The tiers a run leaves out unless it names them (a marker expression, or their file or one of its tests): CI runs
# them after the default run, `python -m pytest -q -m "slurm or real_model or long"`.
TIERS = ("slurm", "real_model", "long")
NAMED = "GRPO_TESTS_NAMED_FILES"  # set by the main process, read by xdist's workers (they inherit it)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the main process: it alone sees how pytest was invoked
        files = {str(Path(arg.split("::")[0]).resolve()) for arg in config.args if ".py" in arg}
        os.environ[NAMED] = "*" if config.option.markexpr else "\n".join(sorted(files))


def pytest_collection_modifyitems(config, items):
    named = os.environ.get(NAMED, "")
    if named == "*":  # -m: the expression decides
        return
    files = set(named.split("\n"))
    tiers = [i for i in items if any(i.get_closest_marker(t) for t in TIERS) and str(i.path.resolve()) not in files]
    if tiers:
        config.hook.pytest_deselected(items=tiers)
        items[:] = [item for item in items if item not in tiers]
