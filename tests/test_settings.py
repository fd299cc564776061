"""Settings: the reference's hyperparameters as defaults, overridable from YAML and the command line; every value that
cannot work is named before anything loads; the attention that can run is chosen; configs and pins for scale."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, offline_env, refused, resolved

import grpo_demo
from grpo_kit import RecipeError, checks, evaluation, models, runs, settings

TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


pytestmark = pytest.mark.usefixtures("single_process")


# ----------------------------------------------------------------------------------------------------------------
# Defaults and their overrides


def test_defaults_are_the_reference_hyperparameters_on_todays_trl():
    run, args, model_args = grpo_demo.parse_settings([])
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (args.learning_rate, args.adam_beta1, args.adam_beta2, args.weight_decay) == (5e-6, 0.9, 0.99, 0.1)
    assert args.warmup_steps == 0.1  # a ratio: 10 % of the run
    assert (args.lr_scheduler_type, args.logging_steps, args.num_train_epochs) == ("cosine", 1, 1)
    assert (args.num_generations, args.max_completion_length, args.temperature) == (16, 786, 0.9)
    assert (args.save_steps, args.max_grad_norm, args.report_to) == (100, 0.1, ["wandb"])
    # The objective is named (TRL 1.16's defaults), not inherited unseen: token-level loss, group std, no KL.
    assert (args.loss_type, args.scale_rewards, args.beta) == ("dapo", "group", 0.0)
    assert {"loss_type", "scale_rewards", "beta"} <= grpo_demo.GRPO_DEFAULTS.keys()
    # One prompt's 16 completions per device step, 4 accumulated steps: 4 prompts per optimizer step.
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 4)
    assert args.generation_batch_size // args.num_generations == 4
    assert (args.output_dir, args.run_name) == ("outputs/Qwen-1.5B-GRPO", "Qwen-1.5B-GRPO-gsm8k")
    assert run.max_prompt_tokens == 256 and run.final_eval and run.eval_every_steps == 50
    assert (model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout) == (16, 64, 0.05)
    assert set(model_args.lora_target_modules) == TARGETS
    assert args.trust_remote_code is False
    assert run.health_checks_off == [] and args.logging_nan_inf_filter is False  # every check on, a NaN logged as NaN
    assert (run.eval_protocols, run.eval_max_gen_toks, run.eval_samples, run.eval_temperature) == (
        ["recipe"],
        None,
        0,
        None,
    )


@pytest.mark.parametrize(
    ("argv", "on"),
    [
        ([], True),  # the default: activations recomputed in the backward pass, not kept (16 x 786 tokens a step)
        (["--config", str(ROOT / "configs/gspo.yaml")], True),  # a config file that does not name it keeps it on
        (["--activation_checkpointing", "false"], False),  # turned off by its name
        (["--gradient_checkpointing", "false"], False),  # ... or by transformers' old name, which TRL's docs use
        (["--smoke"], False),  # the offline presets' tiny model: nothing to save
    ],
)
def test_activation_checkpointing_is_on_unless_turned_off(argv, on):
    _, args, _ = grpo_demo.parse_settings(argv)
    assert (args.activation_checkpointing, args.gradient_checkpointing) == (on, on)  # the trainer reads either


@pytest.mark.parametrize(
    ("model", "output_dir", "run_name"),
    [
        ("Qwen/Qwen2.5-1.5B-Instruct", "outputs/Qwen-1.5B-GRPO", "Qwen-1.5B-GRPO-gsm8k"),
        ("meta-llama/Llama-3.2-1B-Instruct", "outputs/Llama-1B-GRPO", "Llama-1B-GRPO-gsm8k"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "outputs/Qwen-0.5B-GRPO", "Qwen-0.5B-GRPO-gsm8k"),
        ("{tmp}/my-local-model/", "outputs/my-local-model-GRPO", "my-local-model-GRPO-gsm8k"),
    ],
)
def test_output_folder_and_run_name_follow_the_model(tmp_path, model, output_dir, run_name):
    (tmp_path / "my-local-model").mkdir()
    (tmp_path / "my-local-model" / "config.json").write_text("{}")
    chosen = resolved(["--model_name_or_path", model.format(tmp=tmp_path)])
    assert (chosen.output_dir, chosen.run_name) == (output_dir, run_name)


def test_editing_the_model_constant_swaps_the_model_and_its_names(monkeypatch):
    monkeypatch.setattr(grpo_demo, "MODEL_NAME", "meta-llama/Llama-3.2-1B-Instruct")
    chosen = resolved([])
    assert (chosen.model_name_or_path, chosen.output_dir) == (
        "meta-llama/Llama-3.2-1B-Instruct",
        "outputs/Llama-1B-GRPO",
    )


def test_yaml_overrides_defaults_and_the_command_line_overrides_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_TAGS", raising=False)  # put back as it was after the test
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model_name_or_path: meta-llama/Llama-3.2-1B-Instruct\nlearning_rate: 1.0e-6\nmax_steps: 7\nbeta: 0.04\n"
        "env:\n  WANDB_TAGS: set-by-yaml\n"
    )
    _, args, model_args = grpo_demo.parse_settings(["--config", str(recipe), "--max_steps", "9"])
    assert model_args.model_name_or_path == "meta-llama/Llama-3.2-1B-Instruct"
    assert args.output_dir == "outputs/Llama-1B-GRPO"
    assert (args.learning_rate, args.beta, args.max_steps) == (1e-6, 0.04, 9)
    assert args.num_generations == 16  # untouched defaults stay the recipe's
    assert os.environ["WANDB_TAGS"] == "set-by-yaml"


def test_an_explicit_output_dir_wins_over_the_model_name_and_a_preset():
    chosen = resolved(["--smoke", "--output_dir", "elsewhere", "--run_name", "mine"])
    assert (chosen.output_dir, chosen.run_name) == ("elsewhere", "mine")
    assert resolved(["--smoke"]).output_dir == "outputs/smoke-GRPO"  # the preset's own folder otherwise


@pytest.mark.parametrize(
    ("argv", "model", "output_dir", "run_name"),
    [
        (["--smoke"], "outputs/smoke-assets/tiny-qwen2", "outputs/smoke-GRPO", "smoke-GRPO-generated"),
        (
            ["--smoke", "--tiny_model", "llama3"],
            "outputs/smoke-assets/tiny-llama3",
            "outputs/smoke-llama3-GRPO",
            "smoke-llama3-GRPO-generated",
        ),
        (["--demo"], "outputs/demo-assets/warm-qwen2", "outputs/demo-GRPO", "demo-GRPO-generated"),
        (
            ["--demo", "--tiny_model", "llama3"],
            "outputs/demo-assets/warm-llama3",
            "outputs/demo-llama3-GRPO",
            "demo-llama3-GRPO-generated",
        ),
    ],
)
def test_a_presets_model_folders_and_names_follow_its_tiny_model(argv, model, output_dir, run_name):
    chosen = resolved(argv)
    assert (chosen.model_name_or_path, chosen.output_dir, chosen.run_name) == (model, output_dir, run_name)


def test_the_tiny_model_is_checked_and_named_in_yaml_too(tmp_path, caplog):
    assert "invalid choice: 'llama' (choose from 'qwen2', 'llama3')" in refused(["--smoke", "--tiny_model", "llama"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("demo: true\ntiny_model: llama3\n")
    assert resolved(["--config", str(recipe)]).model_name_or_path == "outputs/demo-assets/warm-llama3"
    recipe.write_text("demo: true\ntiny_model: Llama-3\n")
    assert "invalid choice: 'Llama-3'" in refused(["--config", str(recipe)])
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        resolved(["--tiny_model", "llama3"])
    assert "tiny_model=llama3 chooses the model of --smoke and --demo only: this run trains Qwen/Qwen2.5-1.5B" in (
        caplog.text
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: [1, 2\n", "not a readable YAML file"),
        ("- just\n- a list\n", "expected a mapping of setting: value"),
        ("no_such_field: 3\n", "Unknown settings in {path}: ['no_such_field']"),
        (
            "max_steps: 2.5\n",
            "Invalid setting (on the command line or in {path}): argument --max_steps/--max-steps: "
            "invalid int value: '2.5'",
        ),
        ("learning_rate: [1, 2]\n", "learning_rate: [1, 2]: it takes one value, not a list"),
        ("lora_target_modules: []\n", "it takes one or more values, not an empty list"),
        ("env: 3\n", "env: expected a mapping of VARIABLE: value"),
        ("env:\n  'A=B': 1\n", "env: 'A=B': 1 is not an environment variable and value"),
        ("env:\n  WORLD_SIZE: 2\n", "env: WORLD_SIZE is set by accelerate launch / torchrun, not by a config file"),
        ("max_steps: {a: 1}\n", "max_steps: a mapping given, it takes one value"),
        ("generation_kwargs: x\n", "generation_kwargs: str given, it takes a mapping"),
        ("config: other.yaml\n", "a config: inside a config file is not read"),
        ("env:\n  WANDB_MODE: off\n", "env: WANDB_MODE: False is not a text value (YAML reads yes/no/on/off/true"),
        ("health_checks_off: [truncation, --learning_rate, 1]\n", "a value cannot start with --"),
    ],
)
def test_a_bad_config_file_is_named(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    assert message.format(path=tmp_path / "bad.yaml") in refused(["--config", str(tmp_path / "bad.yaml")])


def test_a_config_file_whose_aliases_expand_past_any_settings_file_is_refused(tmp_path):
    """A "billion laughs": each anchor lists the one before ten times. This one stands for 1.2 million values
    (harmless even unguarded: a few MB); 9 levels of 9 in 330 bytes stand for 490 million."""
    anchors = ["&a [" + ",".join(["lol"] * 10) + "]"]
    anchors += [f"&{level} [" + ",".join([f"*{chr(ord(level) - 1)}"] * 10) + "]" for level in "bcdef"]
    (tmp_path / "bomb.yaml").write_text(f"lora_target_modules: [{', '.join(anchors)}]\n")
    assert (
        f"--config {tmp_path / 'bomb.yaml'}: its aliases (*name) expand to 1,234,569 values, and a settings file "
        "holds hundreds: write the settings out (at most 100,000 values)"
    ) in refused(["--config", str(tmp_path / "bomb.yaml")])
    (tmp_path / "aliases.yaml").write_text("learning_rate: &rate 2.0e-6\nweight_decay: *rate\n")  # aliases are read
    chosen = resolved(["--config", str(tmp_path / "aliases.yaml")])
    assert (chosen.learning_rate, chosen.weight_decay) == (2e-6, 2e-6)
    (tmp_path / "deep.yaml").write_text("learning_rate: " + "[" * 900 + "]" * 900 + "\n")  # counted, not recursed
    assert "it takes one value, not a list" in refused(["--config", str(tmp_path / "deep.yaml")])


@pytest.mark.parametrize(
    "env",
    [
        # git runs core.fsmonitor's command on `git status`, which the run record calls
        {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "touch {mark}; false"},
        {"PATH": "{tmp}"},
        {"LD_PRELOAD": "{tmp}/evil.so"},
        {"ACCELERATE_USE_DEEPSPEED": "true"},  # without deepspeed installed: a traceback, once
    ],
)
def test_a_config_files_env_cannot_set_a_variable_that_runs_code(tmp_path, monkeypatch, env):
    mark = tmp_path / "ran"
    env = {key: value.format(mark=mark, tmp=tmp_path) for key, value in env.items()}
    for key in env:  # whatever happens, the test's own environment is put back
        monkeypatch.setenv(key, os.environ[key]) if key in os.environ else monkeypatch.delenv(key, raising=False)
    (tmp_path / "c.yaml").write_text("max_steps: 3\nenv:\n" + "".join(f"  {k}: {v!r}\n" for k, v in env.items()))
    message = refused(["--config", str(tmp_path / "c.yaml")])
    first = next(iter(env))
    assert f"--config {tmp_path / 'c.yaml'}: env: {first} is not one a config file sets: set it in the shell" in message
    assert "HF_HOME" in message and "WANDB_PROJECT" in message  # what it can set
    assert all(os.environ.get(key) != value for key, value in env.items())
    assert len(runs.recipe_commit()["commit"] or "") == 40 and not mark.exists()  # git ran, and ran nothing else


@pytest.mark.slow  # the recipe in a subprocess
def test_a_config_files_env_is_set_before_the_libraries_read_it_and_recorded(tmp_path, monkeypatch):
    """HF_HOME is read once, when huggingface_hub is imported: the config's env: is set before the recipe imports
    it (or trl, transformers, datasets), so that the file's cache folder is the one used."""
    (tmp_path / "c.yaml").write_text(f"max_steps: 0\nenv:\n  HF_HOME: {tmp_path / 'hub-home'}\n  WANDB_TAGS: a,b\n")
    code = (
        "import grpo_demo, sys\nfrom grpo_kit import RecipeError\n"
        "try:\n    grpo_demo.main(['--config', sys.argv[1]])\nexcept RecipeError as err:\n    print(err)\n"
        "import datasets.config, huggingface_hub.constants\n"
        "print(huggingface_hub.constants.HF_HOME, datasets.config.HF_DATASETS_CACHE)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c.yaml")],
        cwd=tmp_path,
        env=offline_env(tmp_path),  # HF_HOME=<tmp>/hf in the shell
        capture_output=True,
        text=True,
    )
    assert "max_steps=0, num_train_epochs=1: this run would train nothing" in done.stdout, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"{tmp_path / 'hub-home'} {tmp_path / 'hub-home' / 'datasets'}"
    # What the run record says of it
    from datasets import Dataset

    monkeypatch.setenv("WANDB_TAGS", "a,b")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    rows = Dataset.from_list([{"prompt": "p", "answer": "1"}])
    record = runs.write_run_record(tmp_path / "run", {}, rows, seed=1)
    assert record["env"]["WANDB_TAGS"] == "a,b" and "HF_DATASETS_CACHE" not in record["env"]
    assert json.loads((tmp_path / "run" / "run_record.json").read_text())["env"] == record["env"]
    assert not {"PATH", "HOME"} & record["env"].keys()  # only what a config file could set


def test_yaml_values_are_typed_as_the_command_line_types_them(tmp_path):
    (tmp_path / "recipe.yaml").write_text(
        "lora_target_modules: q_proj\nuse_peft: true\nlearning_rate: 1.0e-6\nmax_steps: '7'\neval_limit: null\n"
        "model_name_or_path: null\ntemperature: null\n"
        "generation_kwargs: {min_new_tokens: 4}\n"
    )
    chosen = resolved(["--config", str(tmp_path / "recipe.yaml")])
    assert chosen.lora_target_modules == ["q_proj"]  # a list of one, not a pattern for PEFT
    _, _, model_args = grpo_demo.parse_settings(["--use_peft", "--lora_target_modules", "q_proj"])
    assert model_args.lora_target_modules == ["q_proj"]  # ModelConfig made it a string; the recipe keeps the list
    assert (chosen.use_peft, chosen.learning_rate, chosen.max_steps, chosen.eval_limit) == (True, 1e-6, 7, None)
    assert (chosen.model_name_or_path, chosen.temperature) == (grpo_demo.MODEL_NAME, 0.9)  # null: the default
    assert chosen.generation_kwargs == {"min_new_tokens": 4}


# ----------------------------------------------------------------------------------------------------------------
# What cannot work is named before anything loads


def test_every_invalid_setting_is_named_at_once(tmp_path):
    message = refused(
        [
            "--num_generations", "1",
            "--max_completion_length", "0",
            "--max_prompt_tokens", "-5",
            "--reward_weights", "1.0", "2.0",
            "--dataset", str(tmp_path / "missing"),
            "--model_name_or_path", "./no-such-model",
        ]
    )  # fmt: skip
    for expected in (
        "num_generations=1: GRPO compares completions within a group, so it needs at least 2",
        "max_completion_length=0: must be a positive number",
        "max_prompt_tokens=-5: must be a positive number",
        "reward_weights has 2 values for 5 rewards: give 5",
        f"dataset={tmp_path / 'missing'}: no train.jsonl there",
        "model_name_or_path=./no-such-model: no such folder",
    ):
        assert expected in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--per_device_train_batch_size", "10"],
            "generation batch 40 completions (per_device_train_batch_size 10 x 1 process(es) x 4 steps) is not "
            "divisible by num_generations=16: use --per_device_train_batch_size 16",
        ),
        (["--generation_batch_size", "24"], "generation batch 24 completions"),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps=0: must be at least 1"),
        (["--eval_batch_size", "0"], "eval_batch_size=0: must be at least 1"),
        (["--eval_every_steps", "-1"], "eval_every_steps=-1: 0 turns in-training accuracy off"),
        (["--resume_from_checkpoint", "nowhere/checkpoint-5"], "resume_from_checkpoint=nowhere/checkpoint-5: no such"),
        (["--no_such_setting", "3"], "Unknown settings on the command line: ['--no_such_setting', '3']"),
        (["--model_name_or_path", ""], "model_name_or_path is empty: name a local model folder or a Hub id"),
        (["--max_steps", "abc"], "Invalid setting: argument --max_steps/--max-steps: invalid int value: 'abc'"),
        (["--smoke", "--demo"], "--smoke and --demo are presets of their own: choose one"),
        (["--use_peft", "--lora_r", "0"], "lora_r=0: the adapter's rank must be at least 1"),
        (["--ask", " "], "ask is empty: give the question to answer"),
        (["--learning_rate", "nan"], "learning_rate=nan: must be positive and at most 0.01 (the recipe uses 5e-6)"),
        (["--learning_rate", "0"], "learning_rate=0.0: must be positive and at most 0.01"),
        (
            ["--learning_rate", "5e6"],
            "learning_rate=5000000.0: must be positive and at most 0.01 (the recipe uses 5e-6); did you mean 5e-06?",
        ),
        (["--learning_rate", "0.5"], "learning_rate=0.5: must be positive and at most 0.01 (the recipe uses 5e-6)"),
        (
            ["--temperature", "1e-40"],
            "temperature=1e-40: below 0.01 sampling is greedy in effect, and the logits divided by it overflow "
            "(to inf near 1e-38): use 0.01 or more (the recipe uses 0.9)",
        ),
        (["--eval_temperature", "1e-40"], "eval_temperature=1e-40: below 0.01 sampling is greedy in effect"),
        (["--learning_rate", "1e-320"], "learning_rate=1e-320: below 1e-09 no weight moves, the run would train"),
        (["--temperature", "0"], "temperature=0.0: sampling needs a positive temperature"),
        (["--seed", "-1"], "seed=-1: must be from 0 to 2**32 - 1"),
        (["--seed", "4294967296"], "seed=4294967296: must be from 0 to 2**32 - 1"),
        (["--weight_decay", "nan"], "weight_decay=nan: must be a finite number, 0 or more"),
        (["--adam_beta1", "2"], "adam_beta1=2.0: must be in [0, 1)"),
        (["--warmup_steps", "-1"], "warmup_steps=-1.0: must be 0 or more"),
        (["--top_k", "-5"], "top_k=-5: must be 0 (off) or more"),
        (["--repetition_penalty", "0"], "repetition_penalty=0.0: must be positive"),
        (["--steps_per_generation", "0"], "steps_per_generation=0: must be at least 1"),
        (["--num_iterations", "0"], "num_iterations=0: must be at least 1"),
        (["--use_peft", "--lora_dropout", "1.5"], "lora_dropout=1.5: must be in [0, 1)"),
        (["--num_train_epochs", "nan"], "num_train_epochs=nan: must be a finite number"),
        (["--eval_only", "--ask", "hi"], "eval_only and ask are two modes: choose one"),
        (["--eval_only", "--resume_from_checkpoint", "latest"], "resume_from_checkpoint is for training"),
        (["--max_steps", "0"], "max_steps=0, num_train_epochs=1: this run would train nothing"),
        (["--num_train_epochs", "0"], "max_steps=-1, num_train_epochs=0.0: this run would train nothing"),
        (["--output_dir", ""], "output_dir is empty: name a folder"),
        (["--health_checks_off", "truncation", "entropy"], "health_checks_off: entropy: no such check"),
        (["--eval_protocols", "recipe", "lm-eval"], "eval_protocols: lm-eval: no such protocol (the protocols: recipe"),
        (["--eval_max_gen_toks", "0"], "eval_max_gen_toks=0: lm-eval's max_gen_toks is at least 1 (default: 256)"),
        (
            ["--eval_protocols", "gsm8k", "--eval_split", "validation", "--validation_rows", "8"],
            "eval_protocols gsm8k: lm-eval's tasks measure GSM8K's test split",
        ),
        (["--eval_samples", "-1"], "eval_samples=-1: 0 (greedy only) or the samples per question"),
        (["--eval_temperature", "0"], "eval_temperature=0.0: sampling needs a positive temperature"),
        (["--eval_split", "validation"], "eval_split=validation measures the train rows --validation_rows holds out"),
        (["--eval_split", "dev"], "invalid choice: 'dev' (choose from 'test', 'validation')"),
        (["--validation_rows", "-1"], "validation_rows=-1: the train rows held out for validation, 0 or more"),
        (["--beta", "inf"], "beta=inf: must be 0 (no KL) or more"),
        (["--top_p", "nan"], "top_p=nan: must be in (0, 1]"),
        (["--save_steps", "0"], "save_steps=0.0: must be at least 1"),
    ],
)
def test_each_invalid_setting_has_its_own_message(args, message):
    assert message in refused(args)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # TRL reads these only once the trainer is built or at the first step, after the baseline evaluation ran
        (["--loss_type", "dapo2"], ["loss_type=dapo2", "grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo"]),
        (["--scale_rewards", "std"], ["scale_rewards=std", "group, batch, none"]),
        (["--importance_sampling_level", "seq"], ["importance_sampling_level=seq", "token, sequence"]),
        (["--multi_objective_aggregation", "sum"], ["multi_objective_aggregation", "sum_then_normalize"]),
        (["--use_vllm", "--vllm_importance_sampling_mode", "token"], ["vllm_importance_sampling_mode=token"]),
        (["--min_p", "2"], ["min_p=2.0"]),
        # transformers' own check of the trackers, which it makes only when the trainer is built
        (["--report_to", "tensorbord"], ["report_to=tensorbord", "tensorboard", "wandb"]),
        # runs that could not move a weight: said before they start
        (["--max_steps", "1", "--warmup_steps", "0.1"], ["max_steps=1", "warmup_steps=0.1", "--warmup_steps 0"]),
        (["--reward_weights", "0", "0", "0", "0", "0"], ["reward_weights=[0.0, 0.0, 0.0, 0.0, 0.0]"]),
        (["--reward_weights", "1", "nan", "1", "1", "1"], ["reward_weights=[1.0, nan,", "finite"]),
        (["--reward_weights", "1", "1", "inf", "1", "1"], ["reward_weights=[1.0, 1.0, inf,", "finite"]),
        (["--use_peft", "--lora_alpha", "0"], ["lora_alpha=0"]),
        # no abbreviation is taken: --conf is not --config (which the config reader would not have read)
        (["--conf", "configs/dapo.yaml"], ["Unknown settings on the command line: ['--conf'"]),
        (["--lr", "1e-5"], ["Unknown settings on the command line: ['--lr'"]),
    ],
)
def test_what_the_libraries_would_refuse_late_or_never_is_refused_before_loading(args, named):
    message = refused(["--smoke", *args])
    assert all(part in message for part in named), message


@pytest.mark.parametrize(
    "args",
    [
        ["--max_steps", "1", "--warmup_steps", "0"],  # no warmup: the one step trains
        ["--max_steps", "1", "--warmup_steps", "0.1", "--lr_scheduler_type", "constant"],  # constant has no warmup
        ["--reward_weights", "0", "0", "0", "0", "1"],  # one reward is enough
        ["--report_to", "none"],
        ["--vllm_importance_sampling_mode", "token"],  # read only with --use_vllm
        ["--report_to", "all"],  # transformers' own word for every installed tracker
        ["--scale_rewards", "false"],  # TRL's boolean: none
        ["--max_steps", "1", "--warmup_steps", "0.1", "--lr_scheduler_type", "reduce_lr_on_plateau"],  # no warmup
    ],
)
def test_their_neighbours_that_do_train_are_taken(args):
    chosen = resolved(["--smoke", *args])
    assert chosen.scale_rewards in ("group", "none")  # TRL's booleans as the names it reads


def test_a_vllm_servers_length_cap_is_checked_against_the_longest_prompt(tiny_dir):
    _, args, model_args = grpo_demo.parse_settings(
        ["--model_name_or_path", str(tiny_dir), "--max_completion_length", "100"]
    )
    args.use_vllm, args.vllm_max_model_length = True, 140  # as slurm/grpo.sbatch passes a server's cap
    with pytest.raises(
        RecipeError, match="vllm_max_model_length=140: vLLM would refuse the longest prompt \\(41 tokens"
    ):
        checks.model_and_disk(model_args, args, prompt_tokens=256, longest_prompt=lambda: 41)
    checks.model_and_disk(model_args, args, prompt_tokens=256, longest_prompt=lambda: 40)  # 40 + 100 fits 140


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # GRPOConfig's and TrainingArguments' own checks, as the objects are built: their words, the settings named
        (["--config", str(ROOT / "configs/dapo.yaml"), "--generation_batch_size", "16"], ["--steps_per_generation 16"]),
        (["--generation_batch_size", "12"], ["generation_batch_size (12)", "--generation_batch_size 12"]),
        (["--auto_find_batch_size", "true"], ["--auto_find_batch_size True"]),
        (["--log_completions_hub_repo", "me/logs", "--log_completions", "false"], ["--log_completions_hub_repo"]),
        (
            ["--vllm_importance_sampling_clip_min", "5", "--vllm_importance_sampling_clip_max", "2"],
            ["--vllm_importance_sampling_clip_min 5.0"],
        ),
        (["--eval_strategy", "steps", "--per_device_eval_batch_size", "3"], ["eval batch size (3 * 1)"]),
    ],
)
def test_the_libraries_own_refusals_are_the_recipes_messages(args, named):
    with pytest.raises(RecipeError) as stop:
        settings.parse(["--smoke", *args], grpo_demo.recipe_defaults(), grpo_demo.REWARD_FUNCS)
    assert str(stop.value).startswith("Invalid settings: ") and all(part in str(stop.value) for part in named)


def test_trl_takes_exactly_the_values_the_checks_allow():
    """The contract with TRL: every value its trainer and config compare each setting with, read from the installed
    source, is the list the checks take (a TRL that adds or drops one fails here)."""
    import inspect

    from trl.trainer import grpo_config, grpo_trainer

    source = inspect.getsource(grpo_trainer) + inspect.getsource(grpo_config)
    for name, allowed in {**checks.TRL_CHOICES, **checks.TRL_VLLM_CHOICES}.items():
        compared = re.findall(
            rf"(?:self|args)\.{name}\s*(?:==|!=|not in|in)\s*(\([^)]*\)|\[[^]]*\]|\"[^\"]+\")", source
        )
        found = set(re.findall(r'"([^"]+)"', " ".join(compared)))
        assert found == {a for a in allowed if isinstance(a, str)}, name


def test_bad_tag_names_are_refused(monkeypatch):
    message = refused(["--reasoning_tag", "my tag"])
    assert "reasoning_tag='my tag': a tag's name is a letter, then letters, digits, '_' or '-'" in message
    assert "reasoning_tag and answer_tag are both 'a'" in refused(["--reasoning_tag", "a", "--answer_tag", "a"])
    monkeypatch.setattr(grpo_demo, "ANSWER_TAG", "<answer>")  # an edited copy's constant is checked as well
    assert "answer_tag='<answer>': a tag's name is a letter" in refused([])


def test_an_output_folder_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    assert "output_dir=" + str(tmp_path / "a-file") + ": a file is there, not a folder" in refused(
        ["--output_dir", str(tmp_path / "a-file")]
    )
    (tmp_path / "read-only").mkdir()
    monkeypatch.setattr(checks.os, "access", lambda path, mode: Path(path) != tmp_path / "read-only")  # as if mode 500
    message = refused(["--output_dir", str(tmp_path / "read-only" / "run")])
    assert f"{tmp_path / 'read-only'} cannot be written to: choose another --output_dir" in message


def test_eval_only_writes_beside_the_model_it_evaluates(tmp_path):
    model = tmp_path / "outputs" / "Qwen-1.5B-GRPO-lora"  # would map to outputs/Qwen-1.5B-GRPO by name
    model.mkdir(parents=True)
    (model / "adapter_config.json").write_text("{}")
    assert resolved(["--eval_only", "--model_name_or_path", str(model)]).output_dir == str(model)
    chosen = resolved(["--eval_only", "--model_name_or_path", str(model), "--output_dir", str(tmp_path / "mine")])
    assert chosen.output_dir == str(tmp_path / "mine")  # unless told otherwise
    assert resolved(["--eval_only"]).output_dir == "outputs/Qwen-1.5B-GRPO"  # a Hub model: the run's folder
    # a run's checkpoint: in the run's folder, not inside the checkpoint (which the run's rotation deletes), under
    # the checkpoint's name
    checkpoint = fake_checkpoint(tmp_path / "run" / "checkpoint-2", step=2)
    (checkpoint / "config.json").write_text("{}")
    (tmp_path / "run" / "run_record.json").write_text("{}")
    assert resolved(["--eval_only", "--model_name_or_path", str(checkpoint)]).output_dir == str(tmp_path / "run")
    copied = fake_checkpoint(tmp_path / "Downloads" / "checkpoint-500", step=500)  # a checkpoint copied on its own
    (copied / "config.json").write_text("{}")
    (tmp_path / "Downloads" / "notes.txt").write_text("mine")
    assert resolved(["--eval_only", "--model_name_or_path", str(copied)]).output_dir == str(copied)
    assert [evaluation.evaluated_as(t) for t in ("checkpoint-2", True, False)] == ["checkpoint-2", "final", "baseline"]


def test_eval_only_writes_only_beside_a_run_or_a_model(tmp_path, monkeypatch, tiny_dir):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.txt").write_text("my notes")
    for folder in (str(tmp_path / "project"), "/etc", "/"):
        assert f"output_dir={folder} holds files that are not a run's or a model's (" in refused(
            ["--eval_only", "--model_name_or_path", str(tiny_dir), "--output_dir", folder]
        )
    assert "(notes.txt): choose another --output_dir" in refused(["--eval_only", "--output_dir", f"{tmp_path}/project"])
    (tmp_path / "evaluated" / "eval").mkdir(parents=True)
    for folder in (tiny_dir, tmp_path / "new", tmp_path / "evaluated"):  # the model's own, a new one, an evaluation's
        chosen = resolved(["--eval_only", "--model_name_or_path", str(tiny_dir), "--output_dir", str(folder)])
        assert chosen.output_dir == str(folder)
    monkeypatch.setattr(checks.os, "access", lambda path, mode: Path(path) != tmp_path / "evaluated")  # as if mode 500
    message = refused(["--eval_only", "--output_dir", str(tmp_path / "evaluated")])
    assert f"output_dir={tmp_path / 'evaluated'}: {tmp_path / 'evaluated'} cannot be written to" in message


def test_training_into_a_folder_of_other_files_or_the_start_model_is_refused(tmp_path, tiny_dir):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "README.md").write_text("my notes")
    message = refused(["--output_dir", str(tmp_path / "project")])
    assert "holds files that are not a run's (README.md), which a run would write over" in message
    message = refused(["--model_name_or_path", str(tiny_dir), "--output_dir", str(tiny_dir)])
    assert "is the start model's folder: training would overwrite it" in message
    assert "holds files that are not a run's" in refused(["--output_dir", "/"])
    (tmp_path / "evaluated" / "eval").mkdir(parents=True)  # only --eval_only's results: a run may start there
    assert resolved(["--output_dir", str(tmp_path / "evaluated")]).output_dir == str(tmp_path / "evaluated")


def test_a_model_folder_without_a_model_names_its_newest_checkpoint(tmp_path):
    (tmp_path / "crashed" / "checkpoint-20").mkdir(parents=True)
    (tmp_path / "crashed" / "checkpoint-20" / "trainer_state.json").write_text("{}")
    message = refused(["--eval_only", "--model_name_or_path", str(tmp_path / "crashed")])
    assert "no model in it, no config.json or adapter_config.json: its newest checkpoint is" in message
    assert str(tmp_path / "crashed" / "checkpoint-20") in message


def test_a_fraction_below_1_is_a_save_interval_of_that_share_of_the_run():
    assert resolved(["--save_steps", "0.25"]).save_steps == 0.25  # transformers reads it as a ratio of the steps


def test_an_argument_that_is_not_utf8_is_named_as_its_bytes():
    argument = b"run-\xff".decode("utf-8", "surrogateescape")  # as Python passes an undecodable byte in argv
    assert "Invalid setting: b'run-\\xff' is not UTF-8 text" in refused(["--output_dir", argument])


def test_the_help_explains_each_of_the_runs_own_settings(capsys):
    from dataclasses import fields

    from grpo_kit.settings import RunArguments

    for asked in ("--help", "--help-all"):
        with pytest.raises(SystemExit) as stop:
            grpo_demo.parse_settings([asked])
        assert stop.value.code == 0
        shown = "".join(capsys.readouterr().out.split())  # argparse wraps the lines
        for setting in fields(RunArguments):
            assert f"--{setting.name}" in shown and "".join(setting.metadata["help"].split()) in shown, setting.name
    assert "--tiny_model{qwen2,llama3}" in shown and "--eval_split{test,validation}" in shown  # --help-all's


def test_the_help_starts_with_the_settings_people_change_first_and_their_defaults(capsys):
    from grpo_kit.settings import FIRST_SETTINGS

    with pytest.raises(SystemExit):
        grpo_demo.parse_settings(["--help"])
    shown = capsys.readouterr().out
    first_screen = shown.splitlines()[:50]
    named = [line.split()[0] for line in first_screen if line.startswith("  --")]
    assert named[: len(FIRST_SETTINGS)] == [f"--{name}" for name in FIRST_SETTINGS]
    for default in ("--model_name_or_path [Qwen/Qwen2.5-1.5B-Instruct]", "--learning_rate [5e-06]",
                    "--num_generations [16]", "--max_completion_length [786]", "--beta [0.0]", "--loss_type [dapo]",
                    "--output_dir [outputs/Qwen-1.5B-GRPO]", "--report_to [wandb]"):  # fmt: skip
        assert default in "\n".join(first_screen), default
    assert len(shown.splitlines()) < 80 and shown.rstrip().endswith(" --help-all")
    resume = "".join(shown.split("--resume_from_checkpoint", 1)[1].split("--max_steps")[0].split())
    assert resume.startswith("latest(ortrue):thenewestcompletecheckpoint-Nin--output_dir")
    with pytest.raises(SystemExit):
        grpo_demo.parse_settings(["--demo", "--help"])  # a preset's own defaults
    assert "--max_steps [40]" in capsys.readouterr().out


def test_the_help_piped_into_head_ends_quietly(monkeypatch):
    read, write = os.pipe()
    os.close(read)  # as `python grpo_demo.py --help | head` leaves it once head has its lines
    with open(write, "w") as closed_pipe:
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        with pytest.raises(SystemExit) as stop:  # not a BrokenPipeError's traceback
            grpo_demo.parse_settings(["--help"])
    assert stop.value.code == 0


def test_the_full_help_says_what_resume_checks_and_what_no_final_eval_does(capsys):
    with pytest.raises(SystemExit):
        grpo_demo.parse_settings(["--help-all"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "Not directly used by" not in shown.split("--resume_from_checkpoint RESUME_FROM_CHECKPOINT, ")[1][:200]
    assert "latest (or true): the newest complete checkpoint-N in --output_dir" in shown
    assert "--no_final_eval, --no-final-eval Skip the baseline and final evaluations (as --final_eval false)" in shown


def test_config_as_one_argument_and_twice(tmp_path):
    (tmp_path / "a.yaml").write_text("max_steps: 7\n")
    assert resolved([f"--config={tmp_path / 'a.yaml'}"]).max_steps == 7
    assert "--config is given twice" in refused(["--config", "a.yaml", "--config", "a.yaml"])


def test_resuming_latest_where_there_is_no_checkpoint_says_it_starts_afresh(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        chosen = resolved(["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", "latest"])
    assert chosen.resume_from_checkpoint is None
    assert (
        "--resume_from_checkpoint latest: no complete checkpoint in" in caplog.text and "starting afresh" in caplog.text
    )


def fake_checkpoint(folder: Path, drop: tuple[str, ...] = (), step: int = 0) -> Path:
    """A checkpoint folder with every file a resume needs (tiny), less `drop`."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"w": torch.zeros(4)}, folder / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({}, folder / name)
    for name in drop:
        (folder / name).unlink()
    return folder


def test_resuming_takes_only_a_complete_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoint-2")
    fake_checkpoint(run / "checkpoint-4", drop=("scheduler.pt",))  # killed while saving
    cut = fake_checkpoint(run / "checkpoint-6") / "model.safetensors"
    cut.write_bytes(cut.read_bytes()[:-5])  # a disk that filled up
    flipped = fake_checkpoint(run / "checkpoint-8") / "rng_state.pth"
    data = bytearray(flipped.read_bytes())
    data[60:70] = b"\xff" * 10  # damaged in place: its length is right, its contents are not
    flipped.write_bytes(bytes(data))
    (fake_checkpoint(run / "checkpoint-10") / "trainer_state.json").write_text("[1, 2]")
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        chosen = resolved(["--output_dir", str(run), "--resume_from_checkpoint", "latest"])
    assert chosen.resume_from_checkpoint == str(run / "checkpoint-2")
    assert f"Skipping {run / 'checkpoint-4'}: incomplete, without scheduler.pt" in caplog.text
    assert (
        f"Skipping {run / 'checkpoint-6'}: incomplete, without model.safetensors (truncated or damaged)" in caplog.text
    )
    message = refused(["--output_dir", str(run), "--resume_from_checkpoint", str(run / "checkpoint-4")])
    assert (
        f"checkpoint-4: incomplete, without scheduler.pt; the newest complete one is {run / 'checkpoint-2'}" in message
    )


@pytest.mark.parametrize(
    ("steps", "newest"),
    [
        ((2, 10, 9), 10),  # by step: checkpoint-10 comes before checkpoint-9 by name, and after it by step
        ((10, 9, 2), 10),  # whatever order the folders were made (or listed) in
        ((1, 3, 20, 100), 100),  # the newest of several, not the first
        ((9,), 9),  # the only one
    ],
)
def test_resuming_latest_takes_the_complete_checkpoint_of_the_highest_step(tmp_path, steps, newest):
    run = tmp_path / "run"
    for step in steps:
        fake_checkpoint(run / f"checkpoint-{step}", step=step)
    chosen = resolved(["--output_dir", str(run), "--resume_from_checkpoint", "latest"])
    assert chosen.resume_from_checkpoint == str(run / f"checkpoint-{newest}")


@pytest.mark.parametrize(
    ("drop", "add", "missing"),
    [
        (("rng_state.pth",), (), ["rng_state.pth"]),  # killed before its RNG state was written: incomplete
        (("optimizer.pt", "scheduler.pt", "rng_state.pth"), (), ["optimizer.pt", "scheduler.pt", "rng_state.pth"]),
        (("rng_state.pth",), ("rng_state_0.pth", "rng_state_1.pth"), []),  # two processes: one RNG state each
        ((), (), []),  # every part there
    ],
    ids=["no-rng-state", "model-only", "per-process-rng-states", "complete"],
)
def test_a_checkpoint_without_its_rng_state_is_incomplete_and_skipped(tmp_path, caplog, drop, add, missing):
    """A resume restores the RNG state (the sampling of the completions after it): a checkpoint without one is not
    resumed from, the one before it is."""
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoint-2", step=2)
    newer = fake_checkpoint(run / "checkpoint-4", drop=drop, step=4)
    for name in add:
        torch.save({}, newer / name)
    assert runs.missing_parts(newer) == missing
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        chosen = resolved(["--output_dir", str(run), "--resume_from_checkpoint", "latest"])
    assert chosen.resume_from_checkpoint == str(run / ("checkpoint-2" if missing else "checkpoint-4"))
    skipped = f"Skipping {newer}: incomplete, without {', '.join(missing)}"
    assert (skipped in caplog.text) == bool(missing)


@pytest.mark.parametrize(
    ("step", "said"),
    [("abc", "'abc'"), (None, "None"), (2.5, "2.5"), (-3, "-3"), (True, "True")],
)
def test_a_checkpoint_whose_state_has_no_step_count_is_damaged_and_skipped(tmp_path, caplog, step, said):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoint-2", step=2)
    (fake_checkpoint(run / "checkpoint-4") / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        chosen = resolved(["--output_dir", str(run), "--resume_from_checkpoint", "latest"])
    assert chosen.resume_from_checkpoint == str(run / "checkpoint-2")
    damaged = f"trainer_state.json (damaged: global_step {said} is not a step count)"
    assert f"Skipping {run / 'checkpoint-4'}: incomplete, without {damaged}" in caplog.text
    message = refused(["--output_dir", str(run), "--resume_from_checkpoint", str(run / "checkpoint-4")])
    assert f"checkpoint-4: incomplete, without {damaged}; the newest complete one is {run / 'checkpoint-2'}" in message


def test_a_checkpoint_whose_state_has_no_epoch_count_is_damaged(tmp_path):
    (fake_checkpoint(tmp_path / "checkpoint-2") / "trainer_state.json").write_text('{"global_step": 2, "epoch": "x"}')
    assert runs.missing_parts(tmp_path / "checkpoint-2") == [
        "trainer_state.json (damaged: epoch 'x' is not a number of epochs)"
    ]


def test_resuming_with_settings_the_run_did_not_start_with_is_refused(tmp_path, caplog):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoint-2")
    chosen = resolved(["--output_dir", str(run), "--resume_from_checkpoint", "latest"])
    settings = {"training": {"learning_rate": 5e-6, "num_generations": 16, "lora_target_modules": None}}
    shuffled = sorted(TARGETS)  # the same modules in another order: no change
    settings["model"] = {"model_name_or_path": chosen.model_name_or_path, "lora_target_modules": shuffled}
    (run / "run_record.json").write_text(json.dumps({"settings": settings}))
    assert resolved(["--output_dir", str(run), "--resume_from_checkpoint", "latest"]).resume_from_checkpoint
    message = refused(
        [
            "--output_dir",
            str(run),
            "--resume_from_checkpoint",
            "latest",
            "--learning_rate",
            "1e-5",
            "--num_generations",
            "8",
        ]
    )
    assert "Resuming " + str(run / "checkpoint-2") + " with settings its run did not start with:" in message
    assert "  - learning_rate: 5e-06 -> 1e-05\n  - num_generations: 16 -> 8" in message
    assert "resume anyway: --allow_changed_settings true" in message
    argv = ["--output_dir", str(run), "--resume_from_checkpoint", "latest", "--learning_rate", "1e-5"]
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        assert resolved([*argv, "--allow_changed_settings", "true"]).learning_rate == 1e-5
    assert "learning_rate: 5e-06 -> 1e-05" in caplog.text


def test_a_checkpoint_copied_without_its_run_record_is_compared_with_the_settings_it_holds(tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "copied" / "checkpoint-2", step=2)  # no run_record.json beside it
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "train_batch_size": 16}))
    torch.save({"base_lrs": [5e-6], "last_epoch": 2}, checkpoint / "scheduler.pt")
    groups = [{"lr": 4e-6, "betas": (0.9, 0.99), "weight_decay": w, "params": [i]} for i, w in enumerate((0.1, 0.0))]
    torch.save({"state": {}, "param_groups": groups}, checkpoint / "optimizer.pt")
    argv = ["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", str(checkpoint)]
    assert resolved(argv).resume_from_checkpoint == str(checkpoint)  # the recipe's settings: those it holds
    message = refused([*argv, "--learning_rate", "1e-3", "--adam_beta2", "0.999", "--per_device_train_batch_size", "8"])
    assert message.startswith(
        f"Resuming {checkpoint} with settings its run did not start with (as the checkpoint's optimizer, scheduler "
        "and trainer state hold them):\n  - learning_rate: 5e-06 -> 0.001\n  - adam_beta2: 0.99 -> 0.999\n"
        "  - per_device_train_batch_size: 16 -> 8\n"
    )


def test_a_checkpoint_of_another_model_is_refused_before_its_optimizer_state_loads(tmp_path):
    def trained(model):
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        return optimizer.state_dict()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    torch.save(trained(model), checkpoint / "optimizer.pt")
    runs.same_parameters(model, checkpoint)  # its own: fine
    other = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2))
    with pytest.raises(RecipeError) as stop:
        runs.same_parameters(other, checkpoint)
    assert str(stop.value) == (
        f"{checkpoint}: its optimizer state is for 4 weight tensors (23 parameters), and this run trains 4 (37): the "
        "checkpoint is of another model or adapter. Resume it with the model and adapter settings it trained with, "
        "or start a new run (another --output_dir)"
    )
    with pytest.raises(RecipeError, match="optimizer state is for 4 weight tensors .* this run trains 2 "):
        runs.same_parameters(torch.nn.Sequential(torch.nn.Linear(4, 2)), checkpoint)


def test_resuming_a_finished_run_trains_nothing(tmp_path, caplog):
    from safetensors.torch import save_file

    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoint-4", step=4)
    argv = ["--output_dir", str(run), "--resume_from_checkpoint", "latest", "--max_steps", "4"]
    # Stopped in its final evaluation, or before its model was saved: the resume finishes it.
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        assert resolved(argv).resume_from_checkpoint == str(run / "checkpoint-4")
    assert f"{run / 'checkpoint-4'} is the run's last step, and the run has no final model: finishing it" in caplog.text
    save_file({"w": torch.zeros(4)}, run / "model.safetensors")
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 4}))  # written after the model
    (run / "run_record.json").write_text(json.dumps({"settings": {}}))
    message = refused(argv)
    assert "checkpoint-4 is at step 4, and this run ends at max_steps=4: nothing to train" in message
    weights = (run / "model.safetensors").read_bytes()
    (run / "model.safetensors").write_bytes(weights[:-5])  # its save cut short: not finished
    assert resolved(argv).resume_from_checkpoint == str(run / "checkpoint-4")


def test_resuming_another_folders_checkpoint_compares_with_that_run(tmp_path):
    fake_checkpoint(tmp_path / "old" / "checkpoint-2", step=2)
    record = {"settings": {"training": {"learning_rate": 5e-6}}}
    (tmp_path / "old" / "run_record.json").write_text(json.dumps(record))
    argv = ["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", str(tmp_path / "old" / "checkpoint-2")]
    assert "learning_rate: 5e-06 -> 0.001" in refused([*argv, "--learning_rate", "1e-3"])


@pytest.mark.parametrize(
    "held",
    [
        ("checkpoint-4",),  # another run's checkpoint
        ("run_record.json",),  # another run, its checkpoints rotated away
        ("model.safetensors", "config.json"),  # a finished run's model
    ],
)
def test_resuming_another_folders_checkpoint_never_writes_over_the_run_in_the_output_folder(tmp_path, held):
    old = fake_checkpoint(tmp_path / "old" / "checkpoint-2", step=2)
    for name in held:
        if name.startswith("checkpoint-"):
            fake_checkpoint(tmp_path / "other" / name, step=4)
        else:
            (tmp_path / "other").mkdir(exist_ok=True)
            (tmp_path / "other" / name).write_text("{}")
    message = refused(["--output_dir", str(tmp_path / "other"), "--resume_from_checkpoint", str(old)])
    assert f"output_dir={tmp_path / 'other'} holds another run ({held[0]}" in message
    assert f"--output_dir {tmp_path / 'old'}" in message  # where it resumes
    # into an empty folder, or its own, it goes on
    for folder in (tmp_path / "empty", tmp_path / "old"):
        assert resolved(["--output_dir", str(folder), "--resume_from_checkpoint", str(old)]).resume_from_checkpoint


def test_a_run_continued_into_a_new_folder_and_stopped_before_its_first_save_goes_on_from_the_same_checkpoint(tmp_path):
    old = fake_checkpoint(tmp_path / "old" / "checkpoint-2", step=2)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "run_record.json").write_text(json.dumps({"continues": str(old)}))  # written at its start
    again = resolved(["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", str(old)])
    assert again.resume_from_checkpoint == str(old)  # the same command: not refused as another run's folder
    latest = resolved(["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", "latest"])
    assert latest.resume_from_checkpoint == str(old)  # the printed command (and a requeue): not a fresh start
    other = fake_checkpoint(tmp_path / "other" / "checkpoint-3", step=3)
    assert "holds another run" in refused(
        ["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", str(other)]
    )


def test_a_folder_with_checkpoints_is_never_overwritten_silently(tmp_path):
    fake_checkpoint(tmp_path / "run" / "checkpoint-300")
    message = refused(["--output_dir", str(tmp_path / "run")])
    assert "already holds checkpoint-300: resume it (python " in message  # this command, resuming from latest
    assert " --resume_from_checkpoint latest), or start a new run" in message
    assert "or start a new run with another --output_dir" in message
    chosen = resolved(["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", "latest"])
    assert chosen.resume_from_checkpoint == str(tmp_path / "run" / "checkpoint-300")  # the newest, found


# ----------------------------------------------------------------------------------------------------------------
# LoRA, QLoRA, vLLM and several processes


def test_use_peft_turns_on_the_references_lora():
    from trl import get_peft_config, get_quantization_config

    _, _, model_args = grpo_demo.parse_settings(["--use_peft"])
    lora = get_peft_config(model_args)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, set(lora.target_modules)) == (16, 64, 0.05, TARGETS)
    assert get_quantization_config(model_args) is None  # plain LoRA: the base stays in full precision
    _, _, model_args = grpo_demo.parse_settings([])
    assert get_peft_config(model_args) is None  # full fine-tuning unless asked


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load_in_4bit"], "load_in_4bit: a quantized base model cannot be trained itself, only adapters on it: "),
        (
            ["--use_peft", "--load_in_4bit"],
            "load_in_4bit needs a CUDA GPU (bitsandbytes' quantized kernels) and this machine has none: "
            "drop --load_in_4bit and train LoRA in full precision with --use_peft alone",
        ),
        (["--use_peft", "--load_in_8bit"], "load_in_8bit needs a CUDA GPU"),
        (["--use_peft", "--load_in_4bit", "--load_in_8bit"], "load_in_4bit and load_in_8bit are both set: choose one"),
    ],
)
def test_quantization_this_machine_cannot_run_is_named(monkeypatch, args, message):
    monkeypatch.setattr(checks, "cuda_available", lambda: False)
    assert message in refused(args)


def test_both_quantizations_at_once_are_one_problem(monkeypatch):
    monkeypatch.setattr(checks, "cuda_available", lambda: False)
    message = refused(["--use_peft", "--load_in_4bit", "--load_in_8bit"])
    assert (
        message
        == "Invalid settings:\n  - load_in_4bit and load_in_8bit are both set: choose one (--load_in_4bit is QLoRA)"
    )


def test_a_bitsandbytes_optimizer_without_bitsandbytes_names_the_gpu_requirements(gpu_extras):
    del gpu_extras["bitsandbytes"]
    assert (
        "optim=paged_adamw_8bit needs bitsandbytes, which is not installed: pip install -r requirements-gpu.txt "
        "(or --optim adamw_torch)" in refused(["--optim", "paged_adamw_8bit"])
    )


def test_qlora_without_bitsandbytes_names_the_gpu_requirements(gpu_extras):
    del gpu_extras["bitsandbytes"]
    assert "needs bitsandbytes, which is not installed: pip install -r requirements-gpu.txt" in refused(
        ["--use_peft", "--load_in_4bit"]
    )


def test_qlora_under_zero3_needs_a_float_storage_dtype(gpu_extras, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    assert "add --bnb_4bit_quant_storage bfloat16" in refused(["--use_peft", "--load_in_4bit"])
    assert resolved(["--use_peft", "--load_in_4bit", "--bnb_4bit_quant_storage", "bfloat16"]).load_in_4bit


def test_qlora_with_vllm_is_refused_with_the_alternatives(gpu_extras):
    message = refused(["--use_peft", "--load_in_4bit", "--use_vllm"])
    assert "load_in_4bit with use_vllm: every weight sync would merge the adapter into the quantized base" in message
    assert "drop --use_vllm (generate with transformers), or drop --load_in_4bit" in message
    assert resolved(["--use_peft", "--use_vllm"]).use_vllm  # LoRA on the bf16 base with vLLM is fine


@pytest.mark.parametrize(
    "extra",
    [[], ["--use_peft", "--dtype", "bfloat16"], ["--bf16", "false", "--fp16", "true"]],
    ids=["fp32 weights", "fp32 adapters", "fp32 weights, fp16"],
)
def test_continuous_batching_that_would_cast_fp32_weights_to_half_is_refused(gpu_extras, extra):
    message = refused(["--use_transformers_continuous_batching", "true", *extra])
    assert "in place before each such generation, which would drop this run's fp32 weights" in message


def test_continuous_batching_on_bf16_weights_is_allowed(gpu_extras):
    chosen = resolved(["--use_transformers_continuous_batching", "true", "--dtype", "bfloat16"])
    assert (chosen.use_transformers_continuous_batching, chosen.dtype) == (True, "bfloat16")  # nothing to lose


def test_fp16_on_a_gpu_replaces_the_bf16_default(fake_cuda):
    chosen = resolved(["--fp16", "true"])
    assert (chosen.fp16, chosen.bf16) == (True, False)
    assert models.weights_dtype(chosen, chosen) == "float32"  # fp32 weights, fp16 autocast


def test_a_gpu_without_native_bf16_computes_in_fp32_and_says_so(fake_cuda, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        chosen = resolved([])
    assert (chosen.bf16, chosen.fp16) == (False, False)
    assert "no native bf16: training computes in fp32 (slow); --fp16 true" in caplog.text


def test_use_vllm_on_a_machine_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(checks, "installed_version", {"vllm": "0.30.0"}.get)
    monkeypatch.setattr(checks, "cuda_available", lambda: False)
    assert "use_vllm needs a CUDA GPU and this machine has none: drop --use_vllm" in refused(["--use_vllm"])


def test_use_vllm_without_vllm_names_the_gpu_requirements(monkeypatch):
    monkeypatch.setattr(checks, "installed_version", lambda package: None)
    assert "use_vllm: vllm is not installed: pip install -r requirements-gpu.txt" in refused(["--use_vllm"])


@pytest.mark.parametrize(
    ("args", "vllm", "message"),
    [
        (["--use_vllm"], "0.33.0", "use_vllm: vllm 0.33.0 is installed, TRL 1.16 works with 0.22.0 to 0.31.0"),
        (["--use_vllm", "--vllm_mode", "remote"], "0.30.0", "vllm_mode=remote: 'colocate'"),
        (["--use_vllm", "--vllm_gpu_memory_utilization", "1.5"], "0.30.0", "vllm_gpu_memory_utilization=1.5"),
    ],
)
def test_vllm_settings_that_cannot_work_are_named(gpu_extras, args, vllm, message):
    gpu_extras["vllm"] = vllm
    assert message in refused(args)


def test_evaluation_only_and_ask_under_several_processes(gpu_extras, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    ask = refused(["--ask", "How many?", "--per_device_train_batch_size", "4"])
    assert "ask answers one question in one process: start it with python, not accelerate launch" in ask
    vllm = refused(["--eval_only", "--use_vllm", "--per_device_train_batch_size", "4"])
    assert "eval_only with use_vllm runs one vLLM engine, in one process: start it with python" in vllm
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    zero3 = refused(["--eval_only", "--per_device_train_batch_size", "4"])
    assert "eval_only under DeepSpeed ZeRO-3 would shard the weights it only reads" in zero3
    assert "--config_file configs/ddp.yaml" in zero3
    # Training under ZeRO-3 keeps its evaluations: they run collectively on every process.
    assert resolved(["--per_device_train_batch_size", "4"]).eval_every_steps == 50


def test_the_recipe_yamls_are_valid_settings_on_a_gpu_box(gpu_extras):
    chosen = resolved(["--config", str(ROOT / "configs" / "qwen_lora_vllm.yaml")])
    assert (chosen.use_vllm, chosen.vllm_mode, chosen.use_peft) == (True, "colocate", True)
    assert chosen.vllm_max_model_length == grpo_demo.MAX_PROMPT_TOKENS + chosen.max_completion_length
    chosen = resolved(["--config", str(ROOT / "configs" / "qwen_qlora.yaml")])
    assert (chosen.use_peft, chosen.load_in_4bit, chosen.dtype, chosen.use_vllm) == (True, True, "bfloat16", False)


# ----------------------------------------------------------------------------------------------------------------
# Attention: flash-attention where it runs, else sdpa with one warning


def test_cpu_runs_sdpa_in_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, args, model_args = grpo_demo.parse_settings([])
    assert (args.bf16, args.use_cpu, model_args.attn_implementation) == (False, True, "sdpa")
    assert models.weights_dtype(model_args, args) == "float32"


def test_cuda_with_flash_attn_runs_flash_attention(fake_cuda, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        assert resolved([]).attn_implementation == "flash_attention_2"
    assert "sdpa" not in caplog.text


@pytest.mark.parametrize(
    ("setup", "argv", "reason"),
    [
        ("old gpu", [], "this GPU has compute capability 7.5 and it needs 8.0 or newer"),
        ("broken wheel", [], "flash_attn does not import (ModuleNotFoundError: "),
        ("not installed", [], "flash-attn is not installed: using sdpa attention"),
        ("fp32 compute", ["--bf16", "false"], "it computes in bf16 or fp16 only"),
        ("asked on cpu", ["--use_cpu", "true", "--attn_implementation", "flash_attention_2"], "needs a CUDA GPU"),
    ],
)
def test_flash_attention_where_it_cannot_run_falls_back_to_sdpa_with_one_warning(
    fake_cuda, monkeypatch, caplog, setup, argv, reason
):
    import importlib.util

    if setup == "old gpu":
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    elif setup == "broken wheel":  # installed (found), but `import flash_attn` raises ImportError
        monkeypatch.setitem(sys.modules, "flash_attn", None)
    elif setup == "not installed":
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        assert resolved(argv).attn_implementation == "sdpa"
    warnings = [r.getMessage() for r in caplog.records if "attention" in r.getMessage()]
    assert len(warnings) == 1 and reason in warnings[0], warnings


def test_an_attention_the_user_names_is_kept(fake_cuda):
    assert resolved(["--attn_implementation", "eager"]).attn_implementation == "eager"


# ----------------------------------------------------------------------------------------------------------------
# Configs and pins


@pytest.mark.parametrize(
    ("name", "distributed_type", "zero_stage", "mixed_precision"),
    [
        ("ddp.yaml", "MULTI_GPU", None, "bf16"),
        ("zero2.yaml", "DEEPSPEED", 2, "bf16"),
        ("zero3.yaml", "DEEPSPEED", 3, "bf16"),
        ("cpu_ddp.yaml", "MULTI_GPU", None, "no"),
    ],
)
def test_accelerate_configs_load_as_documented(name, distributed_type, zero_stage, mixed_precision):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / name))
    assert (config.distributed_type, config.mixed_precision) == (distributed_type, mixed_precision)
    assert (config.deepspeed_config or {}).get("zero_stage") == zero_stage
    if zero_stage == 3:
        assert config.deepspeed_config["zero3_save_16bit_model"]  # the saved model loads without DeepSpeed


def test_gpu_requirements_pin_versions_these_checks_accept():
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements-gpu.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert {"flash-attn", "vllm", "bitsandbytes", "deepspeed"} <= pins.keys()
    low, high = (tuple(map(int, v.split("."))) for v in checks.VLLM_RANGE)
    assert low <= tuple(map(int, pins["vllm"].split("."))) <= high


def test_the_readme_test_commands_are_what_ci_runs():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    command = re.search(r"pip install -r requirements-dev.txt && (python -m pytest -q)\n", readme)
    assert command and command[1] in ci
    assert 'python -m pytest -q -m "not slow"' in readme  # the fast tier, documented
    assert Path(ROOT / "requirements-dev.txt").read_text().startswith("-r requirements.txt")


# ----------------------------------------------------------------------------------------------------------------
# Before the weights load: what the model's config tells


def test_lora_targets_the_model_lacks_are_named_before_it_loads(tiny_dir, monkeypatch):
    from transformers import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", lambda *a, **k: pytest.fail("the weights loaded"))
    _, args, model_args = grpo_demo.parse_settings(
        ["--model_name_or_path", str(tiny_dir), "--use_peft", "--lora_target_modules", "q_proj", "query_key_value"]
    )
    with pytest.raises(RecipeError) as stop:
        checks.model_and_disk(model_args, args)
    assert f"lora_target_modules: {tiny_dir} has no ['query_key_value']; its linear layers are [" in str(stop.value)
    assert "'q_proj'" in str(stop.value)


def test_a_disk_without_room_for_a_checkpoint_is_named(tiny_dir, monkeypatch):
    import shutil

    _, args, model_args = grpo_demo.parse_settings(["--model_name_or_path", str(tiny_dir)])
    checks.model_and_disk(model_args, args)  # plenty of room here
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(
        RecipeError, match=r"0.0 MiB free, and one checkpoint of this run takes about \d+\.\d MiB: free some space"
    ):
        checks.model_and_disk(model_args, args)


def test_a_null_in_a_config_files_env_leaves_the_variable_as_the_shell_has_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_TAGS", "from-the-shell")
    (tmp_path / "c.yaml").write_text("env:\n  WANDB_TAGS: null\n")
    settings.read_config(["--config", str(tmp_path / "c.yaml")])
    assert os.environ["WANDB_TAGS"] == "from-the-shell"  # not the text "None"


def test_every_readme_section_the_files_point_to_exists():
    """`README "On a GPU"` in requirements-gpu.txt, `README, "GPU memory"` in the recipe...: each names a heading."""
    headings = [
        line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("#")
    ]
    files = [
        ROOT / "grpo_demo.py",
        *ROOT.glob("requirements*.txt"),
        *ROOT.glob("configs/*.yaml"),
        *ROOT.glob("grpo_kit/*.py"),
    ]
    pointer = re.compile(r'README(?:\.md)?(?:,|:|\'s)? "([^"]+)"')
    pointers = [(path.name, name) for path in files for name in pointer.findall(path.read_text(encoding="utf-8"))]
    assert ("requirements-gpu.txt", "On a GPU") in pointers
    for where, name in pointers:
        assert any(name in heading for heading in headings), f'{where}: README "{name}" is no heading'
    for link in re.findall(r"\]\((docs/[^)#]+)\)", (ROOT / "README.md").read_text()):
        assert (ROOT / link).is_file(), link


def test_an_accelerate_config_given_as_the_recipes_is_named_with_the_launch_that_takes_it():
    message = refused(["--config", str(ROOT / "configs" / "zero3.yaml"), "--smoke"])
    assert message == (
        f"{ROOT / 'configs' / 'zero3.yaml'} is an accelerate config (how processes launch), not the recipe's settings: "
        f"accelerate launch --config_file {ROOT / 'configs' / 'zero3.yaml'} {Path(sys.argv[0]).name} --smoke"
    )


def test_the_help_says_the_generation_batch_not_the_micro_batch_divides_by_num_generations(capsys):
    with pytest.raises(SystemExit):
        grpo_demo.parse_settings(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "micro-step (x gradient_accumulation_steps x processes: a multiple of num_generations)" in shown
    resolved(["--num_generations", "16", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"])


def test_a_bad_boolean_is_named_in_one_sentence():
    message = refused(["--smoke", "--memory_plan", "maybe"])
    assert message.startswith("Invalid setting: argument --memory_plan/--memory-plan: Truthy value expected: got maybe")
    assert "(case insensitive). python " in message and ".." not in message


def test_training_past_the_models_positions_is_refused_before_it_loads(tiny_dir):
    limit = json.loads((tiny_dir / "config.json").read_text())["max_position_embeddings"]
    longest = 40  # tokens of the longest prompt
    _, args, model_args = grpo_demo.parse_settings(
        ["--model_name_or_path", str(tiny_dir), "--max_completion_length", str(limit - longest + 1)]
    )
    with pytest.raises(RecipeError, match=f"has {limit} positions, and the longest prompt \\({longest} tokens\\)"):
        checks.model_and_disk(model_args, args, prompt_tokens=256, longest_prompt=lambda: longest)
    args.max_completion_length = limit - longest  # the last position: fits
    checks.model_and_disk(model_args, args, prompt_tokens=256, longest_prompt=lambda: longest)


def test_a_copied_checkpoints_batch_is_its_own_on_a_box_of_many_gpus(tmp_path, monkeypatch):
    """The recipe's Trainer counts one GPU per process (models.one_gpu), so a checkpoint's train_batch_size is the
    per-device batch it trained with, however many GPUs the box has."""
    checkpoint = fake_checkpoint(tmp_path / "run" / "checkpoint-2", step=2)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "train_batch_size": 16}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert runs.checkpoint_settings(checkpoint)["per_device_train_batch_size"] == 16


def test_a_hub_token_given_on_the_command_line_reaches_no_file(monkeypatch, tmp_path):
    token = "hf_" + "x" * 30
    monkeypatch.setenv("HF_TOKEN", "placeholder")
    monkeypatch.delenv("HF_TOKEN")  # restored to what it was at the end
    monkeypatch.setattr(sys, "argv", ["grpo_demo.py", "--hub_token", token, "--output_dir", str(tmp_path / "o")])
    _, args, _ = grpo_demo.parse_settings()
    assert args.hub_token is None  # the Trainer pickles its arguments into training_args.bin
    assert os.environ["HF_TOKEN"] == token  # where huggingface_hub reads it for a push
    assert token not in " ".join(sys.argv)  # what wandb records, and every printed command
    assert token not in refused(["--hub_tokn", token])  # a misspelt name's value, in the message


def test_the_recipe_refuses_a_reward_without_its_role(monkeypatch):
    """REWARD_ROLES is checked with the settings, before anything loads (the checks' table: test_rewards.py)."""
    roles = {name: role for name, role in grpo_demo.REWARD_ROLES.items() if name != "int_reward_func"}
    monkeypatch.setattr(grpo_demo, "REWARD_ROLES", roles)
    with pytest.raises(RecipeError, match="REWARD_ROLES has no line for int_reward_func"):
        grpo_demo.parse_settings(["--smoke"])
