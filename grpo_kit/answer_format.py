"""What the machinery needs to know of a recipe's answer format, handed over by the recipe itself.

The recipe owns its format (tags, system prompt, extraction, format checks) and passes an `AnswerFormat` to the
evaluation, `--ask` and the offline presets. Nothing here imports the recipe, so a copied and edited recipe
(another file name, `<think>` tags) evaluates, asks and builds its offline assets in its own format.

The tags are settings (`--reasoning_tag`, `--answer_tag`, the recipe's constants by default): `Tags` holds a run's,
and `bind` fixes them in a recipe function (a reward) without changing its name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Tags:
    """The names of a completion's two blocks (`reasoning`, `answer`), and the tags as written."""

    reasoning: str
    answer: str

    @property
    def r_open(self) -> str:
        return f"<{self.reasoning}>"

    @property
    def r_close(self) -> str:
        return f"</{self.reasoning}>"

    @property
    def a_open(self) -> str:
        return f"<{self.answer}>"

    @property
    def a_close(self) -> str:
        return f"</{self.answer}>"

    @property
    def written(self) -> tuple[str, str, str, str]:
        """(reasoning open, reasoning close, answer open, answer close), as `AnswerFormat.tags` holds them."""
        return self.r_open, self.r_close, self.a_open, self.a_close


def bind(func: Callable, **keywords) -> Callable:
    """`func` with `keywords` fixed, keeping its name and docstring (TRL logs a reward as `rewards/<name>/mean`)."""
    return functools.update_wrapper(functools.partial(func, **keywords), func)


@dataclass(frozen=True)
class AnswerFormat:
    chat_prompt: Callable[[str], list[dict]]  # question -> the messages the model answers (system + user)
    solution_template: str  # str.format template with {reasoning} and {answer}: a perfectly formatted completion
    tags: tuple[str, str, str, str]  # reasoning open / close, answer open / close, as written in a completion
    extract_answer: Callable[[str], str]  # completion -> the content of its answer block, "" without one
    is_strict_format: Callable[[str], bool]  # completion -> whether it is exactly in the format
    is_soft_format: Callable[[str], bool]  # completion -> whether it holds a reasoning block, then an answer block

    def format_solution(self, reasoning: str, answer: str) -> str:
        return self.solution_template.format(reasoning=reasoning, answer=answer)

    def gsm8k_solution(self, gsm8k_answer: str) -> str:
        """A GSM8K answer (`reasoning...\\n#### N`) written in this format."""
        reasoning, _, answer = gsm8k_answer.rpartition("####")
        return self.format_solution(reasoning.strip(), answer.strip())

    def prompt_texts(self, question: str) -> list[str]:
        """The texts of the messages the model is shown for `question`."""
        return [message["content"] for message in self.chat_prompt(question)]
