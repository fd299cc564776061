"""The shape of the code: the package never imports the recipe, importing the recipe is free, and running it loads
it once."""

from __future__ import annotations

import subprocess
import sys

import pytest
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


@pytest.mark.slow  # the recipe and every module in a subprocess
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


@pytest.mark.slow  # the recipe and every module in a subprocess
def test_running_the_recipe_loads_it_once(tmp_path):
    """`python grpo_demo.py` runs the file as __main__; nothing imports it a second time as `grpo_demo`."""
    result = python("", tmp_path, "-X", "importtime", str(ROOT / "grpo_demo.py"), "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--eval_only" in result.stdout  # the help ran, after every import the settings need
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "grpo_kit.settings" in imported and "grpo_demo" not in imported


# The floors, by when their code runs; a module imports only from its own floor or below (docs/ARCHITECTURE.md).
FLOORS = {
    # 0. pure: answers, numbers, the format, scoring, data, the output folder's layout (no torch)
    **dict.fromkeys(["__init__", "numbers", "answer_format", "scoring", "data", "layout"], 0),
    # 1. the libraries as the recipe uses them: models, generation, every patch, the Hub, the offline assets
    **dict.fromkeys(["patches", "generation", "models", "online", "smoke", "demo"], 1),
    # 2. measuring: the evaluation, lm-eval's tasks, reports on disk, the curves
    **dict.fromkeys(["evaluation", "harness", "reports", "plots"], 2),
    # 3. a run's life: lock, record, resume; health; stopping; the console; the warm start
    **dict.fromkeys(["runs", "health", "stopping", "console", "warm_start"], 3),
    # 4. before anything loads: the settings, the checks and the memory plan, the presets
    **dict.fromkeys(["settings", "checks", "presets"], 4),
    # 5. entry points beside the recipe: the search, the merge
    **dict.fromkeys(["search", "merge"], 5),
}
HEAVY = ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "deepspeed")


def imports(path) -> tuple[set[str], set[str]]:
    """The kit's modules and the top-level packages a module imports anywhere in it (in functions too)."""
    import ast

    kit, packages = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "grpo_kit":
                packages.add(parts[0])
            else:
                kit |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                kit |= {parts[1]} if parts[0] == "grpo_kit" and len(parts) > 1 else set()
                packages |= {parts[0]} if parts[0] != "grpo_kit" else set()
    return kit - {"RecipeError", "offline_commands"}, packages  # the package's own two names


def test_every_import_goes_down_a_floor_or_stays_on_it():
    modules = {p.stem: p for p in (ROOT / "grpo_kit").glob("*.py")}
    assert set(modules) == set(FLOORS), "a module without a floor, or a floor without its module"
    up = []
    for name, path in modules.items():
        kit, packages = imports(path)
        up += [f"{name} -> {dep}" for dep in kit - {name} if FLOORS[dep] > FLOORS[name]]
        assert "grpo_demo" not in packages, f"{name} imports the recipe"
        if FLOORS[name] == 0:
            assert not packages & set(HEAVY), f"{name} is pure code and imports {packages & set(HEAVY)}"
    assert not up, up


def test_the_kits_imports_have_no_circle():
    graph = {p.stem: imports(p)[0] - {p.stem} for p in (ROOT / "grpo_kit").glob("*.py")}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for dep in graph[todo.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    assert not [name for name in graph if name in reach(name)]


def test_only_the_layout_names_the_files_of_a_run():
    """The output folder's files are named in grpo_kit/layout.py alone: a new file of a run gets its line there."""
    names = ('"run_record.json"', '"health.json"', '"curves.png"', '"trainer_state.json"', '"checkpoint-', '/ "eval"')
    found = [
        f"{path.name}: {name}"
        for path in (ROOT / "grpo_kit").glob("*.py")
        if path.stem != "layout"
        for name in names
        if name in path.read_text()
    ]
    assert not found, found


def test_the_architecture_page_draws_the_floors_the_code_has():
    """docs/ARCHITECTURE.md's drawing: each floor's line names exactly its modules."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    drawn = {}
    for line in page.split("```")[1].splitlines():
        if line[:3].strip().isdigit():
            floor = int(line[:3])
            words = line.replace("·", " ").replace("(", " ").replace(")", " ").split()
            drawn |= {w: floor for w in words if w in FLOORS}
    assert drawn == {name: floor for name, floor in FLOORS.items() if floor < 5}  # the entry points: above


@pytest.mark.slow  # pytest in a subprocess, collecting the suite three times (~20 s): run by CI's tier command
@pytest.mark.long
def test_the_tiers_run_only_when_named(tmp_path):
    """The default run leaves the Slurm, real-model and long tiers to CI's second command; naming a tier (its marker,
    its file) runs it."""
    tier = "tests/test_demo.py::test_the_demo_learns_on_the_llama_model_too"

    def collected(*args: str) -> set[str]:
        result = python(
            "", tmp_path, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *args
        )
        return {line for line in result.stdout.splitlines() if "::" in line}

    assert tier not in collected()  # the README's command
    assert tier in collected("tests/test_demo.py")  # its file named
    assert tier in collected("-m", "long")


def test_no_function_of_the_recipe_or_the_kit_runs_over_60_lines():
    """A function a reader holds in one screen: longer ones split where their steps part (classes are not counted,
    their methods are)."""
    import ast

    long = []
    for path in [ROOT / "grpo_demo.py", *sorted((ROOT / "grpo_kit").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
