"""Data prep on generated GSM8K-format rows: chat prompts, canonical answers, the prompt-length cap."""

from __future__ import annotations

import json
import logging

import grpo_demo
from grpo_kit.smoke import build_tokenizer, write_gsm8k_folder


def _write_rows(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_rows_become_system_then_user_prompts_with_canonical_answers(tmp_path):
    folder = _write_rows(
        tmp_path / "gsm8k",
        [
            {"question": "How many?", "answer": "4 + 5 = <<4+5=9>>9\n#### 9"},
            {"question": "How much?", "answer": "It is 1,080.\n#### 1,080"},
            {"question": "What change?", "answer": "It drops by 3.\n#### -3"},
        ],
    )
    data = grpo_demo.get_gsm8k_questions("train", str(folder))
    assert data["answer"] == ["9", "1080", "-3"]
    assert data[0]["prompt"] == [
        {"role": "system", "content": grpo_demo.SYSTEM_PROMPT},
        {"role": "user", "content": "How many?"},
    ]


def test_prompts_over_the_cap_are_dropped_and_logged(tmp_path, caplog):
    folder = write_gsm8k_folder(tmp_path / "gsm8k", n_train=6, n_test=1)
    long_question = "How many apples are there " + "and more apples " * 200 + "?"
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    rows[2]["question"] = long_question
    _write_rows(folder, rows)
    tokenizer = build_tokenizer([grpo_demo.SYSTEM_PROMPT] + [r["question"] for r in rows])
    data = grpo_demo.get_gsm8k_questions("train", str(folder))
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        kept = grpo_demo.drop_long_prompts(data, tokenizer, max_tokens=256)
    assert len(kept) == 5
    assert long_question not in kept["question"]
    assert "1 over 256 tokens dropped (rows [2])" in caplog.text
