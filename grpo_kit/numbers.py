"""Numbers as people write them in math answers: exact parsing, with no regard for any answer format. The
recipe's rewards and the evaluation both read answers through these functions: a number counts the same in both."""

import re
from decimal import Decimal
from fractions import Fraction

# Minus signs other than the hyphen-minus, read as one: U+2212 MINUS SIGN, the en and figure dashes, the hyphens
# U+2010/U+2011, the small, full-width and heavy minus, the modifier minus. Not the em dash or the horizontal bar: a
# model writes those as punctuation ("the answer\u20145 apples").
MINUS_SIGNS = str.maketrans(dict.fromkeys("\u2212\u2013\u2012\u2010\u2011\ufe63\uff0d\u2796\u02d7", "-"))
# A sign, where one is: a minus right after a digit is a range or a subtraction (`3-4 hours`, `10-5`), not a sign.
_SIGN = r"(?:(?<!\d)-)?"
# A number as people write it: thousands separators only in groups of three, an optional sign and decimals.
NUMBER_RE = re.compile(_SIGN + r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|" + _SIGN + r"\.\d+", re.ASCII)
# An integer written the way GSM8K's gold answers are: 72, -3, 1,080.
GSM8K_INT_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)", re.ASCII)
BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
# `-$5` is minus five dollars: the sign is the number's (`10 - $5`, spaced, is a subtraction and stays one).
SIGN_BEFORE_CURRENCY_RE = re.compile(r"(?<![\w)])-[$€£](?=[\d.])")
MAX_ANSWER_CHARS = 300  # an answer block is a number and perhaps a short sentence; longer is an essay, not an answer
MAX_NUMBER_CHARS = 40  # far beyond any GSM8K answer; keeps arbitrary-precision parsing cheap


def signs(text: str) -> str:
    """`text` with every minus sign of MINUS_SIGNS written `-` (`\u22125` is `-5`); the same length, nothing else."""
    return text.translate(MINUS_SIGNS)


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number when it is one (`1,080`, `-3`, `18.00`, `.5`), else None."""
    text = signs(str(text)).strip()
    if len(text) > MAX_NUMBER_CHARS or not NUMBER_RE.fullmatch(text):
        return None
    return Fraction(Decimal(text.replace(",", "")))


def answer_number(answer: str) -> Fraction | None:
    """The one number an answer commits to, else None: `\\boxed{...}` is looked into; currency signs, units and
    words around a single number are ignored (`$1,080.00 in total.` is 1080). An answer with no number, with two
    different ones (`18 or 20`, `3 * 6 = 18`), or longer than MAX_ANSWER_CHARS commits to nothing."""
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    answer = SIGN_BEFORE_CURRENCY_RE.sub("-", signs((BOXED_RE.findall(answer) or [answer])[-1]))  # `-$5` is -5
    numbers = {parse_number(n) for n in NUMBER_RE.findall(answer)}
    return numbers.pop() if len(numbers) == 1 else None


def is_gsm8k_integer(text: str) -> bool:
    """Whether `text` is exactly an integer as GSM8K writes its answers: `72`, `-3`, `1,080`."""
    return len(text) <= MAX_ANSWER_CHARS and GSM8K_INT_RE.fullmatch(signs(text)) is not None


def last_number(text: str) -> str | None:
    """The last number anywhere in `text`, as written (`1,080`, `-3`, `18.50`), else None."""
    return (NUMBER_RE.findall(SIGN_BEFORE_CURRENCY_RE.sub("-", signs(text))) or [None])[-1]
