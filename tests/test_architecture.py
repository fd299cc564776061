"""The shape of the code: the package never imports the recipe, importing the recipe is free, and running it loads
it once."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, offline_env


def python(code: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args, "-c", code] if code else [sys.executable, *args],
        cwd=ROOT,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_package_and_each_of_its_modules_import_without_the_recipe(tmp_path):
    code = (
        "import importlib, pkgutil, sys, grpo_kit\n"
        "names = [m.name for m in pkgutil.iter_modules(grpo_kit.__path__)]\n"
        "for name in names:\n"
        "    importlib.import_module(f'grpo_kit.{name}')\n"
        "assert 'grpo_demo' not in sys.modules, 'grpo_kit imported grpo_demo'\n"
        "print(len(names))\n"
    )
    result = python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) >= 15  # every module was imported, not an empty list


def test_importing_the_recipe_touches_no_heavy_library(tmp_path):
    code = (
        "import sys, grpo_demo\n"
        "loaded = {'torch', 'datasets', 'transformers', 'trl', 'flash_attn', 'wandb'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    result = python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_running_the_recipe_loads_it_once(tmp_path):
    """`python grpo_demo.py` runs the file as __main__; nothing imports it a second time as `grpo_demo`."""
    result = python("", tmp_path, "-X", "importtime", str(ROOT / "grpo_demo.py"), "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--eval_only" in result.stdout  # the help ran, after every import the settings need
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "grpo_kit.settings" in imported and "grpo_demo" not in imported
