"""Numbers as people write them in math answers: exact parsing, with no regard for any answer format. The
recipe's rewards and the evaluation both read answers through these functions: a number counts the same in both."""

import re
from decimal import Decimal
from fractions import Fraction

# A number as people write it: thousands separators only in groups of three, an optional sign and decimals.
NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+", re.ASCII)
# An integer written the way GSM8K's gold answers are: 72, -3, 1,080.
GSM8K_INT_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)", re.ASCII)
BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
# `-$5` is minus five dollars: the sign is the number's (`10 - $5`, spaced, is a subtraction and stays one).
SIGN_BEFORE_CURRENCY_RE = re.compile(r"(?<![\w)])-[$€£](?=[\d.])")
MAX_ANSWER_CHARS = 300  # an answer block is a number and perhaps a short sentence; longer is an essay, not an answer
MAX_NUMBER_CHARS = 40  # far beyond any GSM8K answer; keeps arbitrary-precision parsing cheap


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number when it is one (`1,080`, `-3`, `18.00`, `.5`), else None."""
    text = str(text).strip()
    if len(text) > MAX_NUMBER_CHARS or not NUMBER_RE.fullmatch(text):
        return None
    return Fraction(Decimal(text.replace(",", "")))


def answer_number(answer: str) -> Fraction | None:
    """The one number an answer commits to, else None: `\\boxed{...}` is looked into; currency signs, units and
    words around a single number are ignored (`$1,080.00 in total.` is 1080). An answer with no number, with two
    different ones (`18 or 20`, `3 * 6 = 18`), or longer than MAX_ANSWER_CHARS commits to nothing."""
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    answer = SIGN_BEFORE_CURRENCY_RE.sub("-", (BOXED_RE.findall(answer) or [answer])[-1])  # `-$5` is -5
    numbers = {parse_number(n) for n in NUMBER_RE.findall(answer)}
    return numbers.pop() if len(numbers) == 1 else None


def is_gsm8k_integer(text: str) -> bool:
    """Whether `text` is exactly an integer as GSM8K writes its answers: `72`, `-3`, `1,080`."""
    return len(text) <= MAX_ANSWER_CHARS and GSM8K_INT_RE.fullmatch(text) is not None


def last_number(text: str) -> str | None:
    """The last number anywhere in `text`, as written (`1,080`, `-3`, `18.50`), else None."""
    return (NUMBER_RE.findall(SIGN_BEFORE_CURRENCY_RE.sub("-", text)) or [None])[-1]
