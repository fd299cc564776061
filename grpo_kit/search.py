"""Reward-weight search: an Optuna study whose trials are real runs of the recipe, scored on held-out train rows.

    pip install optuna==5.0.0                           # optional: only the search needs it
    python -m grpo_kit.search --trials 20               # CPU: searches the demo preset; a GPU box: the real recipe
    python -m grpo_kit.search --trials 40 -- --config configs/qwen_lora_vllm.yaml --max_steps 200
    python grpo_demo.py --config outputs/search/reward-weights/best.yaml    # the best settings, measured on test

Each trial runs the recipe (the settings after `--`) in a subprocess, scored on the train rows it holds out; the
study lives in an Optuna storage, which the same command continues or several workers share (README.md,
"Searching the reward weights")."""

import argparse
import ctypes
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import warnings
from contextlib import nullcontext, suppress
from datetime import datetime
from pathlib import Path

import yaml

from grpo_kit import RecipeError, layout, settings
from grpo_kit.layout import read_json
from grpo_kit.runs import alive, public, started_at

OPTUNA_PIN = "optuna==5.0.0"
WEIGHT_PREFIX = "weight/"  # a study's parameters: weight/<reward name>, learning_rate, temperature
# A database driver's module: its pip package
DRIVERS = dict(psycopg="'psycopg[binary]'", psycopg2="psycopg2-binary", pymysql="PyMySQL", MySQLdb="mysqlclient")
# The recipe settings the search sets for each trial
SEARCH_OWN = ("output_dir", "run_name", "reward_weights", "eval_split", "validation_rows", "final_eval")
STUDY_FILE = "study.json"  # in a study's folder: whose trials it holds
FINISHED_ATTR = "returncode"  # set on every trial whose run ended (well or not): the others were interrupted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, recipe_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)
    parser = argparse.ArgumentParser(
        prog="python -m grpo_kit.search",
        description="Search the recipe's reward weights with Optuna; recipe settings for every trial after --.",
    )
    add = parser.add_argument
    add("--study", default="reward-weights", help="the study's name in the storage")
    add("--trials", type=int, required=True, help="finished trials the study should hold")
    add("--folder", type=Path, help="trial folders, logs, best.yaml; default outputs/search/<study>")
    add("--storage", help="an Optuna database URL; default sqlite:///<folder>/study.db")
    add("--weights", nargs=2, type=float, default=[0.0, 2.0], metavar=("LOW", "HIGH"), help="each weight's range")
    add("--learning_rate", nargs=2, type=float, metavar=("LOW", "HIGH"), help="search it (log scale)")
    add("--temperature", nargs=2, type=float, metavar=("LOW", "HIGH"), help="search it too")
    add("--validation_rows", type=int, help="train rows held out to score trials; 256 on --demo, else 500")
    add("--recipe", type=Path, default=Path("grpo_demo.py"), help="the recipe file each trial runs")
    add("--sampler_seed", type=int, help="the sampler's seed (give each worker its own)")
    add("--heartbeat", type=int, default=60, help="seconds between a running trial's heartbeats")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials: at least 1")
    for problem in range_problems(args):
        parser.error(problem)
    if args.heartbeat < 1:
        parser.error(f"--heartbeat {args.heartbeat}: at least 1 second between a running trial's heartbeats")
    if args.validation_rows is not None and args.validation_rows < 1:
        parser.error(f"--validation_rows {args.validation_rows}: at least 1 row to score the trials on")
    if not args.recipe.is_file():
        parser.error(f"--recipe {args.recipe}: no such file")
    if recipe_args is None:
        import torch

        recipe_args = [] if torch.cuda.is_available() else ["--demo"]  # on a CPU, the demo: minutes, not days
    args.recipe_args = recipe_args
    given = recipe_settings(parser, args.recipe, recipe_args)
    if args.validation_rows is None:
        args.validation_rows = 256 if given.get("demo") else 500
    if not re.fullmatch(r"[\w.-]+", args.study) or set(args.study) == {"."}:  # it names a folder, and trials' runs
        parser.error(f"--study {args.study!r}: letters, digits, '.', '_' and '-' only (a folder's name, not a path)")
    args.folder = args.folder or Path("outputs") / "search" / args.study
    if args.folder.exists() and not args.folder.is_dir():
        parser.error(f"--folder {args.folder}: a file is there, not a folder: choose another")
    held = (read_json(args.folder / STUDY_FILE) or {}).get("study")
    if held is not None and held != args.study:  # trial-0000.log, trial-0000/, best.yaml: one study's names
        parser.error(
            f"--folder {args.folder} holds study {held!r}, whose trials and best.yaml study {args.study!r} would write "
            f"over: give it a folder of its own (--folder {args.folder.parent / args.study})"
        )
    args.storage = args.storage or f"sqlite:///{(args.folder / 'study.db').resolve()}"
    if args.storage.startswith("sqlite:///") and args.storage != "sqlite:///:memory:":
        where = Path(args.storage.removeprefix("sqlite:///")).parent
        if where.resolve() != args.folder.resolve() and not where.is_dir():  # the search makes its own folder, no other
            parser.error(f"--storage {args.storage}: no folder {where} for the database: make it, or fix the path")
    return args


def recipe_settings(parser, recipe: Path, recipe_args: list[str]) -> dict:
    """The recipe settings given after `--`, as the recipe reads them: `--final_eval=false` names final_eval too; a
    name it does not know (an abbreviation: the recipe takes none) is refused now, not by every trial; one the search
    sets for each trial is refused."""
    unknown: list[str] = []
    try:
        rest, in_file, config = settings.read_config(recipe_args, apply_env=False)
        given = settings.given_on_command_line(rest, unknown)
        unknown += [
            f"{key} (in {config})" for key in settings.yaml_arguments(settings._parser(config), in_file, config)[2]
        ]
    except RecipeError as err:  # a value of the wrong type: said with the recipe's --help, not the search's
        message = str(err).split(". python ")[0].removeprefix("Invalid setting: ").rstrip(".")
        parser.error(f"the recipe settings after --: {message}; python {recipe} --help lists them")
    if unknown:
        parser.error(f"the recipe settings after --: unknown {public(unknown)}; python {recipe} --help lists them")
    for name in SEARCH_OWN:
        if name in given:
            parser.error(f"--{name} is the search's to set for each trial: leave it out of the recipe settings")
    return given


def range_problems(args) -> list[str]:
    """The searched ranges (LOW HIGH, each given as two numbers): finite, LOW below HIGH, within what the recipe
    takes (a learning rate searched on a log scale, so above 0)."""
    from grpo_kit.checks import MAX_LEARNING_RATE, MIN_TEMPERATURE

    limits = {
        "weights": (-math.inf, math.inf, "each reward's weight"),
        "learning_rate": (0, MAX_LEARNING_RATE, f"above 0 (a log scale) and at most {MAX_LEARNING_RATE:g}"),
        "temperature": (MIN_TEMPERATURE, math.inf, f"at least {MIN_TEMPERATURE:g}"),
    }
    found = []
    for name, (floor, ceiling, rule) in limits.items():
        if (given := getattr(args, name)) is None:
            continue
        low, high = given
        shown = f"--{name} {low:g} {high:g}"
        if not all(math.isfinite(x) for x in given):
            found.append(f"{shown}: LOW and HIGH must be finite numbers")
        elif not low < high:
            found.append(f"{shown}: a range LOW HIGH with LOW below HIGH (--{name} {high:g} {low:g}?)")
        elif not (floor < low if name == "learning_rate" else floor <= low) or not high <= ceiling:
            found.append(f"{shown}: {rule}")
    return found


def reward_names(recipe: Path) -> list[str]:
    """The names of the recipe's rewards, in order, read by importing it in a child process (importing the recipe
    is free of side effects; this package never imports it itself)."""
    code = "import json, runpy, sys\nfuncs = runpy.run_path(sys.argv[1], run_name='recipe')['REWARD_FUNCS']\n"
    code += "print(json.dumps([func.__name__ for func in funcs]))\n"
    path = os.pathsep.join(filter(None, [str(recipe.resolve().parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", code, str(recipe)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RecipeError(f"Could not read the rewards of {recipe} (its REWARD_FUNCS):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def open_study(args, optuna, names: list[str]):
    """(study, storage): the study, created if new (then with the recipe's own weights, all 1, as its first trial),
    or loaded, refusing to go on with other terms (what makes trials comparable) than it started with. The storage
    has heartbeats (a silent worker's trial is failed and run again); SQLite's, a long lock timeout."""
    sampler = optuna.samplers.TPESampler(seed=args.sampler_seed)
    same = ("recipe_args", "validation_rows", "weights", "learning_rate", "temperature")
    own = {"rewards": names, **{name: getattr(args, name) for name in same}}
    engine = {"connect_args": {"timeout": 60}} if args.storage.startswith("sqlite") else {}
    kwargs = {"engine_kwargs": engine, "heartbeat_interval": args.heartbeat, "grace_period": 3 * args.heartbeat}
    # Workers started together on one new SQLite file would otherwise create its tables at the same moment (and one
    # fail): a lock file is held while a worker creates or opens the study. Other databases: the retry below.
    sqlite = args.storage.startswith("sqlite:///")
    with open(args.storage.removeprefix("sqlite:///") + ".lock", "a") if sqlite else nullcontext() as lock:
        if sqlite:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        storage = open_storage(args.storage, optuna, kwargs)
        try:
            study = optuna.create_study(study_name=args.study, storage=storage, sampler=sampler, direction="maximize")
        except optuna.exceptions.DuplicatedStudyError:  # another worker made it, or an earlier run of this command
            study = optuna.load_study(study_name=args.study, storage=storage, sampler=sampler)
        else:
            study.set_user_attr("terms", own)
            enqueue_default(study, names)
    for _ in range(100):  # made on another database by a worker that has not written its terms yet
        if "terms" in study.user_attrs:
            break
        time.sleep(0.1)
    started, own = study.user_attrs.get("terms") or {}, json.loads(json.dumps(own))  # as the storage holds them
    if started != own and not_started(study, optuna):
        # A study no trial ran in yet (its first command stopped before a run began): nothing to compare with.
        print(f"Study {args.study!r} has no trial that ran yet: its terms are this command's now", flush=True)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)  # not run again: of the old terms
            if trial.user_attrs.get("default_weights"):  # the recipe's weights still go first
                enqueue_default(study, names)
        study.set_user_attr("terms", own)
        started = own
    if started != own:
        changed = {key: (started.get(key), value) for key, value in own.items() if started.get(key) != value}
        raise RecipeError(
            f"Study {args.study!r} in {args.storage} was started with other terms, so its trials would not "
            f"compare: {changed} (started with, now). Run it with the same, or name another --study"
        )
    return study, storage


def open_storage(url: str, optuna, kwargs: dict):
    """Optuna's database at `url`, retried while another worker creates its tables; what no retry changes (a driver
    not installed, not a database URL) said at once."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(url, heartbeat_stale_trial_callback=run_again, **kwargs)
        except ImportError as error:  # a database whose driver is not installed (PostgreSQL: psycopg2)
            driver = getattr(error.__cause__, "name", None) or "its database driver"
            package = DRIVERS.get(driver, driver)
            raise RecipeError(
                f"--storage {url}: needs {driver}, which is not installed: pip install {package}"
            ) from None
        except ArgumentError as error:  # not a database URL this machine can open: no retry will change that
            raise RecipeError(f"--storage {url}: {error} (an Optuna URL: sqlite:///study.db)") from None
        except SQLAlchemyError as error:  # another worker creating the tables now: they exist once it is done
            if attempt == 4:
                raise RecipeError(f"--storage {url}: cannot be opened ({error})") from error
            time.sleep(1 + attempt)
    raise AssertionError("unreachable: the last attempt raises")


def enqueue_default(study, names: list[str]) -> None:
    study.enqueue_trial({f"{WEIGHT_PREFIX}{n}": 1.0 for n in names}, user_attrs={"default_weights": True})


def not_started(study, optuna) -> bool:
    """Whether no trial of `study` ran a recipe: none finished one, and none is running with a live worker (on this
    machine; a worker elsewhere counts as live)."""
    for trial in study.get_trials(deepcopy=False):
        if FINISHED_ATTR in trial.user_attrs or trial.state == optuna.trial.TrialState.COMPLETE:
            return False
        worker = trial.user_attrs.get("worker")
        if trial.state == optuna.trial.TrialState.RUNNING and worker is not None and not worker_gone(worker):
            return False
    return True


def worker_gone(worker: dict) -> bool:
    """Whether a trial's worker is a process on this machine that no longer exists."""
    return worker.get("host") == socket.gethostname() and not alive(worker.get("pid", -1), worker.get("started"))


def run_again(study, trial) -> None:
    """A trial interrupted with its worker: the same settings go back in the queue."""
    kept = {key: value for key, value in trial.user_attrs.items() if key == "default_weights"}
    study.enqueue_trial(trial.params, user_attrs={**kept, "retry_of": trial.number})
    print(f"Trial {trial.number} was interrupted with its worker: queued again with the same settings", flush=True)


def reclaim(study, optuna, grace: int) -> None:
    """Fail and queue again the running trials whose worker is gone: on this machine, a process that no longer
    exists (at once); anywhere, a heartbeat older than the grace period (Optuna's stale trials), or no worker named
    that long after the trial began (killed between taking the trial and naming itself)."""
    now = datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if (worker := trial.user_attrs.get("worker")) is None:
            gone = trial.datetime_start is not None and (now - trial.datetime_start).total_seconds() > grace
        else:
            gone = worker_gone(worker)
        if gone:
            try:
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            except (ValueError, RuntimeError):  # finished meanwhile (another worker reclaimed it)
                continue
            run_again(study, trial)
    optuna.storages.fail_stale_trials(study)


def trial_command(args, number: int, values: dict) -> tuple[list[str], Path]:
    out = (args.folder / f"trial-{number:04d}").resolve()
    searched = []
    for key, value in values.items():
        searched += [f"--{key}", *map(str, value if isinstance(value, list) else [value])]
    run = ["--validation_rows", str(args.validation_rows), "--eval_split", "validation", "--final_eval", "true"]
    own = ["--output_dir", str(out), "--run_name", f"{args.study}-trial-{number:04d}"]
    return [sys.executable, str(args.recipe), "--eval_every_steps", "0", *args.recipe_args, *searched, *run, *own], out


def suggest(trial, args, names: list[str]) -> dict:
    """The trial's settings, as the recipe is given them (weights to 0.01, the others to 3 significant digits): the
    values a run and best.yaml read are the ones recorded."""
    values = {"reward_weights": [round(trial.suggest_float(f"{WEIGHT_PREFIX}{n}", *args.weights), 2) for n in names]}
    if args.learning_rate:
        values["learning_rate"] = float(f"{trial.suggest_float('learning_rate', *args.learning_rate, log=True):.3g}")
    if args.temperature:
        values["temperature"] = float(f"{trial.suggest_float('temperature', *args.temperature):.3g}")
    trial.set_user_attr("settings", values)
    return values


def run_trial(args, study, storage, optuna, names: list[str]) -> None:
    trial = study.ask()
    pid = os.getpid()
    trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": pid, "started": started_at(pid)})
    values = suggest(trial, args, names)
    command, out = trial_command(args, trial.number, values)
    trial.set_user_attr("output_dir", str(out))
    log_path = args.folder / f"{out.name}.log"
    print(f"Trial {trial.number}: {shlex.join(command[1:])}", flush=True)
    started = time.perf_counter()
    # Linux: the run is ended (SIGTERM, PR_SET_PDEATHSIG) when the search process dies, even by SIGKILL: no orphan.
    die_with_parent = (lambda: ctypes.CDLL(None).prctl(1, signal.SIGTERM)) if sys.platform == "linux" else None
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        try:
            returncode = None
            while returncode is None:  # the trial's heartbeat, every --heartbeat seconds while its run lasts
                storage.record_heartbeat(trial._trial_id)
                with suppress(subprocess.TimeoutExpired):
                    returncode = process.wait(timeout=args.heartbeat)
        except KeyboardInterrupt:  # Ctrl-C in a terminal reaches the run too: let it stop, queue the trial again
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # the search alone was interrupted
                process.send_signal(signal.SIGINT)
                process.wait()
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            run_again(study, study.trials[trial.number])
            raise
    summary = layout.read_summary(out, "final") or {}
    result = {"number": trial.number, "settings": values, "command": command, "returncode": returncode}
    result |= {"seconds": round(time.perf_counter() - started), "output_dir": str(out), "log": str(log_path)}
    trial.set_user_attr(FINISHED_ATTR, returncode)
    if returncode == 0 and summary.get("split") == "validation":
        baseline = layout.read_summary(out, "baseline") or {}
        scores = {"accuracy": summary["accuracy_strict"], "interval": summary["interval_strict"], "n": summary["n"]}
        scores["baseline_accuracy"] = baseline.get("accuracy_strict")
        for key, value in scores.items():
            trial.set_user_attr(key, value)
        result.update(scores, state="complete")
        study.tell(trial, summary["accuracy_strict"])
        shown = f"{100 * summary['accuracy_strict']:.1f} % on {summary['n']} validation rows"
    else:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        why = f"exit {returncode}" if returncode else "no validation evaluation in its folder"
        trial.set_user_attr("error", f"{why}: " + "\n".join(tail))
        result.update(state="failed", error=why)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        shown = f"failed ({why}): {log_path}"
    (args.folder / f"{out.name}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"Trial {trial.number}: {shown} ({result['seconds']} s)", flush=True)


def best_settings(study, recipe_args: list[str], validation_rows: int) -> dict:
    """The study's best settings file: the recipe settings every trial ran with (a --config's under the command line's),
    the best trial's searched values and the rows held out: a run of it trains as the trials did, measured on test."""
    argv, values, _ = settings.read_config(recipe_args, apply_env=False)
    given = settings.given_on_command_line(argv)
    values.update({key: getattr(value, "value", value) for key, value in given.items() if key != "config"})
    values.update(study.best_trial.user_attrs["settings"])  # reward_weights, and what else was searched
    values["validation_rows"] = validation_rows
    # Each trial's own: a run of the file chooses its own folder, and measures the test split (final_eval, as the
    # trials did: a --config's false would leave the file's run unmeasured)
    for name in ("output_dir", "run_name", "eval_split", "final_eval"):
        values.pop(name, None)
    return values


def write_best(args, study, optuna) -> Path | None:
    if not (complete := study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))):
        return None
    best = study.best_trial
    default = [t for t in complete if t.user_attrs.get("default_weights")]
    interval = ", ".join(f"{100 * x:.1f}" for x in best.user_attrs.get("interval", []))
    lines = [
        f"# The best of {len(complete)} complete trials of study {args.study!r} (storage {args.storage}):",
        f"# trial {best.number}, {100 * best.value:.1f} % [{interval}] strict accuracy on the "
        f"{best.user_attrs.get('n')} validation rows held out of train"
        + (f"; the recipe's weights (all 1): {100 * default[0].value:.1f} %." if default else "."),
        f"# reward_weights: {', '.join(study.user_attrs['terms']['rewards'])}, in that order.",
        "# python grpo_demo.py --config best.yaml trains on the trials' rows and reports the test split",
        "# (without validation_rows it trains on every train row).",
    ]
    values = best_settings(study, args.recipe_args, args.validation_rows)
    lines.append(yaml.safe_dump(values, sort_keys=False, default_flow_style=None))
    (args.folder / "best.yaml").write_text("\n".join(lines), encoding="utf-8")
    return args.folder / "best.yaml"


def report(study) -> None:
    """The study's trials, best first: state, validation accuracy and settings."""
    rows = sorted(study.get_trials(deepcopy=False), key=lambda t: (t.value is None, -(t.value or 0), t.number))
    names = [name.removesuffix("_reward_func") for name in study.user_attrs["terms"]["rewards"]]
    print(f"| trial | state | validation accuracy | {' | '.join(names)} | other settings |")
    print("| --- | --- | --- |" + " --- |" * (len(names) + 1))
    for t in rows:
        values = dict(t.user_attrs.get("settings") or {})
        weights = values.pop("reward_weights", ["-"] * len(names))
        other = ", ".join(f"{key} {value}" for key, value in values.items())
        accuracy = f"{100 * t.value:.1f} %" if t.value is not None else "-"
        tag = " (the recipe's weights)" if t.user_attrs.get("default_weights") else ""
        print(f"| {t.number}{tag} | {t.state.name.lower()} | {accuracy} | {' | '.join(map(str, weights))} | {other} |")


def main(argv: list[str] | None = None) -> None:
    try:
        search(parse_args(argv))
    except RecipeError as err:
        sys.exit(str(err))
    except KeyboardInterrupt:
        sys.exit(130)


def search(args) -> None:
    try:
        import optuna
    except ImportError:
        raise RecipeError(
            f"The reward-weight search needs Optuna, an optional dependency of this recipe: pip install {OPTUNA_PIN} "
            "(or pip install -r requirements-dev.txt). Training, evaluation and the presets work without it."
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are kept here (not by Study.optimize, which cannot run a subprocess per trial and stop on a count of
    # finished trials across workers), with Optuna's own stale-trial check: neither warning applies.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats, since Optuna 2.9
    args.folder.mkdir(parents=True, exist_ok=True)
    (args.folder / STUDY_FILE).write_text(json.dumps({"study": args.study}) + "\n", encoding="utf-8")
    names, states = reward_names(args.recipe), optuna.trial.TrialState
    study, storage = open_study(args, optuna, names)
    try:
        while True:
            reclaim(study, optuna, grace=3 * args.heartbeat)
            # Counted towards --trials: running, complete, or failed on its own (not interrupted with its worker).
            trials = study.get_trials(deepcopy=False, states=(states.RUNNING, states.COMPLETE, states.FAIL))
            if sum(t.state != states.FAIL or FINISHED_ATTR in t.user_attrs for t in trials) >= args.trials:
                break
            run_trial(args, study, storage, optuna, names)
            write_best(args, study, optuna)
    except KeyboardInterrupt:
        print(f"\nStopped (Ctrl-C). The same command goes on with the study: it is in {args.storage}")
        raise
    report(study)
    if (path := write_best(args, study, optuna)) is None:
        raise RecipeError(f"No trial of study {args.study!r} completed: read the trials' logs in {args.folder}")
    print(f"Best settings: {path} (python {args.recipe} --config {path})")


if __name__ == "__main__":
    main()
