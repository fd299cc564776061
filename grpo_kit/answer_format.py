"""The recipe's answer format as the machinery sees it, handed over by the recipe (an `AnswerFormat`): nothing here
imports the recipe, so a copied and edited one (another file name, `<think>` tags) evaluates, asks and builds its
offline assets in its own format. `Tags` holds a run's tags (`--reasoning_tag`, `--answer_tag`); `bind` fixes them
in a recipe function (a reward) without changing its name."""

import functools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Tags:
    """The names of a completion's two blocks (`reasoning`, `answer`), and the tags as written."""

    reasoning: str
    answer: str
    r_open = property(lambda self: f"<{self.reasoning}>")
    r_close = property(lambda self: f"</{self.reasoning}>")
    a_open = property(lambda self: f"<{self.answer}>")
    a_close = property(lambda self: f"</{self.answer}>")
    written = property(lambda self: (self.r_open, self.r_close, self.a_open, self.a_close))  # as AnswerFormat.tags


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

    def gsm8k_solution(self, gsm8k_answer: str) -> str:
        """A GSM8K answer (`reasoning...\\n#### N`) written in this format."""
        reasoning, _, answer = gsm8k_answer.rpartition("####")
        return self.solution_template.format(reasoning=reasoning.strip(), answer=answer.strip())
