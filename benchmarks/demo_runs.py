"""The demo run many times: from several warm-started models (the spread another machine brings), under each
objective preset, with several GRPO seeds. Held-out accuracy before and after with intervals, the paired test, the
health watcher's verdict, and the curves along the way.

    python benchmarks/demo_runs.py --kinds qwen2 llama3 --warm_seeds 42 11 12 --seeds 42 1 2 3 4 --report \
        docs/demo_seeds.json --table                   # the demo's spread: 2 x 15 runs, about 40 min on two cores
    python benchmarks/demo_runs.py --objectives default reference_objective dr_grpo dapo gspo gdpo --seeds 42 43 44 \
        --no_eval_every --report docs/objectives.json --plot docs/objectives.png --table    # the objectives, ~25 min
    python benchmarks/demo_runs.py --seeds 42 --objectives default dapo --workers 1

Each run is `python grpo_demo.py --demo --tiny_model KIND --config configs/<objective>.yaml --seed N` ("default" is
the recipe's own objective, no config) from the start model warm-started with seed W (`demo.warm_started`; 42 is the
preset's own), into `outputs/demo-runs/<kind>-warm<W>-<objective>-seed<N>/`; a finished run is read, not run
again, so a stopped benchmark goes on where it stopped. The problems are the same for every run (measured on the
same 256 held-out problems); the warm-start seed draws the start model's initial weights and batch order, as another
machine's float sums change them, and the seed varies GRPO alone. The demo accumulates 1 micro-step per optimizer
step where the recipe accumulates 4, so the presets that serve 4 optimizer steps from each generation batch (DAPO,
GSPO: steps_per_generation 16 = 4 x 4) get --steps_per_generation 4 here. `--no_eval_every` turns the in-training
evaluations off (the accuracy before and after is what is compared, faster); they are the health watcher's signal.

What it measures is a tiny model (0.35 M parameters) on generated two-number sums, on a CPU: how each setting moves
a small policy that must choose between two ways of answering, not what it does to a 1.5B model on GSM8K.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KINDS = ("qwen2", "llama3")
OBJECTIVES = ("default", "reference_objective", "dr_grpo", "dapo", "gspo", "gdpo")
LABELS = {
    "default": "default (dapo loss)",
    "reference_objective": "reference (TRL 0.14)",
    "dr_grpo": "Dr. GRPO",
    "dapo": "DAPO",
    "gspo": "GSPO",
    "gdpo": "GDPO",
}
OFF_POLICY = {"dapo", "gspo"}  # their presets set steps_per_generation: 4 updates per generation batch
CORRECTNESS = "rewards/correctness_reward_func/mean"
ACCURACY = "eval_accuracy_strict"


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def start_model(kind: str, warm_seed: int, folder: Path) -> Path:
    """The warm-started model of `kind` and seed `warm_seed`, built once in `folder` (a child process, one thread)."""
    out = folder / f"warm-{kind}-{warm_seed}"
    code = (
        "import sys, torch, grpo_demo; from grpo_kit import demo; torch.set_num_threads(1); "
        "demo.warm_started(grpo_demo.ANSWER_FORMAT, sys.argv[1], sys.argv[2], int(sys.argv[3]))"
    )
    done = subprocess.run([sys.executable, "-c", code, kind, str(out), str(warm_seed)], cwd=folder, env=ENV)
    if done.returncode != 0:
        sys.exit(f"The warm start of {kind}, seed {warm_seed}, failed (exit {done.returncode})")
    return out


def command(run: dict, out: Path, model: Path, every: bool) -> list[str]:
    objective = run["objective"]
    args = [
        sys.executable,
        str(ROOT / "grpo_demo.py"),
        "--demo",
        "--tiny_model",
        run["kind"],
        "--seed",
        str(run["seed"]),
    ]
    args += ["--model_name_or_path", str(model), "--output_dir", str(out)]
    if objective != "default":
        args += ["--config", str(ROOT / "configs" / f"{objective}.yaml")]
    if objective in OFF_POLICY:
        args += ["--steps_per_generation", "4"]
    return [*args, "--run_name", out.name, "--report_to", "none", *([] if every else ["--eval_every_steps", "0"])]


def run_one(run: dict, folder: Path, model: Path, every: bool) -> dict:
    """One demo run (or the one already finished there): its numbers."""
    name = f"{run['kind']}-warm{run['warm_seed']}-{run['objective']}-seed{run['seed']}"
    out = folder / name
    comparison = out / "eval" / "comparison.json"
    if not comparison.is_file():
        shutil.rmtree(out, ignore_errors=True)  # a run cut short: start it again
        started = time.perf_counter()
        cwd = folder / "cwd" / name  # its own: the preset writes its problems there, and runs go in parallel
        cwd.mkdir(parents=True, exist_ok=True)
        with (folder / f"{name}.log").open("w") as log:
            done = subprocess.run(command(run, out, model, every), cwd=cwd, env=ENV, stdout=log, stderr=log)
        if done.returncode != 0 or not comparison.is_file():
            sys.exit(f"{name} failed (exit {done.returncode}): see {folder / f'{name}.log'}")
        (out / "seconds.txt").write_text(f"{time.perf_counter() - started:.0f}\n")
    result = json.loads(comparison.read_text())
    before, after, paired = result["baseline"], result["final"], result["paired"]["strict"]
    state = json.loads((out / "trainer_state.json").read_text())
    findings = json.loads((out / "health.json").read_text())["findings"]
    return {
        **run,
        "before": before["accuracy_strict"],
        "before_interval": before["interval_strict"],
        "after": after["accuracy_strict"],
        "after_interval": after["interval_strict"],
        "n": after["n"],
        "format_after": after["format_rate"],
        "tokens_before": before["mean_completion_tokens"],
        "tokens_after": after["mean_completion_tokens"],
        "gained": paired["gained"],
        "lost": paired["lost"],
        "p_value": paired["p_value"],
        "health": [f"{f['check']} at step {f['step']}" for f in findings],
        "correctness": [[e["step"], e[CORRECTNESS]] for e in state["log_history"] if CORRECTNESS in e],
        "accuracy": [[e["step"], e[ACCURACY]] for e in state["log_history"] if ACCURACY in e],
        "seconds": float((out / "seconds.txt").read_text()) if (out / "seconds.txt").is_file() else None,
    }


def pct(value: float, interval=None) -> str:
    shown = f"{100 * value:.1f} %"
    return shown + (f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else "")


def table(results: list[dict]) -> str:
    """The README's table: accuracy after training per objective and seed, with 95 % intervals, and the mean."""
    seeds = sorted({r["seed"] for r in results})
    lines = [
        f"| objective | {' | '.join(f'seed {s}: after [95 %]' for s in seeds)} | mean after | gained / lost (sum) |",
        "| --- |" + " --- |" * (len(seeds) + 2),
    ]
    for objective in dict.fromkeys(r["objective"] for r in results):
        own = {r["seed"]: r for r in results if r["objective"] == objective}
        cells = [pct(own[s]["after"], own[s]["after_interval"]) if s in own else "-" for s in seeds]
        mean = sum(r["after"] for r in own.values()) / len(own)
        flips = f"{sum(r['gained'] for r in own.values())} / {sum(r['lost'] for r in own.values())}"
        lines.append(f"| {LABELS[objective]} | {' | '.join(cells)} | {pct(mean)} | {flips} |")
    return "\n".join(lines)


def spread_table(results: list[dict]) -> str:
    """The README's table of the demo's spread: per kind and start model, accuracy before and after each GRPO seed."""
    seeds = sorted({r["seed"] for r in results})
    lines = [
        f"| model | warm-start seed | before [95 %] | {' | '.join(f'seed {s}' for s in seeds)} | rise: min / mean |",
        "| --- | --- | --- |" + " --- |" * (len(seeds) + 1),
    ]
    for kind, warm in dict.fromkeys((r["kind"], r["warm_seed"]) for r in results):
        own = {r["seed"]: r for r in results if (r["kind"], r["warm_seed"]) == (kind, warm)}
        first = next(iter(own.values()))
        cells = [pct(own[s]["after"], own[s]["after_interval"]) if s in own else "-" for s in seeds]
        rises = [100 * (r["after"] - r["before"]) for r in own.values()]
        spread = f"{min(rises):+.1f} / {sum(rises) / len(rises):+.1f} pp"
        lines.append(
            f"| {kind} | {warm} | {pct(first['before'], first['before_interval'])} | {' | '.join(cells)} | {spread} |"
        )
    for kind in dict.fromkeys(r["kind"] for r in results):
        rises = sorted(100 * (r["after"] - r["before"]) for r in results if r["kind"] == kind)
        healthy = sum(not r["health"] for r in results if r["kind"] == kind)
        lines.append(
            f"\n{kind}: {len(rises)} runs, rise {rises[0]:+.1f} to {rises[-1]:+.1f} points (median "
            f"{rises[len(rises) // 2]:+.1f}); training health ok on {healthy} of {len(rises)}"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = list(dict.fromkeys(r["objective"] for r in results))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    before = results[0]
    low, high = before["before_interval"]
    left.axhspan(100 * low, 100 * high, color="0.85", label=f"before: {pct(before['before'], (low, high))}")
    for x, objective in enumerate(objectives):
        own = [r for r in results if r["objective"] == objective]
        for k, r in enumerate(own):
            lo, hi = r["after_interval"]
            y = 100 * r["after"]
            left.errorbar(x + 0.12 * (k - (len(own) - 1) / 2), y, yerr=[[y - 100 * lo], [100 * hi - y]], fmt="o",
                          color=f"C{x}", capsize=3, markersize=4)  # fmt: skip
        left.hlines(100 * sum(r["after"] for r in own) / len(own), x - 0.3, x + 0.3, color=f"C{x}")
    left.set_xticks(range(len(objectives)), [LABELS[o] for o in objectives], rotation=20, ha="right")
    left.set_ylabel("held-out accuracy after 40 steps, % (strict)")
    left.set_ylim(0, 100)
    left.legend(loc="lower right", fontsize=8)
    left.set_title("each seed with its 95 % interval; the bar is the mean", fontsize=9)
    for x, objective in enumerate(objectives):
        curves = [dict(r["correctness"]) for r in results if r["objective"] == objective]
        steps = sorted(set.intersection(*(set(c) for c in curves)))  # DAPO, GSPO: a reward per generation batch
        right.plot(steps, [sum(c[s] for c in curves) / len(curves) for s in steps], color=f"C{x}",
                   marker="o" if objective in OFF_POLICY else None, markersize=3, label=LABELS[objective])  # fmt: skip
    right.set_xlabel("GRPO step")
    right.set_ylabel("correctness reward (of 2.0)")
    right.legend(fontsize=8)
    right.set_title("training reward, mean over seeds (DAPO, GSPO: one per generation batch)", fontsize=9)
    seeds = sorted({r["seed"] for r in results})
    fig.suptitle(
        f"--demo under each objective, seeds {', '.join(map(str, seeds))}: a 0.35 M-parameter model on generated sums, "
        f"{before['n']} held-out problems, CPU (not GSM8K)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objectives", nargs="+", default=["default"], choices=OBJECTIVES)
    parser.add_argument("--kinds", nargs="+", default=["qwen2"], choices=KINDS, help="the tiny models (--tiny_model)")
    parser.add_argument(
        "--warm_seeds", nargs="+", type=int, default=[42], help="the start models' seeds (42: the preset's)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44], help="GRPO's seeds (--seed)")
    parser.add_argument("--no_eval_every", action="store_true", help="no in-training evaluations (faster)")
    parser.add_argument("--workers", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--folder", type=Path, default=Path("outputs/demo-runs"), help="where the runs go")
    parser.add_argument("--report", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="draw the objectives' picture here")
    parser.add_argument("--table", action="store_true", help="print the README's markdown table")
    args = parser.parse_args()
    folder = args.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    starts = [(kind, warm) for kind in args.kinds for warm in args.warm_seeds]
    with ThreadPoolExecutor(args.workers) as pool:
        models = dict(zip(starts, pool.map(lambda start: start_model(*start, folder), starts), strict=True))
        runs = [
            {"kind": kind, "warm_seed": warm, "objective": objective, "seed": seed}
            for kind, warm in starts
            for objective in args.objectives
            for seed in args.seeds
        ]

        def one(run: dict) -> dict:
            result = run_one(run, folder, models[run["kind"], run["warm_seed"]], not args.no_eval_every)
            health = "; ".join(result["health"]) or "ok"
            print(
                f"{run['kind']} warm {run['warm_seed']} {run['objective']} seed {run['seed']}: "
                f"{pct(result['before'])} -> {pct(result['after'], result['after_interval'])} (health: {health})",
                flush=True,
            )
            return result

        results = list(pool.map(one, runs))
    if args.report:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        args.report.write_text(json.dumps({"commit": commit or None, "runs": results}, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)
    if args.table:
        print(table(results) if len(args.objectives) > 1 else spread_table(results))


if __name__ == "__main__":
    main()
