"""The answer parsing and the five rewards, against the rules they promise.

Tables of inputs, each with a comment saying why it earns what it earns, compared by exact equality
(pytest.approx only where a penalty of 0.001 per character makes float arithmetic inexact); then properties
over arbitrary text (never raising, always in range, on 1 MB adversarial completions too) and no printing. The
`<think>` variant (one edited constant in a copy of the recipe) is tested where the copy runs: test_runs.py.
Timing on the same adversarial completions (tests/adversarial_completions.py) is a benchmark:
benchmarks/reward_worst_case.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from adversarial_completions import ADVERSARIAL
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_demo import (
    REWARD_FUNCS,
    REWARD_ROLES,
    answer_number,
    correctness_reward_func,
    extract_hash_answer,
    extract_xml_answer,
    int_reward_func,
    parse_number,
    soft_format_reward_func,
    strict_format_reward_func,
    xmlcount_reward_func,
)
from grpo_kit.numbers import MAX_ANSWER_CHARS


def chat(text: str) -> list[dict]:
    """One completion as TRL passes it in conversational mode."""
    return [{"role": "assistant", "content": text}]


def score(func, text: str, gold: str | None = "18") -> float:
    """The reward of one completion, called the way GRPOTrainer calls it (extra kwargs included)."""
    rewards = func(prompts=[[]], completions=[chat(text)], answer=[gold], completion_ids=[[0]], trainer_state=None)
    assert isinstance(rewards, list) and len(rewards) == 1
    return rewards[0]


def formatted(answer: str, reasoning: str = "Some steps.", end: str = "\n") -> str:
    """A completion in the exact format the prompt asks for."""
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>{end}"


GOOD = formatted("18")

# ----------------------------------------------------------------------------------------------------------------
# Parsing

EXTRACT_XML_ANSWER = [
    ("<answer>\n18\n</answer>", "18"),  # the block's content, stripped
    ("<answer>18</answer>", "18"),  # no newlines needed
    (GOOD, "18"),  # a whole formatted completion
    ("<answer> 3 apples\nand a pear </answer>", "3 apples\nand a pear"),  # inner line breaks kept
    ("<answer>1</answer> then <answer>2</answer>", "2"),  # the last block wins
    ("<answer>1</answer> then <answer>2", "1"),  # ... the last *complete* block
    ("<answer><answer>5</answer>", "5"),  # nested open tags: the one nearest the close
    ("<answer>\n18", ""),  # unclosed block
    ("18</answer>", ""),  # a close without an open
    ("</answer><answer>", ""),  # tags in the wrong order
    ("The answer is 18.", ""),  # no block at all
    ("", ""),  # empty completion
    ("<ANSWER>18</ANSWER>", ""),  # tags are case-sensitive
]


@pytest.mark.parametrize("text, expected", EXTRACT_XML_ANSWER)
def test_extract_xml_answer(text, expected):
    assert extract_xml_answer(text) == expected


EXTRACT_HASH_ANSWER = [
    ("She makes 9 * 2 = <<9*2=18>>18 dollars.\n#### 18", "18"),  # a GSM8K gold answer
    ("...\n#### 1,080", "1080"),  # thousands separators dropped
    ("...\n#### 109,200,000", "109200000"),  # ... all of them
    ("...\n#### -3", "-3"),  # the sign kept
    ("...\n####  42 \n", "42"),  # surrounding whitespace stripped
    ("a #### b\n#### 7", "7"),  # the text after the last marker
    ("The answer is 18.", None),  # no marker: no gold answer
    ("", None),  # empty text
]


@pytest.mark.parametrize("text, expected", EXTRACT_HASH_ANSWER)
def test_extract_hash_answer(text, expected):
    assert extract_hash_answer(text) == expected


PARSE_NUMBER = [
    ("18", Fraction(18)),  # an integer
    ("-3", Fraction(-3)),  # a negative one
    ("1,080", Fraction(1080)),  # thousands separator
    ("109,200,000", Fraction(109200000)),  # several
    ("18.00", Fraction(18)),  # trailing zeros are the same number
    ("12,345.5", Fraction(24691, 2)),  # separators and decimals together
    (".5", Fraction(1, 2)),  # no leading zero
    ("-0.25", Fraction(-1, 4)),  # exact, not a float
    (" 7\n", Fraction(7)),  # surrounding whitespace ignored
    ("1" * 40, Fraction(int("1" * 40))),  # MAX_NUMBER_CHARS digits still parse
    ("1" * 41, None),  # longer: refused, keeps arbitrary precision cheap
    ("1,08", None),  # separators only in groups of three
    ("1080,", None),  # a trailing separator
    ("1.2.3", None),  # two decimal points
    ("+5", None),  # GSM8K writes no plus sign
    ("$18", None),  # a whole string must be a number: answer_number looks around it
    ("18 apples", None),  # ditto
    ("1e3", None),  # no exponents
    ("nan", None),  # Decimal would take it; we do not
    ("Infinity", None),  # ditto
    ("١٨", None),  # Arabic-Indic digits: ASCII only
    ("\u22123", Fraction(-3)),  # U+2212 MINUS SIGN is a minus
    ("\u20133", Fraction(-3)),  # so is an en dash before a number
    ("\uff0d0.5", Fraction(-1, 2)),  # and a full-width hyphen-minus
    ("\u20143", None),  # an em dash is punctuation, not a sign
    ("", None),  # nothing
]


@pytest.mark.parametrize("text, expected", PARSE_NUMBER)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


ANSWER_NUMBER = [
    ("18", Fraction(18)),  # a bare number
    ("$1,080.00 in total.", Fraction(1080)),  # currency, separator, zeros, words and period around one number
    ("The answer is 18.", Fraction(18)),  # a short sentence
    ("-3 degrees", Fraction(-3)),  # a negative number with a unit
    ("50%", Fraction(50)),  # a percent sign is a unit
    ("18 (that is, 18.0)", Fraction(18)),  # the same number twice is still one number
    ("\\boxed{18}", Fraction(18)),  # boxed
    ("\\boxed{20}, not 18", Fraction(20)),  # the boxed number is the commitment
    ("\\boxed{}", None),  # an empty box commits to nothing
    ("18 or 20", None),  # two different numbers
    ("3 * 6 = 18", None),  # working, not an answer
    ("\u22125 degrees", Fraction(-5)),  # U+2212: minus five
    ("\u2013$5", Fraction(-5)),  # an en dash before a currency sign
    ("\\boxed{\u22127}", Fraction(-7)),  # in a box too
    ("3-4 hours", None),  # a hyphen between two numbers is a range: 3 and 4, no -4
    ("3\u22124 hours", None),  # so is a minus sign there
    ("the answer\u20145", Fraction(5)),  # an em dash is punctuation
    ("eighteen", None),  # no number
    ("", None),  # empty block
    ("x" * (MAX_ANSWER_CHARS - 2) + "18", Fraction(18)),  # MAX_ANSWER_CHARS long: still an answer
    ("x" * (MAX_ANSWER_CHARS - 1) + "18", None),  # longer: an essay, not an answer
]


@pytest.mark.parametrize("answer, expected", ANSWER_NUMBER)
def test_answer_number(answer, expected):
    assert answer_number(answer) == expected


# ----------------------------------------------------------------------------------------------------------------
# The five rewards

STRICT = [
    (GOOD, 0.5),  # the exact format, final newline included
    (formatted("18", end=""), 0.5),  # no final newline: the model stopped at its end-of-turn token
    (formatted("18", reasoning="Step 1.\nStep 2.\n\nStep 3."), 0.5),  # multi-line reasoning
    (formatted("18 or\n20"), 0.5),  # a multi-line answer: format only, correctness is another reward
    (formatted("", reasoning=""), 0.5),  # empty reasoning and answer, each still on its own line
    ("<reasoning>\n</reasoning>\n<answer>\n18\n</answer>\n", 0.0),  # one newline shared by the reasoning's tags
    ("<reasoning>\nx\n</reasoning>\n<answer>\n</answer>\n", 0.0),  # one newline shared by the answer's tags
    (GOOD + "\n", 0.0),  # two final newlines
    (formatted("18", end="\r\n"), 0.0),  # a Windows line end is not the final newline
    ("\n" + GOOD, 0.0),  # a leading newline
    (" " + GOOD, 0.0),  # a leading space
    ("Sure!\n" + GOOD, 0.0),  # text before
    (GOOD + "Done.", 0.0),  # text after
    ("<reasoning>x</reasoning>\n<answer>\n18\n</answer>\n", 0.0),  # reasoning not on its own lines
    ("<reasoning>\nx\n</reasoning>\n<answer>18</answer>\n", 0.0),  # answer not on its own line
    ("<reasoning>\nx\n</reasoning>\n\n<answer>\n18\n</answer>\n", 0.0),  # a blank line between blocks
    ("<reasoning>\nx\n</reasoning><answer>\n18\n</answer>\n", 0.0),  # no newline between blocks
    ("<reasoning>\nx\n</reasoning>\n<answer>\n18\n", 0.0),  # unclosed answer
    ("<reasoning>\nx\n</reasoning>\n", 0.0),  # no answer block
    ("<answer>\n18\n</answer>\n", 0.0),  # no reasoning block
    ("<answer>\n18\n</answer>\n<reasoning>\nx\n</reasoning>\n", 0.0),  # blocks in the wrong order
    (formatted("18", reasoning="a\n<reasoning>\nb"), 0.0),  # a nested reasoning tag
    (formatted("18", reasoning="I will write </answer> last"), 0.0),  # a tag inside the reasoning
    (formatted("1\n</answer>\n<answer>\n18"), 0.0),  # two answer blocks
    (GOOD.replace("reasoning", "think"), 0.0),  # another reasoning tag
    (GOOD.upper(), 0.0),  # tags are case-sensitive
    ("", 0.0),  # empty completion
]


@pytest.mark.parametrize("text, expected", STRICT)
def test_strict_format_reward(text, expected):
    assert score(strict_format_reward_func, text) == expected


SOFT = [
    (GOOD, 0.5),  # the exact format
    (formatted("18", end=""), 0.5),  # without the final newline
    (formatted("18", reasoning="Step 1.\nStep 2.\n\nStep 3."), 0.5),  # multi-line reasoning
    ("<reasoning>x</reasoning><answer>18</answer>", 0.5),  # one line, no whitespace needed
    ("<reasoning>x</reasoning> \n\n\t <answer>18</answer>", 0.5),  # any whitespace between the blocks
    ("<reasoning>x</reasoning>\n<answer></answer>", 0.5),  # an empty answer block is still a block
    (GOOD + "\nHope this helps!", 0.5),  # text after the answer block is allowed
    ("\n " + GOOD, 0.5),  # leading whitespace is tolerated
    ("Sure! " + GOOD, 0.0),  # text before the reasoning block
    ("<reasoning>x</reasoning>\nSo:\n<answer>18</answer>", 0.0),  # text between the blocks
    ("<reasoning>a</reasoning>b</reasoning><answer>18</answer>", 0.0),  # text after the first closing tag
    ("<reasoning>x\n<answer>18</answer>", 0.0),  # reasoning never closed
    ("<reasoning>x</reasoning>\n<answer>18", 0.0),  # answer never closed
    ("<reasoning>x<answer>18</answer></reasoning>", 0.0),  # the answer inside the reasoning
    ("<reasoning>x</reasoning>", 0.0),  # no answer block
    ("<answer>18</answer>", 0.0),  # no reasoning block
    ("<answer>18</answer><reasoning>x</reasoning>", 0.0),  # blocks in the wrong order
    (GOOD.replace("reasoning", "think"), 0.0),  # another reasoning tag
    ("", 0.0),  # empty completion
]


@pytest.mark.parametrize("text, expected", SOFT)
def test_soft_format_reward(text, expected):
    assert score(soft_format_reward_func, text) == expected


XMLCOUNT = [
    (GOOD, 0.5),  # all four tags once, nothing after: the full 0.5
    (formatted("18", end=""), 0.5),  # ... the final newline is optional
    (formatted("18", reasoning="Step 1.\nStep 2."), 0.5),  # multi-line reasoning changes nothing
    (GOOD + "abc", pytest.approx(0.25 + 2 * (0.125 - 0.003))),  # 3 characters after: -0.003 on each answer tag
    (formatted("18", end="abc"), pytest.approx(0.25 + 2 * (0.125 - 0.003))),  # ... with or without the newline
    (GOOD + "\n", pytest.approx(0.25 + 2 * (0.125 - 0.001))),  # only the first newline after is free
    (GOOD + "x" * 200, 0.25),  # a long tail costs each answer tag all its 0.125, never below 0
    ("<reasoning>\nx\n</reasoning>\n<answer>\n18", 0.375),  # unclosed answer: three tags, no tail to charge
    ("<reasoning>\nx\n</reasoning>\n", 0.25),  # the reasoning block alone
    ("<reasoning>\n", 0.125),  # the opening tag alone
    ("<reasoning>\n" + GOOD, 0.375),  # the opening reasoning tag twice earns nothing for it
    (formatted("18", end="</answer>"), pytest.approx(0.25 + 2 * (0.125 - 0.009))),  # a stray tag: 9 characters
    (GOOD[:-1] + "\n</answer>\n", 0.375),  # `\n</answer>` twice: that tag earns nothing
    ("<reasoning>x</reasoning><answer>18</answer>", 0.0),  # no tag has its newlines
    (GOOD.replace("reasoning", "think"), 0.25),  # another reasoning tag: only the answer's tags count
    ("", 0.0),  # empty completion
]


@pytest.mark.parametrize("text, expected", XMLCOUNT)
def test_xmlcount_reward(text, expected):
    assert score(xmlcount_reward_func, text) == expected


INT = [
    (formatted("72"), 0.5),  # an integer
    (formatted("-3"), 0.5),  # negative, as some GSM8K gold answers are
    (formatted("1,080"), 0.5),  # a thousands separator, as many GSM8K gold answers have
    (formatted("109,200,000"), 0.5),  # several
    (formatted("0"), 0.5),  # zero
    (formatted("  72 "), 0.5),  # whitespace around it is stripped
    ("<answer>72</answer>", 0.5),  # format is another reward's business
    ("<answer>x</answer><answer>72</answer>", 0.5),  # the last block counts
    ("<answer>72</answer><answer>x</answer>", 0.0),  # ... and only the last
    (formatted("72.0"), 0.0),  # a decimal
    (formatted("3.5"), 0.0),  # ditto
    (formatted("seventy-two"), 0.0),  # words
    (formatted("72 apples"), 0.0),  # a unit: not exactly an integer
    (formatted("$72"), 0.0),  # a currency sign: ditto
    (formatted("1,08"), 0.0),  # separators only in groups of three
    (formatted("+72"), 0.0),  # GSM8K writes no plus sign
    (formatted("- 3"), 0.0),  # nor a spaced minus
    (formatted("\u22123"), 0.5),  # U+2212 MINUS SIGN is a minus
    (formatted("\u20133"), 0.5),  # so is an en dash
    (formatted("٧٢"), 0.0),  # Arabic-Indic digits: str.isdigit() says yes, GSM8K never writes them
    (formatted("²"), 0.0),  # a superscript: ditto
    (formatted("72\n73"), 0.0),  # two lines
    (formatted(""), 0.0),  # empty block
    ("72", 0.0),  # no answer block
    ("<answer>\n72", 0.0),  # unclosed answer block
]


@pytest.mark.parametrize("text, expected", INT)
def test_int_reward(text, expected):
    assert score(int_reward_func, text) == expected


CORRECTNESS = [
    (formatted("18"), "18", 2.0),  # the gold number
    (formatted("1,080"), "1080", 2.0),  # thousands separator
    (formatted("1080"), "1,080", 2.0),  # a gold answer left uncanonical is parsed too
    (formatted("$18"), "18", 2.0),  # currency sign
    (formatted("18."), "18", 2.0),  # trailing period
    (formatted("18.00"), "18", 2.0),  # trailing zeros
    (formatted("$1,080.00"), "1080", 2.0),  # all three
    (formatted("\\boxed{18}"), "18", 2.0),  # boxed
    (formatted("18 dollars"), "18", 2.0),  # a unit word
    (formatted("She makes $18 every day."), "18", 2.0),  # a short sentence around one number
    (formatted("18 (18 dollars)"), "18", 2.0),  # the same number twice
    (formatted("-3"), "-3", 2.0),  # negative gold
    (formatted("-$3"), "-3", 2.0),  # the sign before the currency sign is the number's
    (formatted("$-3"), "-3", 2.0),
    (formatted("-$3"), "3", 0.0),  # ...and it still matters
    (formatted("\\boxed{18} or 20"), "18", 2.0),  # the box decides
    ("<answer>18</answer>", "18", 2.0),  # correctness does not judge the format
    ("<answer>19</answer><answer>18</answer>", "18", 2.0),  # the last block counts
    (formatted("19"), "18", 0.0),  # a different number
    (formatted("3"), "-3", 0.0),  # the sign matters
    (formatted("\u22125"), "-5", 2.0),  # U+2212 MINUS SIGN: minus five
    (formatted("\u22125"), "5", 0.0),  # ... not five
    (formatted("\u20135"), "-5", 2.0),  # an en dash likewise
    (formatted("\u20135"), "5", 0.0),
    (formatted("5-3"), "-3", 0.0),  # a hyphen between numbers is no sign: 5 and 3, no -3
    (formatted("1.8"), "18", 0.0),  # a decimal point is not a separator
    (formatted("180"), "18", 0.0),  # nor is an extra digit a zero
    (formatted("18,0"), "18", 0.0),  # a bad separator splits it into two numbers
    (formatted("eighteen"), "18", 0.0),  # no number
    (formatted(""), "18", 0.0),  # empty block
    (formatted("18 or 20"), "18", 0.0),  # two different numbers: no commitment
    (formatted("3 * 6 = 18"), "18", 0.0),  # working, not an answer
    (formatted("\\boxed{20}, not 18"), "18", 0.0),  # the box decides
    (formatted("x" * MAX_ANSWER_CHARS + "18"), "18", 0.0),  # an essay, not an answer
    (formatted("19", reasoning="3 * 6 = 18"), "18", 0.0),  # the gold number only in the reasoning
    ("<answer>18</answer><answer>19</answer>", "18", 0.0),  # ... only in an earlier block
    (GOOD[: -len("</answer>\n")], "18", 0.0),  # ... only in an unclosed block
    ("The answer is 18.", "18", 0.0),  # ... only outside any block
    (formatted("18"), "", 0.0),  # an empty gold answer pays nothing
    (formatted("18"), None, 0.0),  # nor does a missing one
    # A gold answer that is no number pays nothing, whatever the completion: never "no number" equal to "no number"
    (formatted("eighteen"), "", 0.0),  # no number against an empty gold answer
    (formatted(""), "", 0.0),  # an empty answer against an empty gold answer
    (formatted("n/a"), "n/a", 0.0),  # the same text: numbers are compared, and there is none
    (formatted("twelve"), "twelve", 0.0),  # ... likewise in words
    (formatted("12"), "twelve", 0.0),  # the number the word means: the gold answer is not parsed as words
    (formatted("nothing"), "twelve", 0.0),  # no number against no number
    (formatted("18"), "18 apples", 0.0),  # a gold answer must be a number alone (GSM8K's after ####)
    (formatted("none"), None, 0.0),  # no number against a missing gold answer
]


@pytest.mark.parametrize("text, gold, expected", CORRECTNESS)
def test_correctness_reward(text, gold, expected):
    assert score(correctness_reward_func, text, gold) == expected


def test_rewards_take_a_batch_and_plain_strings():
    texts = [GOOD, formatted("19"), "no format"]
    batch = {"prompts": [[]] * 3, "answer": ["18"] * 3}
    expected = [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [2.0, 0.0, 0.0]]
    assert [f(completions=[chat(t) for t in texts], **batch) for f in REWARD_FUNCS] == expected
    assert [f(completions=texts, **batch) for f in REWARD_FUNCS] == expected  # standard (non-chat) format


def test_each_rewards_declared_role_and_maximum_are_what_it_pays():
    """REWARD_ROLES, which the health checks and the console's "correct" share read: a right answer in the exact
    format earns each reward's maximum, no completion (the adversarial ones too) earns more, and the rewards
    declared "correct" are those that pay differently against another gold."""
    assert set(REWARD_ROLES) == {func.__name__ for func in REWARD_FUNCS}  # every reward has its line
    texts = [GOOD, formatted("19"), *ADVERSARIAL.values()]
    batch = {"prompts": [[]] * len(texts), "completions": [chat(t) for t in texts]}
    for func in REWARD_FUNCS:
        role, top = REWARD_ROLES[func.__name__]
        right, wrong = func(**batch, answer=["18"] * len(texts)), func(**batch, answer=["19"] * len(texts))
        assert right[0] == top and max(right + wrong) == top, func.__name__
        assert (role == "correct") == (right != wrong), func.__name__


def test_tags_from_the_settings_change_prompt_rewards_and_evaluation_alike():
    """--reasoning_tag think: the run builds its prompt, rewards and evaluation format from the tags it is given;
    the public names keep the constants' format."""
    import grpo_demo
    from grpo_kit.answer_format import Tags

    tags = Tags("think", "answer")
    fmt, rewards = grpo_demo.answer_format(tags), grpo_demo.reward_funcs(tags)
    think = "<think>\nSome steps.\n</think>\n<answer>\n18\n</answer>\n"
    reasoning = "<reasoning>\nSome steps.\n</reasoning>\n<answer>\n18\n</answer>\n"
    assert [func.__name__ for func in rewards] == [func.__name__ for func in REWARD_FUNCS]  # logged under each name
    scores = {
        func.__name__: [func(prompts=[[]], completions=[chat(t)], answer=["18"])[0] for t in (think, reasoning)]
        for func in rewards
    }
    assert scores == {
        "xmlcount_reward_func": [0.5, 0.25],  # the reasoning tags no longer count
        "soft_format_reward_func": [0.5, 0.0],
        "strict_format_reward_func": [0.5, 0.0],
        "int_reward_func": [0.5, 0.5],  # reads only the answer block, whose tag is unchanged
        "correctness_reward_func": [2.0, 2.0],
    }
    system = "\nRespond in the following format:\n<think>\n...\n</think>\n<answer>\n...\n</answer>\n"
    assert fmt.chat_prompt("How many?") == [
        {"role": "system", "content": system},
        {"role": "user", "content": "How many?"},
    ]
    assert (fmt.tags, fmt.gsm8k_solution("s\n#### 1")) == (
        ("<think>", "</think>", "<answer>", "</answer>"),
        "<think>\ns\n</think>\n<answer>\n1\n</answer>\n",
    )
    assert fmt.is_strict_format(think) and not fmt.is_strict_format(reasoning) and fmt.extract_answer(think) == "18"
    assert "<reasoning>" in grpo_demo.SYSTEM_PROMPT and strict_format_reward_func([reasoning]) == [0.5]  # defaults
    answers = Tags("reasoning", "final")  # the answer tag too
    assert extract_xml_answer("<final>\n7\n</final>", answers) == "7" and extract_xml_answer("<final>7</final>") == ""


def test_correctness_logs_gold_and_extracted_answer():
    logged = {}
    correctness_reward_func(
        [[]], [chat(GOOD), chat("none")], ["18", "7"], log_extra=lambda key, values: logged.update({key: values})
    )
    assert logged == {"gold": ["18", "7"], "extracted": ["18", ""]}


def test_rewards_print_nothing(capsys):
    for text in [GOOD, formatted("19"), "", "<answer>", GOOD * 3]:
        for func in REWARD_FUNCS:
            score(func, text)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


# ----------------------------------------------------------------------------------------------------------------
# Properties over arbitrary text

TAGS = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "<think>", "</think>"]
LINES = ["<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>", "\n</answer>\n"]  # xmlcount's units
PIECES = [*TAGS, *LINES, "\n", " ", "\t", "18", "1,080", "-3", ".", ",", "$", "\\boxed{", "}", "<", "/", "é", "\x00"]
RANGES = {  # each reward's documented values
    xmlcount_reward_func: (0.0, 0.5),
    soft_format_reward_func: {0.0, 0.5},
    strict_format_reward_func: {0.0, 0.5},
    int_reward_func: {0.0, 0.5},
    correctness_reward_func: {0.0, 2.0},
}

tail = st.one_of(st.text(max_size=10), st.integers(0, 300).map("x".__mul__))  # > 125 chars: xmlcount penalty > 0.125
tag_soup = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)), max_size=40).map("".join)
any_text = st.one_of(
    st.text(),  # arbitrary unicode
    tag_soup,
    st.builds(formatted, answer=tag_soup, reasoning=tag_soup, end=tail),  # formatted, with a tail or not
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),  # binary junk, lone surrogates included
)
any_gold = st.one_of(st.integers(-(10**9), 10**9).map(str), st.integers(0, 10**9).map("{:,}".format), st.text())


def in_range(func, value) -> bool:
    allowed = RANGES[func]
    if isinstance(allowed, set):
        return value in allowed
    return allowed[0] <= value <= allowed[1]


@settings(max_examples=300)
@given(texts=st.lists(any_text, min_size=1, max_size=4), gold=any_gold)
def test_any_text_gets_a_finite_reward_in_range(texts, gold):
    for func in REWARD_FUNCS:
        rewards = func(prompts=[[]] * len(texts), completions=[chat(t) for t in texts], answer=[gold] * len(texts))
        assert len(rewards) == len(texts)
        for value in rewards:
            assert type(value) is float and math.isfinite(value) and in_range(func, value), (func.__name__, value)


no_tags = st.text(st.characters(exclude_characters="<"))  # cannot open or close a block
no_digits = st.text(st.characters(exclude_characters="<0123456789"))


@settings(max_examples=300)
@given(
    gold=st.integers(-(10**6), 10**9),
    before=no_tags,
    after=no_tags,
    inside=no_digits,
    earlier_block=st.booleans(),
    comma=st.booleans(),
)
def test_gold_number_outside_the_answer_block_never_pays(gold, before, after, inside, earlier_block, comma):
    written = f"{gold:,}" if comma else str(gold)
    shown = f"<answer>{written}</answer>" if earlier_block else written  # in an earlier block or in plain text
    text = f"{before}{shown}{before}<answer>{inside}</answer>{after}{written}"
    assert score(correctness_reward_func, text, str(gold)) == 0.0


# ----------------------------------------------------------------------------------------------------------------
# Bounded time on adversarial 1 MB completions


@pytest.mark.parametrize("shape", list(ADVERSARIAL))
def test_a_1mb_adversarial_completion_gets_a_reward_in_range(shape):
    for func in REWARD_FUNCS:
        (value,) = func(prompts=[[]], completions=[chat(ADVERSARIAL[shape])], answer=["1"])
        assert type(value) is float and in_range(func, value), (func.__name__, value)


def spare_reward(completions, **kwargs) -> list[float]:
    return [1.0 for _ in completions]


ROLE_MISTAKES = [
    # a reward added to REWARD_FUNCS without its line: no check would read it
    ([*REWARD_FUNCS, spare_reward], REWARD_ROLES, "REWARD_ROLES has no line for spare_reward"),
    # a reward removed, its line left: the checks would wait for a metric never logged
    (REWARD_FUNCS[1:], REWARD_ROLES, "REWARD_ROLES names xmlcount_reward_func, which REWARD_FUNCS does not hold"),
    # a role misspelt: it would be read as a format reward
    (REWARD_FUNCS, {**REWARD_ROLES, "correctness_reward_func": ("Correct", 2.0)}, "a role and a maximum"),
    # a maximum of 0: the console's "correct" share divides by it
    (REWARD_FUNCS, {**REWARD_ROLES, "int_reward_func": ("format", 0)}, "its maximum 0 must be a positive number"),
]


@pytest.mark.parametrize(("funcs", "roles", "problem"), ROLE_MISTAKES, ids=["unlisted", "gone", "role", "maximum"])
def test_a_reward_roles_mistake_is_refused_before_anything_loads(funcs, roles, problem):
    from grpo_kit import checks

    assert list(checks.reward_roles(REWARD_FUNCS, REWARD_ROLES)) == []  # the recipe's own declaration holds
    found = list(checks.reward_roles(funcs, roles))
    assert len(found) == 1 and problem in found[0]
