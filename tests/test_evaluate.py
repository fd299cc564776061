"""GSM8K evaluation: exact scoring, the report files, left-padded batching, the in-training callback."""

import importlib.util
import json

import pytest

import grpo_demo
from grpo_kit import evaluate, smoke

ANSWER = "<reasoning>\n{r}\n</reasoning>\n<answer>\n{a}\n</answer>"


RIGHT = ANSWER.format(r="3 + 4 = 7", a="7")


@pytest.mark.parametrize(
    ("completion", "gold", "answer_strict", "answer_lenient", "correct_strict", "correct_lenient"),
    [
        (RIGHT, "7", "7", "7", True, True),  # strictly formatted and right
        ("3 + 4 makes 7", "7", None, "7", False, True),  # right number outside any answer block: lenient only
        (RIGHT + "\nStep 2 done.", "7", "7", "2", True, False),  # a later number after the block: strict only
        (ANSWER.format(r="...", a="$1,080.00"), "1080", "$1,080.00", "1,080.00", True, True),  # numbers, not strings
        (ANSWER.format(r="...", a="3 * 6 = 18"), "18", "3 * 6 = 18", "18", False, True),  # two numbers commit to none
        (ANSWER.format(r="...", a="nine"), "9", "nine", None, False, False),  # no digits anywhere
        ("", "9", None, None, False, False),  # empty completion
        (ANSWER.format(r="1 - 4 = -3", a="-3"), "-3", "-3", "-3", True, True),  # negative gold answer
    ],
)
def test_score_strict_and_lenient(completion, gold, answer_strict, answer_lenient, correct_strict, correct_lenient):
    scored = evaluate.score(completion, gold)
    assert (scored["answer_strict"], scored["answer_lenient"]) == (answer_strict, answer_lenient)
    assert (scored["correct_strict"], scored["correct_lenient"]) == (correct_strict, correct_lenient)


@pytest.mark.parametrize(
    ("completion", "strict", "soft"),
    [
        (ANSWER.format(r="a\nb", a="7"), True, True),  # the format the prompt asks for
        (ANSWER.format(r="a", a="7") + "\nmore", False, True),  # text after the answer: soft only
        ("The answer is 7", False, False),
    ],
)
def test_score_format_flags(completion, strict, soft):
    scored = evaluate.score(completion, "7")
    assert (scored["format_strict"], scored["format_soft"]) == (strict, soft)


def test_last_number():
    assert evaluate.last_number("5 apples, then 1,080.5 and -3.") == "-3"
    assert evaluate.last_number("no digits") is None


# ----------------------------------------------------------------------------------------------------------------
# On a tiny offline model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a small shared CPU, worker threads spin against other processes and a tiny model's
    generation slows tenfold."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    rows = smoke.make_problems(64)
    corpus = [grpo_demo.SYSTEM_PROMPT] + [r["question"] for r in rows] + [smoke.formatted_solution(r) for r in rows]
    tokenizer = smoke.build_tokenizer(corpus)
    return tokenizer, smoke.build_tiny_model(tokenizer)


@pytest.fixture
def test_rows(tmp_path):
    folder = smoke.write_gsm8k_folder(tmp_path / "gsm8k", n_train=8, n_test=8)
    return grpo_demo.get_gsm8k_questions("test", str(folder))


SUMMARY_FIELDS = {
    "n",
    "accuracy_strict",
    "accuracy_lenient",
    "format_rate",
    "soft_format_rate",
    "mean_completion_tokens",
    "truncated",
    "model",
    "backend",
    "max_new_tokens",
    "seconds",
    "questions_per_second",
}
RECORD_FIELDS = {
    "question",
    "gold",
    "completion",
    "answer_strict",
    "answer_lenient",
    "correct_strict",
    "correct_lenient",
    "format_strict",
    "format_soft",
    "completion_tokens",
    "truncated",
}


def test_evaluate_writes_consistent_report(tiny, test_rows, tmp_path, capsys):
    tokenizer, model = tiny
    summary, records = evaluate.evaluate(model, tokenizer, test_rows, max_new_tokens=16, batch_size=4)
    folder = evaluate.write_report(tmp_path / "run", "baseline", summary, records)

    saved = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]
    assert saved == summary and set(saved) == SUMMARY_FIELDS
    assert lines == records and all(set(r) == RECORD_FIELDS for r in lines)
    assert summary["n"] == len(lines) == 8
    assert [r["question"] for r in lines] == test_rows["question"]  # input order restored after length sorting
    assert [r["gold"] for r in lines] == test_rows["answer"]
    assert summary["accuracy_strict"] == sum(r["correct_strict"] for r in lines) / 8
    assert summary["accuracy_lenient"] == sum(r["correct_lenient"] for r in lines) / 8
    assert summary["truncated"] == sum(r["truncated"] for r in lines)
    assert summary["mean_completion_tokens"] == sum(r["completion_tokens"] for r in lines) / 8
    assert all(r["completion_tokens"] == 16 for r in lines if r["truncated"])
    assert all(1 <= r["completion_tokens"] <= 16 for r in lines)
    assert all(evaluate.score(r["completion"], r["gold"]).items() <= r.items() for r in lines)
    assert "accuracy, strict (answer block)" in capsys.readouterr().out

    limited, _ = evaluate.evaluate(model, tokenizer, test_rows, max_new_tokens=4, batch_size=4, limit=3)
    assert limited["n"] == 3


def test_batched_generation_matches_one_at_a_time(tiny, test_rows):
    tokenizer, model = tiny
    prompts = test_rows["prompt"]
    padding_side = tokenizer.padding_side
    model.train()
    batched = evaluate.generate_greedy(model, tokenizer, prompts, max_new_tokens=16, batch_size=8)
    single = evaluate.generate_greedy(model, tokenizer, prompts, max_new_tokens=16, batch_size=1)
    assert batched == single
    lengths = {len(tokenizer.apply_chat_template(p, add_generation_prompt=True, return_dict=False)) for p in prompts}
    assert len(lengths) > 1  # so the batch was padded
    assert model.training and tokenizer.padding_side == padding_side  # both left as they were


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_use_vllm_without_vllm_says_so(tiny, test_rows, tmp_path):
    with pytest.raises(ImportError, match="use_vllm needs vLLM"):
        evaluate.evaluate(str(tmp_path), tiny[0], test_rows, max_new_tokens=4, batch_size=4, use_vllm=True)


def test_accuracy_callback_logs_into_trainer_state(tiny, test_rows, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = tiny[0]
    model = smoke.build_tiny_model(tokenizer)  # trained here: not the shared one
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_steps=2,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=8,
        logging_steps=1,
        save_strategy="no",
        log_completions=False,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=grpo_demo.REWARD_FUNCS,
        args=args,
        train_dataset=test_rows,
    )
    trainer.add_callback(
        evaluate.AccuracyCallback(trainer, test_rows.select(range(4)), every_steps=1, max_new_tokens=8, batch_size=4)
    )
    trainer.train()
    trainer.save_state()

    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    accuracy = [entry for entry in history if "eval_accuracy_strict" in entry]
    assert [entry["step"] for entry in accuracy] == [1, 2]
    assert all(
        {"eval_accuracy_lenient", "eval_format_rate", "eval_mean_completion_tokens"} <= e.keys() for e in accuracy
    )
    assert all(0.0 <= e["eval_accuracy_strict"] <= 1.0 for e in accuracy)
    rewards = [entry for entry in history if "reward" in entry]
    assert [entry["step"] for entry in rewards] == [1, 2]  # the rewards still log in their own entries
    assert not any("eval_accuracy_strict" in entry for entry in rewards)


def test_compare_writes_before_and_after(tmp_path, capsys):
    def summary(strict, lenient, truncated):
        return {
            "n": 4,
            "accuracy_strict": strict,
            "accuracy_lenient": lenient,
            "format_rate": strict,
            "soft_format_rate": strict,
            "mean_completion_tokens": 100.0,
            "truncated": truncated,
            "model": "m",
            "seconds": 1.0,
        }

    assert evaluate.compare(tmp_path) is None  # no evaluations yet
    evaluate.write_report(tmp_path, "baseline", summary(0.25, 0.5, 2), [])
    assert evaluate.compare(tmp_path) is None  # a baseline alone
    evaluate.write_report(tmp_path, "final", summary(0.75, 0.75, 0), [])

    comparison = evaluate.compare(tmp_path)
    assert comparison == json.loads((tmp_path / "eval" / "comparison.json").read_text())
    assert comparison["change"]["accuracy_strict"] == 0.5
    assert comparison["change"]["accuracy_lenient"] == 0.25
    assert comparison["change"]["truncated"] == -2
    table = capsys.readouterr().out
    assert "| accuracy, strict (answer block) | 25.0 % | 75.0 % | +50.0 pp |" in table
    assert "| truncated (hit max_new_tokens) | 2 | 0 | -2 |" in table


def test_ask_samples_an_answer(tiny, tmp_path):
    tokenizer, model = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    first = evaluate.ask(str(tmp_path / "model"), "Ava has 3 apples and gets 4 more. How many?", max_new_tokens=12)
    again = evaluate.ask(str(tmp_path / "model"), "Ava has 3 apples and gets 4 more. How many?", max_new_tokens=12)
    assert isinstance(first, str) and first and first == again  # seeded
