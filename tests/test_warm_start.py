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


def test_the_rows_are_a_fixed_draw_of_the_training_rows_whose_solution_fits(gsm8k_dir, tiny):
    tokenizer, _ = tiny
    train = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))
    first, again = (warm_start.examples(train, 8, seed, grpo_demo.ANSWER_FORMAT) for seed in (42, 42))
    other = warm_start.examples(train, 8, 7, grpo_demo.ANSWER_FORMAT)
    assert first["prompt"] == again["prompt"] and first["prompt"] != other["prompt"]  # the seed draws them
    questions = {row["question"] for row in train}
    assert all(prompt[-1]["content"] in questions for prompt in first["prompt"])  # training rows only
    assert all(c[0]["role"] == "assistant" and grpo_demo.is_strict_format(c[0]["content"]) for c in first["completion"])
    with pytest.raises(Exception, match=f"warm_start_rows=65: {len(train)} train rows have a solution that fits"):
        warm_start.examples(train, 65, 42, grpo_demo.ANSWER_FORMAT)
    # A solution longer than the completion limit would teach an answer that never closes: not drawn.
    texts = [warm_start.solution_text(grpo_demo.ANSWER_FORMAT, s) for s in train["solution"]]
    lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)
    limit = lengths[len(lengths) // 2]  # half of them fit
    fits = warm_start.examples(train, 8, 42, grpo_demo.ANSWER_FORMAT, tokenizer, limit)
    taught = [len(tokenizer(c[0]["content"], add_special_tokens=False)["input_ids"]) + 1 for c in fits["completion"]]
    assert max(taught) <= limit
    with pytest.raises(Exception, match=f"max_completion_length={lengths[0] - 1} tokens"):
        warm_start.examples(train, 1, 42, grpo_demo.ANSWER_FORMAT, tokenizer, lengths[0] - 1)


@pytest.mark.parametrize(
    ("use_peft", "dtype", "trained_in"),
    [
        (False, "float32", "float32"),  # full fine-tuning: the run's own choice
        (False, "bfloat16", "bfloat16"),  # as --dtype asks
        (True, "bfloat16", "float32"),  # LoRA's frozen base is bf16 on a GPU: every weight trains here
    ],
)
def test_the_warm_start_trains_every_weight_in_a_dtype_that_keeps_small_updates(use_peft, dtype, trained_in):
    assert warm_start.full_fine_tuning_dtype(SimpleNamespace(use_peft=use_peft, dtype=dtype)) == trained_in


def test_a_warm_start_under_deepspeed_is_refused_with_what_to_do(monkeypatch):
    """accelerate refuses a second Accelerator with a DeepSpeed plugin: the warm start's trainer, then GRPO's."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert "warm_start_rows under DeepSpeed or FSDP" in refused(["--warm_start_rows", "64"])
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert "warm_start_rows under DeepSpeed or FSDP" in refused(["--warm_start_rows", "64"])
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    assert resolved(["--warm_start_rows", "64"]).warm_start_rows == 64


def test_a_resume_without_its_warm_start(tmp_path, caplog):
    """Full fine-tuning needs none (the checkpoint holds every weight); a LoRA adapter needs its very base."""
    run = SimpleNamespace(warm_start_rows=1, warm_start_learning_rate=5e-5, max_prompt_tokens=256)
    args = SimpleNamespace(output_dir=str(tmp_path), seed=42, max_completion_length=786, bf16=False)
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-2")
    rows = [{"prompt": [{"role": "user", "content": "q"}], "solution": "1 + 1 = 2\n#### 2"}]
    from datasets import Dataset

    train = Dataset.from_list(rows)
    full = SimpleNamespace(model_name_or_path="start-model", model_revision=None, use_peft=False, dtype="float32")
    assert warm_start.warm_started(train, run, args, full, grpo_demo.ANSWER_FORMAT, None) == "start-model"
    lora = SimpleNamespace(**{**vars(full), "use_peft": True})
    with pytest.raises(Exception, match="Resuming a LoRA run needs the base its adapter was trained on"):
        warm_start.warm_started(train, run, args, lora, grpo_demo.ANSWER_FORMAT, None)


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
    assert "warm_start_rows with load_in_4bit: the warm start fine-tunes every weight in full precision" in message
    assert resolved(["--use_peft", "--warm_start_rows", "64"]).warm_start_rows == 64  # LoRA on a full base: fine


def test_with_eval_only_or_ask_the_warm_start_is_said_to_do_nothing(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        resolved(["--eval_only", "--warm_start_rows", "64"])
    assert "warm_start_rows trains before GRPO: --eval_only and --ask measure or ask the model as it is" in caplog.text


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


@pytest.mark.parametrize("left", [".warm-start.part", "warm-start"])
@pytest.mark.parametrize("resume", [[], ["--resume_from_checkpoint", "latest"]], ids=["again", "resumed"])
def test_a_run_stopped_in_its_warm_start_can_be_run_again_in_its_folder(left, resume, tmp_path):
    """Stopped during the warm start (or just after it), a run has written only the warm start's folder, or the one it
    is built in: the same command, or the Slurm script's resume, takes the folder as the run's, not as a user's."""
    folder = tmp_path / "run" / left
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (tmp_path / "run" / "eval" / ".baseline-gsm8k.part").mkdir(parents=True)  # an lm-eval evaluation cut short
    argv = ["--output_dir", str(tmp_path / "run"), "--warm_start_rows", "8", *resume]
    assert resolved(argv).warm_start_rows == 8
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert "holds files that are not a run's (notes.txt)" in refused(argv)  # a user's file is still refused


@pytest.mark.parametrize(("processes", "per_device"), [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_each_warm_start_step_trains_at_its_learning_rate_on_eight_rows(processes, per_device, tiny_dir, tmp_path):
    """A few steps, each at the warm start's learning rate (a warmup would spend the first one at rate 0), eight rows a
    step over every process (per process as many as make eight: 64 rows on 8 GPUs are still 8 steps)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    rows = [{"prompt": [{"role": "user", "content": f"{i} + 1?"}], "solution": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
            for i in range(8)]  # fmt: skip
    from datasets import Dataset

    data = warm_start.examples(Dataset.from_list(rows), 8, 0, grpo_demo.ANSWER_FORMAT)
    run = SimpleNamespace(warm_start_learning_rate=5e-5, max_prompt_tokens=64)
    args = SimpleNamespace(max_completion_length=32, seed=0, bf16=False, fp16=False, use_cpu=True)
    args.activation_checkpointing, args.model_init_kwargs = False, {}
    model_args = SimpleNamespace(model_name_or_path=str(tiny_dir), use_peft=False, dtype="float32")
    trainer = warm_start.sft_trainer(data, run, args, model_args, tokenizer, tmp_path / "out", processes)
    assert trainer.args.per_device_train_batch_size == per_device
    if processes == 1:
        trainer.train()
        rates = [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry]
        assert rates == [5e-5]  # one step of eight rows, at the rate asked
