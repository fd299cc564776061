"""How a GSM8K question is put to the model and how its answer is read: the evaluation protocols.

- `recipe`: the recipe's system prompt (its answer format), zero-shot. Strict: the number in the answer block (what
  the correctness reward pays for); lenient: the last number anywhere. The number that says whether GRPO taught
  the format and the answers; a start model that has not learned the format yet scores low on it.
- `kshot`: GSM8K's own answer style. `shots` worked solutions from the train split (drawn with a fixed seed, never
  from the test split, the same for every question) as earlier chat turns, then the question. Strict: the number
  after `####`; flexible: the last number (lm-evaluation-harness's `strict-match` / `flexible-extract`). Measures
  the model's arithmetic without a format it has not learned.
- `chat`: the question alone, as a user asks it, the way instruct models are usually reported. Strict: the last
  `\\boxed{}`; lenient: that, or else the last number.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from grpo_kit.numbers import last_number

PROTOCOLS = ("recipe", "kshot", "chat")
HASH_ANSWER_RE = re.compile(r"####\s*(-?[$\d][\d,]*(?:\.\d+)?)")
BOXED = "\\boxed{"


@dataclass(frozen=True)
class Protocol:
    name: str
    prompt: Callable[[str], list[dict]]  # question -> the messages the model answers
    strict: Callable[[str], str | None]  # completion -> the answer it commits to in this protocol's form
    lenient: Callable[[str], str | None]  # completion -> the answer read more leniently (the last number...)
    judges_format: bool  # whether the recipe's format checks mean anything here
    details: dict = field(default_factory=dict)  # what the summary records of it (shots, seed, exemplars)


def hash_answer(completion: str) -> str | None:
    """The number after the first `####` (lm-evaluation-harness's strict-match), None without one."""
    match = HASH_ANSWER_RE.search(completion)
    return match[1] if match else None


def boxed(completion: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces inside balanced), None without a closed one."""
    start = completion.rfind(BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(BOXED)
    for j in range(i, len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[j], 0)
        if depth == 0:
            return completion[i:j].strip()
    return None


def exemplars(train_rows, shots: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    """`shots` train rows with a worked solution, drawn with `seed` (the same draw every run), none whose question
    is in `exclude` (the test questions)."""
    pool = [row for row in train_rows if row.get("solution") and row["question"] not in exclude]
    if len(pool) < shots:
        raise ValueError(f"k-shot needs {shots} train rows with solutions, and there are {len(pool)}")
    return random.Random(seed).sample(pool, shots)


def _question_alone(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def _said(solution: str) -> dict:
    return {"role": "assistant", "content": solution}


def build(name: str, answer_format, *, train_rows=None, test_questions=(), shots: int = 8, seed: int = 0) -> Protocol:
    """The protocol called `name` (one of PROTOCOLS) for the recipe's `answer_format`."""
    if name == "recipe":
        return Protocol(
            "recipe", answer_format.chat_prompt, lambda c: answer_format.extract_answer(c) or None, last_number, True
        )
    if name == "chat":
        return Protocol("chat", _question_alone, boxed, lambda c: boxed(c) or last_number(c), False)
    if name == "kshot":
        shown = exemplars(train_rows or [], shots, seed, exclude=set(test_questions))
        turns = [turn for row in shown for turn in (*_question_alone(row["question"]), _said(row["solution"]))]
        digest = hashlib.sha256("\n".join(row["question"] for row in shown).encode()).hexdigest()[:16]
        return Protocol(
            "kshot",
            lambda q: [*turns, *_question_alone(q)],
            hash_answer,
            last_number,
            False,
            {"shots": shots, "seed": seed, "exemplars_sha256": digest},
        )
    raise ValueError(f"no evaluation protocol {name!r}: one of {', '.join(PROTOCOLS)}")
