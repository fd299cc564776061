"""The demo trained under each objective preset, several seeds each: held-out accuracy before and after, with
intervals, the paired test, and the correctness reward along the way.

    python benchmarks/objectives.py                      # 6 objectives x 3 seeds, about 40 min on two CPU cores
    python benchmarks/objectives.py --seeds 42 --objectives default dapo
    python benchmarks/objectives.py --report docs/objectives.json --plot docs/objectives.png --table

Each run is `python grpo_demo.py --demo --config configs/<objective>.yaml --seed N` ("default" is the recipe's
own objective, no config), into `outputs/objectives/<objective>-seed<N>/`; a finished run is read, not run again, so
a stopped benchmark goes on where it stopped. The seed varies GRPO alone (the demo's problems and warm-started model
are fixed): every run starts from the same model, measured on the same 256 held-out problems. The demo accumulates 1
micro-step per optimizer step where the recipe accumulates 4, so the presets that serve 4 optimizer steps from each
generation batch (DAPO, GSPO: steps_per_generation 16 = 4 x 4) get --steps_per_generation 4 here. In-training
evaluations are off (the accuracy before and after is what is compared); the logged rewards draw the curves.

What it measures is a tiny model (0.35 M parameters) on generated two-number sums, on a CPU: how each objective
moves a small policy that must choose between two ways of answering, not what it does to a 1.5B model on GSM8K.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def command(objective: str, seed: int, out: Path) -> list[str]:
    args = [sys.executable, str(ROOT / "grpo_demo.py"), "--demo", "--seed", str(seed), "--output_dir", str(out)]
    if objective != "default":
        args += ["--config", str(ROOT / "configs" / f"{objective}.yaml")]
    if objective in OFF_POLICY:
        args += ["--steps_per_generation", "4"]
    return [*args, "--run_name", out.name, "--eval_every_steps", "0", "--report_to", "none"]


def run(objective: str, seed: int, folder: Path) -> dict:
    """One demo run (or the one already finished there): its numbers."""
    out = folder / f"{objective}-seed{seed}"
    comparison = out / "eval" / "comparison.json"
    if not comparison.is_file():
        shutil.rmtree(out, ignore_errors=True)  # a run cut short: start it again
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        started = time.perf_counter()
        with (folder / f"{out.name}.log").open("w") as log:
            done = subprocess.run(command(objective, seed, out), cwd=folder, env=env, stdout=log, stderr=log)
        if done.returncode != 0 or not comparison.is_file():
            sys.exit(f"{out.name} failed (exit {done.returncode}): see {folder / f'{out.name}.log'}")
        (out / "seconds.txt").write_text(f"{time.perf_counter() - started:.0f}\n")
    result = json.loads(comparison.read_text())
    before, after, paired = result["baseline"], result["final"], result["paired"]["strict"]
    state = json.loads((out / "trainer_state.json").read_text())
    return {
        "objective": objective,
        "seed": seed,
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
        "correctness": [[e["step"], e[CORRECTNESS]] for e in state["log_history"] if CORRECTNESS in e],
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
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    parser.add_argument("--folder", type=Path, default=Path("outputs/objectives"), help="where the runs go")
    parser.add_argument("--report", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="draw the picture here")
    parser.add_argument("--table", action="store_true", help="print the README's markdown table")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    results = []
    for objective in args.objectives:
        for seed in args.seeds:
            results.append(run(objective, seed, args.folder.resolve()))
            r = results[-1]
            print(f"{objective} seed {seed}: {pct(r['before'])} -> {pct(r['after'], r['after_interval'])}", flush=True)
    if args.report:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        args.report.write_text(json.dumps({"commit": commit or None, "runs": results}, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)
    if args.table:
        print(table(results))


if __name__ == "__main__":
    main()
