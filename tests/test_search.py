"""The reward-weight search (`python -m grpo_kit.search`): an Optuna study whose trials are runs of the recipe, scored
on validation rows held out of train; failed trials recorded, the study stopped and continued from its storage,
several workers on one SQLite study, the best settings a file `--config` takes, and Optuna optional.

The fast tests run a stand-in recipe (the real rewards, a "run" that writes its evaluation at once); the slow ones
the recipe itself on the smoke preset."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import sqlalchemy.exc
from conftest import ROOT, offline_env

import grpo_demo
from grpo_kit import search, settings

try:
    import optuna  # pinned in requirements-dev.txt; the recipe runs without it
except ImportError:
    optuna = None
needs_optuna = pytest.mark.skipif(optuna is None, reason="optuna is not installed: pip install -r requirements-dev.txt")

FAKE_RECIPE = '''"""A stand-in recipe: the real rewards, and a run that writes the evaluation a real run writes, at
once. Its validation accuracy is highest where the correctness weight is 1.5; the run of trial FAIL_TRIAL fails;
SUMMARY_SPLIT, when set, is the split its evaluation says it measured."""
import json
import os
import sys
from pathlib import Path

if __name__ != "__main__":  # imported by the search for its rewards' names; run as a trial, it needs none
    from grpo_demo import REWARD_FUNCS  # noqa: F401

if __name__ == "__main__":
    argv = sys.argv[1:]

    def last(name, count=1):  # the last occurrence wins, as on the recipe's command line
        i = len(argv) - 1 - argv[::-1].index(name)
        return argv[i + 1 : i + 1 + count]

    out = Path(last("--output_dir")[0])
    if out.name == os.environ.get("FAIL_TRIAL"):
        sys.exit("a run that fails")
    weights = [float(w) for w in last("--reward_weights", 5)]
    for name, accuracy in (("baseline", 0.1), ("final", round(1 - abs(weights[4] - 1.5) / 2, 4))):
        (out / "eval" / name).mkdir(parents=True)
        split = os.environ.get("SUMMARY_SPLIT") or last("--eval_split")[0]
        summary = {"split": split, "accuracy_strict": accuracy, "interval_strict": [0.0, 1.0]}
        summary["n"] = int(last("--validation_rows")[0])
        (out / "eval" / name / "summary.json").write_text(json.dumps(summary))
'''


@pytest.fixture
def fake_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the stand-in imports the recipe's rewards
    path = tmp_path / "fake_recipe.py"
    path.write_text(FAKE_RECIPE)
    return path


def load(folder, name: str = "reward-weights"):
    """The study as another process sees it: waiting, as the search's own workers do, while a writer holds the file."""
    url = f"sqlite:///{folder.resolve() / 'study.db'}"
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.load_study(study_name=name, storage=storage)


def search_args(recipe, folder, trials: int, *extra: str) -> list[str]:
    return [
        "--trials",
        str(trials),
        "--recipe",
        str(recipe),
        "--folder",
        str(folder),
        "--validation_rows",
        "16",
        *extra,
    ]


def test_without_optuna_the_search_says_how_to_install_it(fake_recipe, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, fake_recipe.parent / "study", 2, "--", "--smoke"))
    assert "needs Optuna, an optional dependency of this recipe: pip install optuna==5.0.0" in str(stop.value)
    pins = (ROOT / "requirements-dev.txt").read_text()
    assert "optuna==5.0.0" in pins and "optuna" not in (ROOT / "requirements.txt").read_text()


@needs_optuna
def test_a_study_records_failed_trials_and_writes_the_best_settings_a_run_takes(fake_recipe, capsys, monkeypatch):
    folder = fake_recipe.parent / "study"
    monkeypatch.setenv("FAIL_TRIAL", "trial-0002")
    search.main(
        search_args(
            fake_recipe, folder, 5, "--sampler_seed", "0", "--", "--smoke", "--max_steps", "1", "--warmup_steps", "0"
        )
    )
    study = load(folder)
    trials = study.trials
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert trials[0].user_attrs["default_weights"] and trials[0].user_attrs["settings"]["reward_weights"] == [1.0] * 5
    # A failed run is recorded, with the end of its log, and the study goes on.
    assert trials[2].state.name == "FAIL" and "a run that fails" in trials[2].user_attrs["error"]
    assert all(t.state.name == "COMPLETE" for t in trials if t.number != 2)
    for t in trials:  # each trial's log and settings kept beside its run folder
        record = json.loads((folder / f"trial-{t.number:04d}.json").read_text())
        assert record["settings"] == t.user_attrs["settings"] and (folder / f"trial-{t.number:04d}.log").is_file()
        command = record["command"]
        assert command[command.index("--eval_split") + 1 :][:1] == ["validation"]  # scored on validation, not test
    # The best settings: a file the recipe's --config takes, with the recipe settings every trial ran with.
    best = study.best_trial
    assert best.value == max(t.value for t in trials if t.value is not None)
    chosen = settings.resolve(
        ["--config", str(folder / "best.yaml")], grpo_demo.recipe_defaults(), grpo_demo.REWARD_FUNCS
    )
    assert chosen["reward_weights"] == best.user_attrs["settings"]["reward_weights"]
    assert (chosen["smoke"], chosen["max_steps"], chosen["validation_rows"], chosen["eval_split"]) == (
        True,
        1,
        16,
        "test",
    )
    assert "the recipe's weights (all 1): 75.0 %" in (folder / "best.yaml").read_text()  # 1 - |1 - 1.5| / 2
    printed = capsys.readouterr().out
    assert "| 2 | fail | - |" in printed and f"Best settings: {folder / 'best.yaml'}" in printed


@needs_optuna
def test_a_trial_whose_evaluation_is_not_of_the_validation_rows_fails(fake_recipe, monkeypatch):
    """A run that exits 0 but leaves an evaluation of another split (here: test) is not scored: the search never
    reads the test split, and a trial it cannot score on validation fails."""
    folder = fake_recipe.parent / "study"
    monkeypatch.setenv("SUMMARY_SPLIT", "test")
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, folder, 1, "--", "--smoke"))
    assert f"No trial of study 'reward-weights' completed: read the trials' logs in {folder}" in str(stop.value)
    (trial,) = load(folder).trials
    assert trial.state.name == "FAIL" and trial.value is None and trial.user_attrs["returncode"] == 0
    assert trial.user_attrs["error"].startswith("no validation evaluation in its folder")
    record = json.loads((folder / "trial-0000.json").read_text())
    assert record["state"] == "failed" and record["error"] == "no validation evaluation in its folder"
    assert "accuracy" not in record
    assert not (folder / "best.yaml").exists()


@pytest.mark.parametrize(("cuda", "recipe_args", "rows"), [(False, ["--demo"], 256), (True, [], 500)])
def test_without_recipe_settings_a_cpu_searches_the_demo_and_a_gpu_box_the_recipe(
    fake_recipe, monkeypatch, cuda, recipe_args, rows
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    args = search.parse_args(["--trials", "3", "--recipe", str(fake_recipe)])
    assert (args.recipe_args, args.validation_rows) == (recipe_args, rows)
    assert args.storage == f"sqlite:///{fake_recipe.parent / 'outputs' / 'search' / 'reward-weights' / 'study.db'}"
    command, out = search.trial_command(args, 7, {"reward_weights": [1.0, 0.5, 0.0, 2.0, 1.25]})
    assert command[command.index("--reward_weights") + 1 :][:5] == ["1.0", "0.5", "0.0", "2.0", "1.25"]
    assert command[-6:-4] == ["--final_eval", "true"] and out == fake_recipe.parent / "outputs" / "search" / (
        "reward-weights/trial-0007"
    )


@pytest.mark.parametrize(
    ("recipe_args", "name"),
    [
        (["--final_eval", "false"], "final_eval"),
        (["--final_eval=false"], "final_eval"),
        (["--smoke", "--eval_split=test"], "eval_split"),
        (["--output_dir", "elsewhere"], "output_dir"),
        # abbreviations: the recipe takes none, so they are unknown settings, said before any trial
        (["--final_ev", "false"], "unknown ['--final_ev', 'false']"),
        (["--smoke", "--eval_spl=test"], "unknown ['--eval_spl=test']"),
    ],
)
def test_the_settings_the_search_sets_are_refused_however_they_are_spelled(fake_recipe, capsys, recipe_args, name):
    with pytest.raises(SystemExit) as stop:
        search.parse_args(["--trials", "3", "--recipe", str(fake_recipe), "--", *recipe_args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert (f"error: the recipe settings after --: {name}" if "unknown" in name else f"error: --{name} is the search's"
            ) in err  # fmt: skip


def test_a_recipe_setting_of_the_wrong_type_names_the_recipes_help(fake_recipe, capsys):
    with pytest.raises(SystemExit):
        search.parse_args(["--trials", "3", "--recipe", str(fake_recipe), "--", "--max_steps", "many"])
    err = capsys.readouterr().err
    assert "error: the recipe settings after --: argument --max_steps" in err
    assert err.rstrip().endswith(f"python {fake_recipe} --help lists them")


def test_the_best_settings_measure_the_test_split_whatever_a_config_file_says(tmp_path, monkeypatch):
    """A --config with `final_eval: false` (the trials ran with true): best.yaml, whose header says its run reports
    the test split, does not carry the false."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("demo: true\nfinal_eval: false\n")
    best = types.SimpleNamespace(user_attrs={"settings": {"reward_weights": [0.5, 1.0, 0.0, 2.0, 1.5]}})
    values = search.best_settings(types.SimpleNamespace(best_trial=best), ["--config", "base.yaml"], 256)
    assert "final_eval" not in values and values["demo"] is True


def test_the_best_settings_merge_a_config_file_under_the_command_line(tmp_path, monkeypatch):
    """Trials run `-- --config base.yaml --max_steps 3`: best.yaml holds the file's settings (its env: too), the
    command line's over them, the best trial's weights, the held-out rows; not a config: inside a config."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("demo: true\nmax_steps: 40\nlearning_rate: 1.0e-4\nenv:\n  WANDB_TAGS: x\n")
    best = types.SimpleNamespace(user_attrs={"settings": {"reward_weights": [0.5, 1.0, 0.0, 2.0, 1.5]}})
    study = types.SimpleNamespace(best_trial=best)
    values = search.best_settings(study, ["--config=base.yaml", "--max_steps", "3", "--use_peft"], 256)
    assert values == {
        "demo": True,
        "max_steps": 3,
        "learning_rate": 1e-4,
        "env": {"WANDB_TAGS": "x"},
        "use_peft": True,
        "reward_weights": [0.5, 1.0, 0.0, 2.0, 1.5],
        "validation_rows": 256,
    }


@needs_optuna
@pytest.mark.filterwarnings("ignore:Heartbeat of storage", "ignore:Argument ``heartbeat")
def test_a_trial_whose_worker_died_is_run_again_with_its_settings(fake_recipe):
    """A worker killed mid-trial (here: a process that has exited) leaves its trial running in the storage: the next
    command fails it and runs its settings again, and counts only the trials that finished."""
    folder = fake_recipe.parent / "study"
    folder.mkdir()
    args = search.parse_args(search_args(fake_recipe, folder, 2, "--", "--smoke"))
    names = search.reward_names(fake_recipe)
    study, _ = search.open_study(args, optuna, names)
    trial = study.ask()  # the recipe's weights, first in the queue
    search.suggest(trial, args, names)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": gone.pid, "started": None})

    search.main(search_args(fake_recipe, folder, 2, "--", "--smoke"))
    trials = load(folder).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert "returncode" not in trials[0].user_attrs  # interrupted, not failed: not one of the 2 finished
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].user_attrs["default_weights"]
    assert trials[1].params == trials[0].params


@needs_optuna
def test_a_study_goes_on_only_with_the_terms_it_started_with(fake_recipe, capsys):
    folder = fake_recipe.parent / "study"
    search.main(search_args(fake_recipe, folder, 1, "--", "--smoke"))
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, folder, 2, "--", "--smoke", "--learning_rate", "1e-3"))
    assert "was started with other terms, so its trials would not compare" in str(stop.value)
    assert "'recipe_args': (['--smoke'], ['--smoke', '--learning_rate', '1e-3'])" in str(stop.value)
    with pytest.raises(SystemExit):
        search.main(search_args(fake_recipe, folder, 2, "--", "--smoke", "--output_dir", "x"))
    assert "--output_dir is the search's to set for each trial" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--weights", "2", "0"], "--weights 2 0: a range LOW HIGH with LOW below HIGH (--weights 0 2?)"),
        (["--weights", "nan", "1"], "--weights nan 1: LOW and HIGH must be finite numbers"),
        (["--learning_rate", "0", "1e-3"], "--learning_rate 0 0.001: above 0 (a log scale) and at most 0.01"),
        (["--learning_rate", "1e-6", "5e6"], "--learning_rate 1e-06 5e+06: above 0 (a log scale) and at most 0.01"),
        (["--temperature", "0", "1"], "--temperature 0 1: at least 0.01"),
        (["--heartbeat", "0"], "--heartbeat 0: at least 1 second between a running trial's heartbeats"),
        (["--validation_rows", "0"], "--validation_rows 0: at least 1 row to score the trials on"),
        (
            ["--storage", "sqlite:///no/such/folder/study.db"],
            "--storage sqlite:///no/such/folder/study.db: no folder no/such/folder for the database: make it, or fix "
            "the path",
        ),
        (["--study", "../../elsewhere"], "--study '../../elsewhere': letters, digits, '.', '_' and '-' only"),
        (["--folder", str(ROOT / "README.md")], f"--folder {ROOT / 'README.md'}: a file is there, not a folder"),
    ],
)
def test_the_searchs_own_arguments_are_checked_before_it_starts(fake_recipe, capsys, given, message):
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, fake_recipe.parent / "study", 2, *given, "--", "--smoke"))
    assert stop.value.code == 2
    assert f"python -m grpo_kit.search: error: {message}" in capsys.readouterr().err
    assert not (fake_recipe.parent / "study").exists()  # nothing started


def test_two_studies_never_share_a_folder(fake_recipe, capsys):
    folder = fake_recipe.parent / "shared"
    folder.mkdir()
    (folder / search.STUDY_FILE).write_text('{"study": "a"}')  # as study a's first command left it
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, folder, 2, "--study", "b", "--", "--smoke"))
    assert stop.value.code == 2
    assert f"--folder {folder} holds study 'a'" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == [search.STUDY_FILE]  # nothing of b's written


@needs_optuna
def test_a_database_whose_driver_is_not_installed_names_the_package(fake_recipe, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if not installed
    url = "postgresql+psycopg://user@localhost/study"
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, fake_recipe.parent / "study", 1, "--storage", url, "--", "--smoke"))
    assert str(stop.value) == f"--storage {url}: needs psycopg, which is not installed: pip install 'psycopg[binary]'"


@needs_optuna
@pytest.mark.filterwarnings("ignore:Heartbeat of storage", "ignore:Argument ``heartbeat")
def test_a_study_no_trial_ran_in_takes_the_terms_of_the_command_that_corrects_its_start(fake_recipe, capsys):
    """A first command that stopped before a run began (its worker gone mid-trial) leaves terms no trial used: the
    corrected command is not refused as other terms, and the stopped trial is not run again."""
    folder = fake_recipe.parent / "study"
    folder.mkdir()
    args = search.parse_args(search_args(fake_recipe, folder, 1, "--weights", "0", "3", "--", "--smoke"))
    study, _ = search.open_study(args, optuna, search.reward_names(fake_recipe))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    study.ask().set_user_attr("worker", {"host": socket.gethostname(), "pid": gone.pid, "started": None})
    search.main(search_args(fake_recipe, folder, 1, "--", "--smoke"))
    assert "has no trial that ran yet: its terms are this command's now" in capsys.readouterr().out
    study = load(folder)
    assert study.user_attrs["terms"]["weights"] == [0.0, 2.0]
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    assert study.trials[1].user_attrs["default_weights"]  # the recipe's weights, first again
    with pytest.raises(SystemExit) as stop:  # once a trial ran, the terms hold
        search.main(search_args(fake_recipe, folder, 2, "--weights", "0", "3", "--", "--smoke"))
    assert "was started with other terms, so its trials would not compare" in str(stop.value)


@needs_optuna
@pytest.mark.parametrize("storage", ["bogus://x", "not a url"])
def test_a_storage_that_cannot_be_opened_is_said_at_once(fake_recipe, storage):
    with pytest.raises(SystemExit) as stop:
        search.main(search_args(fake_recipe, fake_recipe.parent / "study", 1, "--storage", storage, "--", "--smoke"))
    message = str(stop.value)
    assert message.startswith(f"--storage {storage}: ") and message.endswith("(an Optuna URL: sqlite:///study.db)")


# ----------------------------------------------------------------------------------------------------------------
# The recipe itself, on the smoke preset: a trial is a real run


def search_command(folder, trials: int, recipe=ROOT / "grpo_demo.py") -> list[str]:
    args = search_args(
        recipe, folder, trials, "--", "--smoke", "--max_steps", "1", "--warmup_steps", "0", "--report_to", "none"
    )
    return [sys.executable, "-m", "grpo_kit.search", *args]


def wait_for(condition, process, what: str):
    while not condition():
        assert process.poll() is None, f"the search ended before {what}"
        time.sleep(0.2)


@needs_optuna
@pytest.mark.slow
@pytest.mark.long
def test_a_killed_study_continues_from_its_storage_and_its_best_settings_train(tmp_path):
    """Two trials complete, the search is killed (SIGKILL) during the third; the same command continues to three,
    running the killed trial's settings again; every trial trained on the rows the validation split left out."""
    folder = tmp_path / "study"
    process = subprocess.Popen(search_command(folder, 3), cwd=tmp_path, env=offline_env(tmp_path))

    def two_done_and_a_third_training() -> bool:
        if not (folder / "study.db").is_file():
            return False
        try:
            trials = load(folder).trials
        except (KeyError, optuna.exceptions.StorageInternalError, sqlalchemy.exc.IntegrityError):  # being created
            return False
        running = [t for t in trials if t.state.name == "RUNNING" and "output_dir" in t.user_attrs]
        started = running and (Path(running[0].user_attrs["output_dir"]) / "run_record.json").is_file()
        return sum(t.state.name == "COMPLETE" for t in trials) == 2 and bool(started)

    wait_for(two_done_and_a_third_training, process, "two trials completed")
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed = next(t for t in load(folder).trials if t.state.name == "RUNNING")

    resumed = subprocess.run(
        search_command(folder, 3), cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    trials = load(folder).trials
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 3 and trials[killed.number].state.name == "FAIL"
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == killed.number)
    assert retry.state.name == "COMPLETE" and retry.user_attrs["settings"] == killed.user_attrs["settings"]
    assert f"Trial {killed.number} was interrupted with its worker" in resumed.stdout

    # Each trial: a real run, scored on the 16 validation rows, trained on the 48 others, its folder kept.
    import pandas as pd

    from grpo_kit.data import hold_out

    rows = grpo_demo.get_gsm8k_questions("train", str(tmp_path / "outputs" / "smoke-assets" / "gsm8k-generated"))
    validation = set(hold_out(rows, 16)[1]["question"])
    for t in complete:
        out = folder / f"trial-{t.number:04d}"
        summary = json.loads((out / "eval" / "final" / "summary.json").read_text())
        assert (summary["split"], summary["n"], summary["accuracy_strict"]) == ("validation", 16, t.value)
        record = json.loads((out / "run_record.json").read_text())
        assert record["data"]["rows"] == 48
        assert record["settings"]["training"]["reward_weights"] == t.user_attrs["settings"]["reward_weights"]
        table = pd.read_parquet(out / "completions" / "completions_00001.parquet")
        trained_on = {str(p[-1]["content"]) for p in table["prompt"]}
        assert trained_on and not trained_on & validation

    # The best settings file trains, as the recipe's --config, and reports the test split.
    final = subprocess.run(
        [sys.executable, str(ROOT / "grpo_demo.py"), "--config", str(folder / "best.yaml"), "--output_dir", "best"],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    record = json.loads((tmp_path / "best" / "run_record.json").read_text())
    best = load(folder).best_trial.user_attrs["settings"]["reward_weights"]
    assert record["settings"]["training"]["reward_weights"] == best
    assert json.loads((tmp_path / "best" / "eval" / "final" / "summary.json").read_text())["split"] == "test"


WAIT_FOR_TWO = """import os, sys, time
from pathlib import Path

sys.path.insert(0, os.environ["RECIPE_DIR"])
from grpo_demo import REWARD_FUNCS, main  # noqa: F401, E402

if __name__ == "__main__":  # a trial run waits until another worker's trial has started too, then trains
    marks = Path(os.environ["MARKS"])
    (marks / str(os.getpid())).touch()
    while len(list(marks.iterdir())) < 2:
        time.sleep(0.05)
    main()
"""


@needs_optuna
@pytest.mark.slow
@pytest.mark.long  # two searches side by side, ~30 s: run by CI's tier command
def test_two_workers_complete_distinct_trials_of_one_sqlite_study(tmp_path):
    folder, marks = tmp_path / "study", tmp_path / "marks"
    marks.mkdir()
    recipe = tmp_path / "recipe_waiting_for_two.py"
    recipe.write_text(WAIT_FOR_TWO)
    env = offline_env(tmp_path, MARKS=str(marks), RECIPE_DIR=str(ROOT))
    workers = [subprocess.Popen(search_command(folder, 3, recipe), cwd=tmp_path, env=env) for _ in range(2)]
    while any(worker.poll() is None for worker in workers):
        if any(worker.poll() not in (None, 0) for worker in workers):  # one failed: the other would wait for it
            for worker in workers:
                worker.kill()
            pytest.fail(f"a worker failed: exit codes {[worker.wait() for worker in workers]}")
        time.sleep(0.2)
    assert [worker.returncode for worker in workers] == [0, 0]
    complete = [t for t in load(folder).trials if t.state.name == "COMPLETE"]
    assert len(complete) >= 3  # a worker starts a trial while the study holds fewer; two may start the last at once
    assert {t.user_attrs["worker"]["pid"] for t in complete} == {worker.pid for worker in workers}
    assert len({t.user_attrs["output_dir"] for t in complete}) == len(complete)  # a folder each
    assert all((folder / f"trial-{t.number:04d}" / "eval" / "final" / "summary.json").is_file() for t in complete)
    assert sum(bool(t.user_attrs.get("default_weights")) for t in load(folder).trials) == 1  # made once


def test_an_unknown_setting_in_a_config_file_after_the_separator_is_refused_before_any_trial(fake_recipe, capsys):
    (fake_recipe.parent / "typo.yaml").write_text("learnin_rate: 1.0e-6\n")
    with pytest.raises(SystemExit) as stop:
        search.parse_args(["--trials", "3", "--recipe", str(fake_recipe), "--", "--demo", "--config", "typo.yaml"])
    assert stop.value.code == 2
    assert "unknown ['learnin_rate (in typo.yaml)']" in capsys.readouterr().err
