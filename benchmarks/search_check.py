"""A search's best reward weights against the recipe's (all 1), on the same seeds: validation and test accuracy.

    python -m grpo_kit.search --trials 10 --sampler_seed 0                      # on a CPU: the demo
    python benchmarks/search_check.py --best outputs/search/reward-weights/best.yaml --seeds 42 43 44

For each seed, both weightings train as the search's trials did (`--config best.yaml`: its recipe settings and held-out
rows; the recipe's weights by `--reward_weights 1 ...` on top), are scored on the validation rows (what the search
maximised, so the best trial's own seed flatters it) and then, once, on the test split (`--eval_only`), which no
trial read. Each pair is compared question by question (exact McNemar). Finished runs are read, not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_kit import scoring  # noqa: E402


def recipe(args: list[str], log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    with log.open("w") as f:
        done = subprocess.run([sys.executable, str(ROOT / "grpo_demo.py"), *args], env=env, stdout=f, stderr=f)
    if done.returncode != 0:
        sys.exit(f"failed (exit {done.returncode}): {log}")


def measured(folder: Path, name: str) -> tuple[dict, list[bool]]:
    summary = json.loads((folder / "eval" / name / "summary.json").read_text())
    records = [json.loads(line) for line in (folder / "eval" / name / "completions.jsonl").open()]
    return summary, [r["correct_strict"] for r in records]


def run(best: Path, weights: list[float] | None, seed: int, out: Path) -> dict:
    """Train (validation split) and evaluate on test: {split: (summary, verdicts)}."""
    extra = ["--reward_weights", *map(str, weights)] if weights else []
    if not (out / "eval" / "final" / "summary.json").is_file():
        args = ["--config", str(best), "--seed", str(seed), "--eval_split", "validation", "--eval_every_steps", "0"]
        recipe([*args, *extra, "--output_dir", str(out), "--report_to", "none"], out.with_suffix(".log"))
    test_dir = out.with_name(out.name + "-test")
    if not (test_dir / "eval" / "final" / "summary.json").is_file():
        args = ["--config", str(best), "--eval_only", "--model_name_or_path", str(out), "--output_dir", str(test_dir)]
        recipe(args, test_dir.with_suffix(".log"))
    return {"validation": measured(out, "final"), "test": measured(test_dir, "final")}


def pct(summary: dict) -> str:
    low, high = summary["interval_strict"]
    return f"{100 * summary['accuracy_strict']:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--best", type=Path, required=True, help="the search's best.yaml")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    parser.add_argument("--folder", type=Path, default=Path("outputs/search-check"))
    parser.add_argument("--report", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    best = yaml.safe_load(args.best.read_text())["reward_weights"]
    ones = [1.0] * len(best)
    rows, results = [], []
    for seed in args.seeds:
        pair = {
            name: run(args.best.resolve(), weights, seed, (args.folder / f"{name}-seed{seed}").resolve())
            for name, weights in (("best", None), ("default", ones))
        }
        for split in ("validation", "test"):
            (best_summary, best_verdicts), (default_summary, default_verdicts) = (
                pair["best"][split],
                pair["default"][split],
            )
            paired = scoring.paired(default_verdicts, best_verdicts)
            results.append({
                "seed": seed, "split": split, "best": best_summary["accuracy_strict"],
                "best_interval": best_summary["interval_strict"], "default": default_summary["accuracy_strict"],
                "default_interval": default_summary["interval_strict"], "n": best_summary["n"],
                "gained": len(paired["gained"]), "lost": len(paired["lost"]), "p_value": paired["p_value"],
            })  # fmt: skip
            rows.append(
                f"| {seed} | {split} ({best_summary['n']}) | {pct(default_summary)} | {pct(best_summary)} | "
                f"{len(paired['gained'])} / {len(paired['lost'])}, p = {paired['p_value']:.2g} |"
            )
    print(f"best weights {best} against the recipe's {ones}")
    print(
        "| seed | split (questions) | recipe's weights [95 %] | best weights [95 %] | best vs recipe's: gained / lost |"
    )
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    if args.report:
        args.report.write_text(json.dumps({"best_weights": best, "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
