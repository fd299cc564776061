"""How well the five rewards judge real model solutions, next to the reference script's five, in one run.

    python benchmarks/reward_agreement.py                          # GSM8K from ../shared/data/gsm8k
    python benchmarks/reward_agreement.py --data DIR --json out.json

Reads GSM8K's `example_model_solutions.jsonl` (1,319 test questions x 4 real model solutions, each ending in a
line `A: <answer>` and labelled `is_correct` by the official checker), wraps every solution in the answer format
the prompt asks for (reasoning = the lines before `A:`, answer = the text after it) and reports:
- agreement of `correctness_reward_func` with `is_correct` (target >= 99.5 %), every disagreement categorised;
- how many wrapped solutions the soft and strict format rewards accept (target 100 %);
- whether `int_reward_func` pays every GSM8K gold answer of train and test (must be 100 %);
- the cost of the five rewards per completion, ours and the reference's, measured on the same completions.

The reference functions are re-implemented below as the reference script wrote them, except that the reference's
correctness reward printed on every call: that print is left out here, so its timing is a lower bound.
Not part of the test suite: it needs the local GSM8K copy, which the project's tests must not read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpo_demo  # noqa: E402

REWARD_NAMES = ("xmlcount", "soft", "strict", "int", "correctness")  # the order of REWARD_FUNCS in both scripts
SOLUTION_KEYS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
TARGET_AGREEMENT = 99.5  # percent


# ----------------------------------------------------------------------------------------------------------------
# The reference script's parsing and rewards, as it wrote them (without the print in correctness).


def ref_extract_xml_answer(text: str) -> str:
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def ref_extract_hash_answer(text: str) -> str | None:
    return text.split("####")[1].strip() if "####" in text else None


def ref_correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    extracted = [ref_extract_xml_answer(c[0]["content"]) for c in completions]
    return [2.0 if r == a else 0.0 for r, a in zip(extracted, answer, strict=True)]


def ref_int_reward_func(completions, **kwargs) -> list[float]:
    return [0.5 if ref_extract_xml_answer(c[0]["content"]).isdigit() else 0.0 for c in completions]


def ref_strict_format_reward_func(completions, **kwargs) -> list[float]:
    pattern = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
    return [0.5 if re.match(pattern, c[0]["content"]) else 0.0 for c in completions]


def ref_soft_format_reward_func(completions, **kwargs) -> list[float]:
    pattern = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
    return [0.5 if re.match(pattern, c[0]["content"]) else 0.0 for c in completions]


def ref_count_xml(text: str) -> float:
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return count


def ref_xmlcount_reward_func(completions, **kwargs) -> list[float]:
    return [ref_count_xml(c[0]["content"]) for c in completions]


REF_REWARD_FUNCS = [
    ref_xmlcount_reward_func,
    ref_soft_format_reward_func,
    ref_strict_format_reward_func,
    ref_int_reward_func,
    ref_correctness_reward_func,
]


# ----------------------------------------------------------------------------------------------------------------
# Data


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_solution(solution: str) -> tuple[str, str]:
    """(reasoning, answer): the lines before the final `A: ...` line, and the text after `A: `.

    A solution without an `A:` line (the model ran out of tokens) is all reasoning, with an empty answer.
    """
    head, sep, last = solution.rpartition("\n")
    if not sep:
        head, last = "", solution
    if last.startswith("A:"):
        return head, last[2:].strip()
    return solution, ""


def load_cases(data: Path) -> tuple[list[dict], dict]:
    """One case per model solution: wrapped completion, gold answers (canonical and raw), label."""
    rows = read_jsonl(data / "example_model_solutions.jsonl")
    test = read_jsonl(data / "test.jsonl")
    if len(rows) != len(test):
        sys.exit(f"{len(rows)} rows of example_model_solutions.jsonl but {len(test)} of test.jsonl")
    gold_mismatches = []
    cases = []
    for i, (row, test_row) in enumerate(zip(rows, test, strict=True)):
        gold = grpo_demo.extract_hash_answer(test_row["answer"])
        truth = row["ground_truth"].rpartition("\nA: ")[2].strip().replace(",", "")
        if row["question"] != test_row["question"] or gold != truth:
            gold_mismatches.append({"row": i, "test.jsonl": gold, "ground_truth": truth})
        for key in SOLUTION_KEYS:
            solution = row[key]["solution"]
            reasoning, answer = split_solution(solution)
            text = grpo_demo.XML_COT_FORMAT.format(reasoning=reasoning, answer=answer)
            cases.append(
                {
                    "row": i,
                    "model": key,
                    "completion": [{"role": "assistant", "content": text}],
                    "answer": answer,
                    "has_answer_line": solution.rpartition("\n")[2].startswith("A:"),
                    "gold": gold,
                    "ref_gold": ref_extract_hash_answer(test_row["answer"]),
                    "is_correct": bool(row[key]["is_correct"]),
                }
            )
    return cases, {"rows": len(rows), "gold_mismatches": gold_mismatches}


# ----------------------------------------------------------------------------------------------------------------
# Measurements


def score(funcs, completions: list, golds: list[str]) -> dict[str, list[float]]:
    """Each reward's scores of the batch, by short name, called as TRL calls them."""
    return {
        name: f(prompts=None, completions=completions, answer=golds)
        for name, f in zip(REWARD_NAMES, funcs, strict=True)
    }


def cost_us(funcs, completions: list, golds: list[str], repeats: int = 7) -> float:
    """Best-of-`repeats` wall time of the five rewards over the batch, per completion, in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        score(funcs, completions, golds)
        best = min(best, time.perf_counter() - start)
    return best / len(completions) * 1e6


def categorise(case: dict, paid: bool) -> str:
    """Why a correctness reward and the official label disagree."""
    gold, answer = case["gold"], case["answer"]
    if not case["has_answer_line"]:
        return "solution has no `A:` line (truncated)"
    ours, theirs = grpo_demo.answer_number(answer), grpo_demo.parse_number(gold)
    if paid and answer.replace(",", "") != gold and ours == theirs:
        return f"label compares strings: {answer} vs {gold}"
    if not paid and ours is None:
        return f"answer commits to no single number: {answer!r}"
    if not paid and case["is_correct"]:
        return f"label accepts a string the reward does not read as the gold number: {answer!r} vs {gold}"
    return f"other: answer {answer!r}, gold {gold}"


def ref_categorise(case: dict) -> str:
    """Why the reference's string comparison misjudges a solution (the label compares with commas dropped)."""
    answer, gold = case["answer"], case["ref_gold"]
    if "," in gold:
        return "gold has a thousands separator"
    if "," in answer:
        return "answer has a thousands separator"
    return f"other: answer {answer!r}, gold {gold!r}"


def gold_int_rates(data: Path) -> dict:
    """int reward on every gold answer of train and test, wrapped as a perfect completion; ours and reference."""
    ours = ref = total = 0
    failures = []
    for split in ("train", "test"):
        for row in read_jsonl(data / f"{split}.jsonl"):
            gold = grpo_demo.extract_hash_answer(row["answer"])
            raw = ref_extract_hash_answer(row["answer"])
            text = grpo_demo.XML_COT_FORMAT.format(reasoning="...", answer=raw)
            completion = [[{"role": "assistant", "content": text}]]
            paid = grpo_demo.int_reward_func(completions=completion)[0] == 0.5
            ours += paid
            ref += ref_int_reward_func(completions=completion)[0] == 0.5
            total += 1
            if not paid or grpo_demo.parse_number(raw) != grpo_demo.parse_number(gold):
                failures.append({"split": split, "gold": raw})
    return {"total": total, "ours": ours, "reference": ref, "failures": failures}


def pct(n: int, total: int) -> str:
    return f"{n:,} / {total:,} ({100 * n / total:.2f} %)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / ".." / "shared" / "data" / "gsm8k", help="GSM8K folder")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    needed = ("test.jsonl", "train.jsonl", "example_model_solutions.jsonl")
    if not all((args.data / name).is_file() for name in needed):
        sys.exit(f"--data {args.data}: a GSM8K folder with {', '.join(needed)} is needed (give it with --data DIR)")

    cases, meta = load_cases(args.data)
    n = len(cases)
    completions = [c["completion"] for c in cases]
    golds = [c["gold"] for c in cases]
    ref_golds = [c["ref_gold"] for c in cases]

    ours = score(grpo_demo.REWARD_FUNCS, completions, golds)
    ref = score(REF_REWARD_FUNCS, completions, ref_golds)

    disagreements, ref_disagreements = [], []
    for case, reward, ref_reward in zip(cases, ours["correctness"], ref["correctness"], strict=True):
        if (reward == 2.0) != case["is_correct"]:
            disagreements.append(
                {
                    **{k: case[k] for k in ("row", "model", "answer", "gold", "is_correct")},
                    "reward": reward,
                    "category": categorise(case, reward == 2.0),
                }
            )
        if (ref_reward == 2.0) != case["is_correct"]:
            ref_disagreements.append(
                {
                    **{k: case[k] for k in ("row", "model", "answer", "ref_gold", "is_correct")},
                    "reward": ref_reward,
                    "category": ref_categorise(case),
                }
            )
    agree = n - len(disagreements)
    ref_agree = n - len(ref_disagreements)

    gold_int = gold_int_rates(args.data)
    ours_us = cost_us(grpo_demo.REWARD_FUNCS, completions, golds)
    ref_us = cost_us(REF_REWARD_FUNCS, completions, ref_golds)

    def paid(rewards: list[float], value: float = 0.5) -> int:
        return sum(r == value for r in rewards)

    table = [
        ("correctness agrees with `is_correct`", pct(agree, n), pct(ref_agree, n), f">= {TARGET_AGREEMENT} %"),
        ("soft format matches", pct(paid(ours["soft"]), n), pct(paid(ref["soft"]), n), "100 %"),
        ("strict format matches", pct(paid(ours["strict"]), n), pct(paid(ref["strict"]), n), "100 %"),
        ("xmlcount = 0.5", pct(paid(ours["xmlcount"]), n), pct(paid(ref["xmlcount"]), n), "100 %"),
        ("int reward on train+test gold answers", pct(gold_int["ours"], gold_int["total"]),
         pct(gold_int["reference"], gold_int["total"]), "100 %"),
        ("five rewards, µs per completion", f"{ours_us:.2f}", f"{ref_us:.2f} (no print)",
         f"<= 10x reference: {ours_us / ref_us:.1f}x"),
    ]  # fmt: skip
    lines = [
        f"Reward agreement on {n:,} model solutions ({meta['rows']:,} GSM8K test questions x 4), "
        f"wrapped in the answer format; gold answers of test.jsonl and `ground_truth` agree on "
        f"{meta['rows'] - len(meta['gold_mismatches']):,} / {meta['rows']:,}.",
        "",
        "| measure | ours | reference | target |",
        "| --- | --- | --- | --- |",
        *(f"| {' | '.join(row)} |" for row in table),
        "",
        f"Our correctness disagreements with `is_correct`: {len(disagreements)}",
        *(
            f"- row {d['row']} {d['model']}: answer {d['answer']!r}, gold {d['gold']}, label {d['is_correct']}, "
            f"reward {d['reward']}: {d['category']}"
            for d in disagreements
        ),
        "",
        f"Reference correctness disagreements with `is_correct`: {len(ref_disagreements)}",
        *(
            f"- row {d['row']} {d['model']}: answer {d['answer']!r}, gold {d['ref_gold']!r}, label {d['is_correct']}, "
            f"reward {d['reward']}: {d['category']}"
            for d in ref_disagreements
        ),
    ]
    if meta["gold_mismatches"]:
        lines += ["", "Gold answers that differ between test.jsonl and ground_truth:"]
        lines += [f"- {m}" for m in meta["gold_mismatches"]]
    if gold_int["failures"]:
        lines += ["", "Gold answers our int reward does not pay:", *(f"- {f}" for f in gold_int["failures"])]
    print("\n".join(lines))

    if args.json:
        results = {
            "completions": n,
            "questions": meta["rows"],
            "gold_mismatches": meta["gold_mismatches"],
            "correctness_agreement": {"ours": agree, "reference": ref_agree, "total": n},
            "disagreements": disagreements,
            "reference_disagreements": ref_disagreements,
            "soft_format": {"ours": paid(ours["soft"]), "reference": paid(ref["soft"]), "total": n},
            "strict_format": {"ours": paid(ours["strict"]), "reference": paid(ref["strict"]), "total": n},
            "xmlcount_full": {"ours": paid(ours["xmlcount"]), "reference": paid(ref["xmlcount"]), "total": n},
            "int_on_gold": gold_int,
            "us_per_completion": {"ours": ours_us, "reference": ref_us, "ratio": ours_us / ref_us},
        }
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    ok = (
        100 * agree / n >= TARGET_AGREEMENT
        and paid(ours["soft"]) == paid(ours["strict"]) == n
        and gold_int["ours"] == gold_int["total"]
        and not gold_int["failures"]
        and not meta["gold_mismatches"]
        and ours_us <= 10 * ref_us
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
