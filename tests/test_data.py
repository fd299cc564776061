"""Data prep on GSM8K-format files: chat prompts and canonical answers, bad rows named and dropped, bad files named,
the prompt-length cap, and the training data's fingerprint."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from conftest import refused, resolved

import grpo_demo
from grpo_kit import RecipeError, models, smoke
from grpo_kit.scoring import data_fingerprint


def write_rows(folder, rows, split="train"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_rows_become_system_then_user_prompts_with_canonical_answers(tmp_path):
    folder = write_rows(
        tmp_path / "gsm8k",
        [
            {"question": "How many?", "answer": "4 + 5 = <<4+5=9>>9\n#### 9"},
            {"question": "How much?", "answer": "It is 1,080.\n#### 1,080"},
            {"question": "What change?", "answer": "It drops by 3.\n#### -3"},
        ],
    )
    data = grpo_demo.get_gsm8k_questions("train", folder)
    assert data["answer"] == ["9", "1080", "-3"]
    assert data[0]["prompt"] == [
        {"role": "system", "content": grpo_demo.SYSTEM_PROMPT},
        {"role": "user", "content": "How many?"},
    ]


BAD_ROWS = [
    {"question": "Good one", "answer": "2 + 2 = 4\n#### 4"},
    {"question": "No marker", "answer": "the answer is 4"},  # no '####'
    {"question": "   ", "answer": "#### 4"},  # empty question
    {"question": "Words", "answer": "#### four"},  # gold is no number
    {"question": "Another good one", "answer": "#### 1,000"},
    {"question": "Empty gold", "answer": "####"},  # gold is no number
    {"question": 5, "answer": "#### 5"},  # not text
    {"question": "No answer field"},  # not text (missing)
    {"question": "Badly grouped", "answer": "#### 1,2"},  # gold is no number: 1,2 is not 12
]


def test_bad_rows_are_counted_named_by_line_and_dropped(tmp_path, caplog):
    folder = write_rows(tmp_path / "d", BAD_ROWS)
    with caplog.at_level("WARNING", logger="grpo_demo"):
        data = grpo_demo.get_gsm8k_questions("train", folder)
    assert data["question"] == ["Good one", "Another good one"]
    assert data["answer"] == ["4", "1000"]
    lines = f"{folder}/train.jsonl lines"
    assert f"1 train rows with no '####' answer ({lines} [2])" in caplog.text
    assert f"1 train rows with an empty question ({lines} [3])" in caplog.text
    assert f"3 train rows with a gold answer that is no number ({lines} [4, 6, 9])" in caplog.text
    assert f"2 train rows with a question or answer that is not text ({lines} [7, 8])" in caplog.text


def test_strict_data_stops_on_the_first_kind_of_bad_row(tmp_path):
    with pytest.raises(
        RecipeError, match=r"Bad data: 1 train rows with no '####' answer \(.*train.jsonl lines \[2\]\)"
    ):
        grpo_demo.get_gsm8k_questions("train", write_rows(tmp_path / "d", BAD_ROWS), strict=True)


def test_nothing_left_after_filtering_stops_with_a_message(tmp_path):
    with pytest.raises(RecipeError, match="No usable train rows in .*train.jsonl: every row was dropped"):
        grpo_demo.get_gsm8k_questions("train", write_rows(tmp_path / "d", BAD_ROWS[1:4]))


def test_lines_that_are_not_json_objects_are_counted_named_and_dropped(tmp_path, caplog):
    good = json.dumps({"question": "How many?", "answer": "#### 3"}).encode()
    lines = [
        good,
        b'{"question": ',
        b'["question", "answer"]',
        b'{"question": "caf\xe9", "answer": "#### 1"}',
        b"",
        good,
    ]
    (tmp_path / "train.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")  # a byte-order mark first
    with caplog.at_level("WARNING", logger="grpo_demo"):
        data = grpo_demo.get_gsm8k_questions("train", str(tmp_path))
    assert data["answer"] == ["3", "3"]  # lines 1 and 6
    assert "1 train rows with a line that is not valid JSON (" in caplog.text and "lines [2])" in caplog.text
    assert "1 train rows with a line that is not a JSON object (" in caplog.text and "lines [3])" in caplog.text
    assert "1 train rows with a line that is not UTF-8 text (" in caplog.text and "lines [4])" in caplog.text
    with pytest.raises(RecipeError, match="Bad data: 1 train rows with a line that is not valid JSON"):
        grpo_demo.get_gsm8k_questions("train", str(tmp_path), strict=True)


def test_a_folder_without_the_split_is_named(tmp_path):
    with pytest.raises(RecipeError) as stop:
        grpo_demo.get_gsm8k_questions("test", write_rows(tmp_path / "d", BAD_ROWS))
    assert str(stop.value) == (
        f"--dataset {tmp_path / 'd'}: no test.jsonl there, nor the Hub's main/test-*.parquet (expected GSM8K's "
        "train.jsonl / test.jsonl, or the Hub's layout: main/test-00000-of-00001.parquet)"
    )


def test_a_copy_in_the_hubs_parquet_layout_reads_as_the_jsonl_one(tmp_path, gsm8k_dir, monkeypatch):
    """The Hub stores GSM8K as parquet shards, a folder per config: `main/` is read (and `main/` given itself)."""
    import pyarrow
    import pyarrow.parquet

    hub = tmp_path / "gsm8k"
    for config in ("main", "socratic"):
        (hub / config).mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(line) for line in (gsm8k_dir / f"{split}.jsonl").read_text().splitlines()]
        shards = [rows[:10], rows[10:]] if split == "train" else [rows]  # several shards are read in order
        for i, shard in enumerate(shards):
            name = f"{split}-{i:05d}-of-{len(shards):05d}.parquet"
            pyarrow.parquet.write_table(pyarrow.Table.from_pylist(shard), hub / "main" / name)
        socratic = [{**row, "answer": "Step: " + row["answer"].replace("#### ", "#### 1")} for row in rows]
        pyarrow.parquet.write_table(
            pyarrow.Table.from_pylist(socratic), hub / "socratic" / f"{split}-00000-of-00001.parquet"
        )
        expected = grpo_demo.get_gsm8k_questions(split, str(gsm8k_dir)).to_list()
        assert len(expected) == (64 if split == "train" else 32)
        assert grpo_demo.get_gsm8k_questions(split, str(hub)).to_list() == expected
        assert grpo_demo.get_gsm8k_questions(split, str(hub / "main")).to_list() == expected
    monkeypatch.chdir(tmp_path)  # the default output folder, outputs/..., is made here
    assert resolved(["--dataset", str(hub)]).dataset == str(hub)  # the settings' check finds it too
    (tmp_path / "empty").mkdir()
    message = refused(["--dataset", str(tmp_path / "empty")])
    assert f"dataset={tmp_path / 'empty'}: no train.jsonl there, nor the Hub's main/train-*.parquet (a GSM8K" in message
    (tmp_path / "cut" / "main").mkdir(parents=True)
    (tmp_path / "cut" / "main" / "test-00000-of-00001.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(RecipeError, match=r"test-00000-of-00001.parquet: cannot be read as parquet \("):
        grpo_demo.get_gsm8k_questions("test", str(tmp_path / "cut"))


def test_the_smoke_problems_are_the_same_on_every_machine():
    """The smoke preset's problems (and the tiny model's tokenizer, trained on them) are what tests and benchmarks
    compare against: the same rows from the same seed, five kinds of problem in GSM8K's format."""
    import hashlib

    train, test = smoke.make_problems(64, 0), smoke.make_problems(32, 1)
    assert train[0] == {
        "question": "Each of the shells costs $9. How much do 10 of them cost?",
        "answer": "They cost 10 * 9 = $<<10*9=90>>90.\n#### 90",
    }
    digest = hashlib.sha256(json.dumps([train, test]).encode()).hexdigest()
    assert digest == "6d1508eda349c9f30ee063f16369472c6b1b0fbbe66eda237cf14a007775a429"


def test_prompts_over_the_cap_are_dropped_and_logged(tmp_path, caplog):
    folder = smoke.write_gsm8k_folder(tmp_path / "gsm8k", n_train=6, n_test=1)
    long_question = "How many apples are there " + "and more apples " * 200 + "?"
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    rows[2]["question"] = long_question
    write_rows(folder, rows)
    tokenizer = smoke.build_tokenizer(smoke.corpus(grpo_demo.ANSWER_FORMAT, rows), grpo_demo.ANSWER_FORMAT.tags)
    data = grpo_demo.get_gsm8k_questions("train", str(folder))
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        kept = grpo_demo.drop_long_prompts(data, tokenizer, max_tokens=256)
    assert len(kept) == 5
    assert long_question not in kept["question"]
    assert "1 over 256 tokens dropped (rows [2])" in caplog.text


def test_every_prompt_over_the_cap_stops_the_run(tmp_path, tiny):
    data = grpo_demo.get_gsm8k_questions("train", str(smoke.write_gsm8k_folder(tmp_path / "g", n_train=4, n_test=1)))
    with pytest.raises(RecipeError, match="Every prompt is over 10 tokens: nothing to train on. Raise --max_prompt"):
        grpo_demo.drop_long_prompts(data, tiny[0], max_tokens=10)


def test_the_same_data_gives_the_same_fingerprint_and_other_data_another(tmp_path):
    a, b, c = (
        grpo_demo.get_gsm8k_questions("train", str(smoke.write_gsm8k_folder(tmp_path / name, 8, 1, seed=seed)))
        for name, seed in (("a", 1), ("b", 1), ("c", 2))
    )
    assert data_fingerprint(a) == data_fingerprint(b) != data_fingerprint(c)


def test_data_smaller_than_one_step_stops_the_run(tmp_path):
    from types import SimpleNamespace

    from grpo_kit import checks

    data = grpo_demo.get_gsm8k_questions("train", str(smoke.write_gsm8k_folder(tmp_path / "g", n_train=3, n_test=1)))
    args = SimpleNamespace(generation_batch_size=64, num_generations=16)
    with pytest.raises(RecipeError, match="3 training prompts, and one step takes 4 .generation_batch_size 64"):
        checks.enough_data(data, args)
    checks.enough_data(data, SimpleNamespace(generation_batch_size=48, num_generations=16))  # 3 is enough


def test_resuming_on_other_data_is_refused(tmp_path):
    from types import SimpleNamespace

    from grpo_kit import runs
    from grpo_kit.runs import write_run_record

    folder = smoke.write_gsm8k_folder(tmp_path / "g", n_train=8, n_test=1)
    data = grpo_demo.get_gsm8k_questions("train", str(folder))
    write_run_record(str(tmp_path / "run"), {}, data, seed=0)
    args = SimpleNamespace(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    runs.same_data(data, SimpleNamespace(allow_changed_settings=False), args)  # the same: fine
    edited = grpo_demo.get_gsm8k_questions("train", str(smoke.write_gsm8k_folder(tmp_path / "h", 8, 1, seed=5)))
    with pytest.raises(RecipeError, match="the training data differ from the run's start: 8 rows, sha256"):
        runs.same_data(edited, SimpleNamespace(allow_changed_settings=False), args)
    runs.same_data(edited, SimpleNamespace(allow_changed_settings=True), args)  # told to go on


def test_resuming_with_other_fixed_settings_than_the_run_record_holds_is_refused(tmp_path, monkeypatch):
    """The record is the one a run writes (its settings as the recipe hands them to `runs.start`); a resume with the
    same settings goes on, one that changes a fixed setting of any section (training, model, run) is refused."""
    import torch
    from safetensors.torch import save_file

    from grpo_kit import runs, settings

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    data = grpo_demo.get_gsm8k_questions("train", str(smoke.write_gsm8k_folder(tmp_path / "g", n_train=8, n_test=1)))
    start = ["--output_dir", str(out), "--learning_rate", "2e-5", "--use_peft", "--lora_r", "8", "--dataset", "g"]
    run, training_args, model_args = grpo_demo.parse_settings(start)
    runs.write_run_record(out, {"run": run, "training": training_args, "model": model_args}, data, seed=0)
    checkpoint = out / "checkpoint-2"  # a complete one, as the trainer saves it
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    save_file({"w": torch.zeros(4)}, checkpoint / "adapter_model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({}, checkpoint / name)

    def resumed(*changed: str) -> dict:
        argv = [*start, "--resume_from_checkpoint", "latest", *changed]
        return settings.resolve(argv, grpo_demo.recipe_defaults(), grpo_demo.REWARD_FUNCS)

    assert resumed()["resume_from_checkpoint"] == str(checkpoint)  # the settings it started with
    for changed, line in [
        (["--learning_rate", "1e-4"], "learning_rate: 2e-05 -> 0.0001"),
        (["--lora_r", "16"], "lora_r: 8 -> 16"),
        (["--max_prompt_tokens", "128"], "max_prompt_tokens: 256 -> 128"),
    ]:
        with pytest.raises(RecipeError, match="with settings its run did not start with") as stop:
            resumed(*changed)
        assert f"  - {line}\n" in str(stop.value)
        assert resumed(*changed, "--allow_changed_settings", "true")["resume_from_checkpoint"] == str(checkpoint)
    assert resumed("--dataset", str(tmp_path / "g"))["resume_from_checkpoint"]  # the same folder, written otherwise
    with pytest.raises(RecipeError, match=r"  - dataset: \S+/g -> \S+/other\n"):
        resumed("--dataset", str(smoke.write_gsm8k_folder(tmp_path / "other", n_train=8, n_test=1)))


def test_a_line_nested_deeper_than_the_parser_goes_is_dropped(tmp_path, caplog):
    good = json.dumps({"question": "How many?", "answer": "#### 3"}).encode()
    deep = b'{"a": ' * 200_000 + b"1" + b"}" * 200_000  # a RecursionError in some builds, an odd object in others
    (tmp_path / "train.jsonl").write_bytes(good + b"\n" + deep + b"\n")
    with caplog.at_level("WARNING", logger="grpo_demo"):
        assert grpo_demo.get_gsm8k_questions("train", str(tmp_path))["answer"] == ["3"]
    assert "train.jsonl lines [2])" in caplog.text


def test_validation_rows_are_held_out_of_training_the_same_for_every_run(gsm8k_dir):
    """--validation_rows 16: 16 train rows drawn once (a fixed seed, whatever the training seed) for validation, the
    other 48 trained on; none in both."""
    from collections import Counter

    from grpo_kit.data import hold_out

    rows = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))

    def pairs(data):
        return Counter(zip(data["question"], data["answer"], strict=True))

    train, validation = hold_out(rows, 16)
    assert (len(train), len(validation)) == (48, 16)
    assert pairs(train) + pairs(validation) == pairs(rows)  # every row in exactly one of the two
    again_train, again_validation = hold_out(rows, 16)
    assert pairs(again_validation) == pairs(validation) and pairs(again_train) == pairs(train)  # one draw
    assert validation["question"] != rows["question"][:16]  # drawn, not the first rows
    assert hold_out(rows, 0) == (rows, None)
    with pytest.raises(RecipeError, match="validation_rows=64: the train split has 64 usable rows: hold out fewer"):
        hold_out(rows, 64)


def long_test_question_folder(tmp_path):
    """GSM8K-format data whose test row 1 is a 40 KB question."""
    folder = smoke.write_gsm8k_folder(tmp_path / "gsm8k", n_train=8, n_test=4)
    rows = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    rows[1]["question"] = "How many apples are there " + "and more apples " * 2500 + "?"
    write_rows(folder, rows, split="test")
    return folder


def test_evaluation_rows_over_the_cap_are_dropped_as_train_rows_are(tmp_path, tiny_dir, monkeypatch, caplog):
    from grpo_kit import evaluation

    monkeypatch.chdir(tmp_path)
    folder = long_test_question_folder(tmp_path)
    args = ["--model_name_or_path", str(tiny_dir), "--dataset", str(folder), "--max_completion_length", "8"]
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        summaries = grpo_demo.main([*args, "--eval_only", "--output_dir", "eval-run"])
    assert [summary["n"] for summary in summaries] == [3]
    assert "Test prompts: 4 rows" in caplog.text and "1 over 256 tokens dropped (rows [1])" in caplog.text

    run, training_args, model_args = grpo_demo.parse_settings([*args, "--output_dir", "train-run"])  # a training run's
    tokenizer = models.load_tokenizer(model_args, training_args)
    trainer = SimpleNamespace(processing_class=tokenizer, model=None, args=training_args)
    test = grpo_demo.get_gsm8k_questions("test", str(folder))
    plan = evaluation.measurement_plan(run, training_args, grpo_demo.ANSWER_FORMAT, training=True)
    callback = evaluation.callback(trainer, test, plan, grpo_demo.ANSWER_FORMAT)
    assert len(callback.rows) == 3 and test[1]["question"] not in [row["question"] for row in callback.rows]
    run, training_args, _ = grpo_demo.parse_settings([*args, "--output_dir", "train-run", "--eval_limit", "2"])
    plan = evaluation.measurement_plan(run, training_args, grpo_demo.ANSWER_FORMAT, training=True)
    limited = evaluation.callback(trainer, test, plan, grpo_demo.ANSWER_FORMAT)
    assert limited.rows == callback.rows[:2]  # --eval_limit: the first rows of those kept


def test_every_evaluation_row_over_the_cap_stops_the_run(tmp_path, tiny):
    data = grpo_demo.get_gsm8k_questions("test", str(smoke.write_gsm8k_folder(tmp_path / "g", n_train=4, n_test=2)))
    with pytest.raises(RecipeError) as stop:
        grpo_demo.drop_long_prompts(data, tiny[0], max_tokens=10, split="test")
    assert (
        str(stop.value) == "Every test prompt is over 10 tokens: no test question to measure. Raise --max_prompt_tokens"
    )


def run_settings(**changed):
    settings = dict(eval_only=False, final_eval=True, eval_every_steps=0, eval_split="test", validation_rows=0)
    return SimpleNamespace(**{**settings, **changed})


@pytest.mark.parametrize(
    ("case", "split", "validation_rows", "trained"),
    [
        ("test repeated in train", "test", 0, 62),  # two test questions, one with other spaces and case, in train
        ("train row twice", "validation", 16, None),  # a row's copy held out: its twin not trained on either
    ],
)
def test_no_measured_question_is_trained_on(gsm8k_dir, tmp_path, caplog, case, split, validation_rows, trained):
    from grpo_kit import data

    rows = [json.loads(line) for line in (gsm8k_dir / "train.jsonl").read_text().splitlines()]
    tests = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text().splitlines()]
    if case == "test repeated in train":
        rows[5] = dict(tests[0])
        rows[9] = dict(tests[1], question="  " + tests[1]["question"].upper().replace(" ", "  "))
    else:
        rows += rows  # every row twice: each held-out row has a twin that must not train
    folder = write_rows(tmp_path / "gsm8k", rows)
    write_rows(tmp_path / "gsm8k", tests, split="test")

    def load(which):
        return grpo_demo.get_gsm8k_questions(which, folder)

    with caplog.at_level(logging.WARNING, logger="grpo_demo"):
        train, measured = data.splits(run_settings(eval_split=split, validation_rows=validation_rows), load)
    asked = {" ".join(q.split()).casefold() for q in measured["question"]}
    assert not asked & {" ".join(q.split()).casefold() for q in train["question"]}
    assert len(train) == (trained if trained is not None else len(rows) - 2 * len(asked))  # both copies out
    assert "ask a question the" in caplog.text
    # the same train rows whatever the run measures (a resume with --final_eval false trains on the same data)
    quiet = data.splits(run_settings(eval_split="test", final_eval=False, validation_rows=validation_rows), load)[0]
    assert quiet["question"] == train["question"]

    write_rows(tmp_path / "copy", tests)  # a train file that is the test file
    write_rows(tmp_path / "copy", tests, split="test")
    with pytest.raises(RecipeError, match="Every train question is also a test question"):
        data.splits(run_settings(), lambda which: grpo_demo.get_gsm8k_questions(which, str(tmp_path / "copy")))
