"""Importing the recipe is free; a user without network gets a short message, not a traceback."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, offline_env, run_recipe

from grpo_kit.smoke import write_gsm8k_folder


def test_import_touches_no_heavy_library(tmp_path):
    code = (
        "import sys, grpo_demo\n"
        "loaded = {'torch', 'datasets', 'transformers', 'trl', 'flash_attn', 'wandb'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=offline_env(tmp_path), capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


def test_unreachable_hub_names_the_local_options(tmp_path):
    result = run_recipe(["--max_steps", "1", "--report_to", "none"], cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout
    assert "--dataset DIR" in result.stdout and "--smoke" in result.stdout


def test_missing_model_offline_is_a_short_message(tmp_path):
    data = write_gsm8k_folder(tmp_path / "data", n_train=4, n_test=2)
    args = ["--dataset", str(data), "--model_name_or_path", "nobody/no-such-model", "--report_to", "none"]
    result = run_recipe(args, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout
    assert "Could not load the model 'nobody/no-such-model'" in result.stdout


def test_dataset_folder_without_the_split_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_recipe(["--dataset", str(tmp_path / "empty"), "--report_to", "none"], cwd=tmp_path)
    assert result.returncode != 0
    assert "no train.jsonl there" in result.stdout
