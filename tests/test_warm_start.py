"""The supervised warm start (`--warm_start_rows`): which rows it teaches and how they read, the precision it trains
in, what it refuses, and that a resumed run keeps its terms. Its whole run, on a real model, is in test_real_model.py;
on the tiny model here."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import ROOT, refused, resolved
from test_settings import fake_checkpoint

import grpo_demo
from grpo_kit import warm_start
from grpo_kit.answer_format import Tags

pytestmark = pytest.mark.usefixtures("single_process")


@pytest.mark.parametrize(
    ("solution", "taught"),
    [
        # GSM8K's own: calculator annotations out, the answer after ####, no newline after the closing tag
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72",
         "<reasoning>\nNatalia sold 48/2 = 24 clips.\nAltogether 48+24 = 72.\n</reasoning>\n<answer>\n72\n</answer>"),
        ("A <b>bold</b> step, <<3*4=12>>12 in all\n#### 1,080",  # text in angle brackets that is no annotation: kept
         "<reasoning>\nA <b>bold</b> step, 12 in all\n</reasoning>\n<answer>\n1,080\n</answer>"),
    ],
)  # fmt: skip
def test_a_gsm8k_solution_is_taught_in_the_answer_format_it_is_scored_in(solution, taught):
    assert warm_start.solution_text(grpo_demo.ANSWER_FORMAT, solution) == taught
    assert grpo_demo.is_strict_format(taught) and grpo_demo.extract_xml_answer(taught) == taught.split("\n")[-2]
    think = grpo_demo.answer_format(Tags("think", "answer"))
    assert warm_start.solution_text(think, solution).startswith("<think>\n")


def test_the_rows_are_a_fixed_draw_of_the_training_rows(gsm8k_dir):
    train = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))
    first, again = (warm_start.examples(train, 8, seed, grpo_demo.ANSWER_FORMAT) for seed in (42, 42))
    other = warm_start.examples(train, 8, 7, grpo_demo.ANSWER_FORMAT)
    assert first["prompt"] == again["prompt"] and first["prompt"] != other["prompt"]  # the seed draws them
    questions = {row["question"] for row in train}
    assert all(prompt[-1]["content"] in questions for prompt in first["prompt"])  # training rows only
    assert all(c[0]["role"] == "assistant" and grpo_demo.is_strict_format(c[0]["content"]) for c in first["completion"])
    with pytest.raises(Exception, match=f"warm_start_rows=65: the train split has {len(train)} usable rows"):
        warm_start.examples(train, 65, 42, grpo_demo.ANSWER_FORMAT)


@pytest.mark.parametrize(
    ("use_peft", "dtype", "zero", "trained_in"),
    [
        (False, "float32", None, "float32"),  # full fine-tuning: the run's own choice
        (False, "bfloat16", "2", "bfloat16"),  # under DeepSpeed, which keeps fp32 copies of its own
        (True, "bfloat16", None, "float32"),  # LoRA's frozen base is bf16 on a GPU: every weight trains here
        (True, "bfloat16", "3", "bfloat16"),
    ],
)
def test_the_warm_start_trains_every_weight_in_a_dtype_that_keeps_small_updates(
    use_peft, dtype, zero, trained_in, monkeypatch
):
    monkeypatch.setattr("grpo_kit.models.zero_stage", lambda: zero)
    model_args = SimpleNamespace(use_peft=use_peft, dtype=dtype)
    assert warm_start.full_fine_tuning_dtype(model_args) == trained_in


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--warm_start_rows", "-1"], "warm_start_rows=-1: the train rows of the supervised warm start, 0 (none)"),
        (["--warm_start_learning_rate", "0"], "warm_start_learning_rate=0.0: must be a positive number"),
        (["--warm_start_learning_rate", "nan"], "warm_start_learning_rate=nan: must be a positive number"),
    ],
)
def test_bad_warm_start_settings_are_refused_naming_them(argv, says):
    assert says in refused(argv)


def test_a_warm_start_before_qlora_is_refused_with_what_to_do(gpu_extras):
    message = refused(["--use_peft", "--load_in_4bit", "--warm_start_rows", "64"])
    assert "warm_start_rows with load_in_4bit: the warm start fine-tunes every weight" in message
    assert resolved(["--use_peft", "--warm_start_rows", "64"]).warm_start_rows == 64  # LoRA on a full base: fine


def test_the_defaults_are_the_recipes_constants_and_none_for_its_instruct_models():
    chosen = resolved([])
    assert (chosen.warm_start_rows, chosen.warm_start_learning_rate) == (0, 5e-5) == (
        grpo_demo.WARM_START_ROWS, grpo_demo.WARM_START_LEARNING_RATE
    )  # fmt: skip
    assert resolved(["--config", str(ROOT / "configs" / "small_model_cpu.yaml")]).warm_start_rows == 64


def test_a_resumed_run_keeps_its_warm_start(tmp_path):
    """The warm start is where the run's weights began: resuming with another one would continue a different run."""
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoint-2", step=2)
    settings = {"run": {"warm_start_rows": 64, "warm_start_learning_rate": 5e-5}}
    (run / "run_record.json").write_text(json.dumps({"settings": settings}))
    argv = ["--output_dir", str(run), "--resume_from_checkpoint", "latest", "--warm_start_rows", "32"]
    assert "  - warm_start_rows: 64 -> 32" in refused(argv)
