"""Adversarial completions of about 1 MB: patterns that could make a reward backtrack (nested tags, runs of digits,
separators). tests/test_rewards.py checks the rewards' values on them, benchmarks/reward_worst_case.py their time;
plain data, so that the benchmark needs nothing the recipe does not."""

MB = 2**20
GOOD = "<reasoning>\nSome steps.\n</reasoning>\n<answer>\n18\n</answer>\n"  # a completion in the exact format

ADVERSARIAL = {
    "digits": "1" * MB,
    "digits in the answer block, then junk": "<answer>" + "1" * MB + "x</answer>",
    "separated digits in the answer block": "<answer>" + "1,111" * (MB // 5) + ",1</answer>",
    "repeated '1 '": "1 " * (MB // 2),
    "repeated '1 ' in the answer block": "<answer>\n" + "1 " * (MB // 2) + "\n</answer>",
    "repeated formatted completions": GOOD * (MB // len(GOOD)),
    "repeated opening answer tags": "<answer>" * (MB // 8) + "</answer>",
    "repeated closing answer tags": "\n</answer>" * (MB // 10),
    "repeated reasoning blocks": "<reasoning></reasoning>" * (MB // 23),
    "whitespace after an open tag": "<reasoning>" + " " * MB,
    "huge format, no newlines": "<reasoning>" + "a" * MB + "</reasoning><answer>" + "1" * MB + "</answer>",
    "huge strict format": f"<reasoning>\n{'a' * MB}\n</reasoning>\n<answer>\n{'1' * MB}\n</answer>\n",
    "nested boxes": "<answer>" + "\\boxed{" * (MB // 7) + "</answer>",
    "newlines": "\n" * MB,
    "binary junk": bytes(range(256)).decode("latin-1") * (MB // 256),
}
