"""What the machinery needs to know of a recipe's answer format, handed over by the recipe itself.

The recipe owns its format (tags, system prompt, extraction, format checks) and passes an `AnswerFormat` to the
evaluation, `--ask` and the offline presets. Nothing here imports the recipe, so a copied and edited recipe
(another file name, `<think>` tags) evaluates, asks and builds its offline assets in its own format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
