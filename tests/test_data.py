"""Data prep on GSM8K-format files: chat prompts and canonical answers, bad rows named and dropped, bad files named,
the prompt-length cap, and the training data's fingerprint."""

from __future__ import annotations

import json
import logging

import pytest

import grpo_demo
from grpo_kit import smoke
from grpo_kit.record import data_fingerprint


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
]


def test_bad_rows_are_counted_named_and_dropped(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="grpo_demo"):
        data = grpo_demo.get_gsm8k_questions("train", write_rows(tmp_path / "d", BAD_ROWS))
    assert data["question"] == ["Good one", "Another good one"]
    assert data["answer"] == ["4", "1000"]
    assert "1 train rows with no '####' answer (row ids [1])" in caplog.text
    assert "1 train rows with an empty question (row ids [2])" in caplog.text
    assert "2 train rows with a gold answer that is no number (row ids [3, 5])" in caplog.text


def test_strict_data_stops_on_the_first_kind_of_bad_row(tmp_path):
    with pytest.raises(SystemExit, match=r"Bad data: 1 train rows with no '####' answer \(row ids \[1\]\)"):
        grpo_demo.get_gsm8k_questions("train", write_rows(tmp_path / "d", BAD_ROWS), strict=True)


def test_nothing_left_after_filtering_stops_with_a_message(tmp_path):
    with pytest.raises(SystemExit, match="No usable train rows"):
        grpo_demo.get_gsm8k_questions("train", write_rows(tmp_path / "d", BAD_ROWS[1:4]))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"question": "q", "answer": "#### 1"}\n{"question": \n', "train.jsonl, line 2: not valid JSON"),
        (b'["question", "answer"]\n', "train.jsonl, line 1: a list, not an object like GSM8K's rows"),
        (b'{"question": "caf\xe9", "answer": "#### 1"}\n', "train.jsonl: not UTF-8 text (byte 17)"),
    ],
)
def test_a_bad_file_is_named_with_its_line(tmp_path, content, message):
    (tmp_path / "train.jsonl").write_bytes(content)
    with pytest.raises(SystemExit) as stop:
        grpo_demo.get_gsm8k_questions("train", str(tmp_path))
    assert message in str(stop.value)


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(b'\xef\xbb\xbf{"question": "How many?", "answer": "#### 3"}\n')
    assert grpo_demo.get_gsm8k_questions("train", str(tmp_path))["answer"] == ["3"]


def test_a_folder_without_the_split_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--dataset .*: no test.jsonl there"):
        grpo_demo.get_gsm8k_questions("test", write_rows(tmp_path / "d", BAD_ROWS))


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
    with pytest.raises(SystemExit, match="Every prompt is over 10 tokens: nothing to train on. Raise --max_prompt"):
        grpo_demo.drop_long_prompts(data, tiny[0], max_tokens=10)


def test_the_same_data_gives_the_same_fingerprint_and_other_data_another(tmp_path):
    a, b, c = (
        grpo_demo.get_gsm8k_questions("train", str(smoke.write_gsm8k_folder(tmp_path / name, 8, 1, seed=seed)))
        for name, seed in (("a", 1), ("b", 1), ("c", 2))
    )
    assert data_fingerprint(a) == data_fingerprint(b) != data_fingerprint(c)
