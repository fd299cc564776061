"""The offline preset: GSM8K-format problems generated here and a tiny Qwen2 model built from a config.

`python grpo_demo.py --smoke` points the recipe at what `prepare` writes, so the run takes the same code path
as a real one (data prep, rewards, GRPOTrainer, checkpoints, evaluation) without a GPU, a download or a login.
The tokenizer is built for the recipe's own answer format (its tags are single tokens).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

logger = logging.getLogger("grpo_demo")

ASSETS_DIR = "outputs/smoke-assets"
MODEL_DIR = f"{ASSETS_DIR}/tiny-qwen2"
DATA_DIR = f"{ASSETS_DIR}/gsm8k-generated"

DEFAULTS = dict(
    model_name_or_path=MODEL_DIR,
    dataset=DATA_DIR,
    output_dir="outputs/smoke-GRPO",
    run_name="smoke-GRPO-generated",
    report_to=["none"],
    bf16=False,
    activation_checkpointing=False,  # nothing to save on a model this small
    max_steps=4,
    num_generations=4,
    per_device_train_batch_size=8,  # two prompts x four generations per step
    gradient_accumulation_steps=1,
    max_completion_length=48,
    save_steps=2,
    num_completions_to_print=1,
    eval_every_steps=2,
    eval_subset=8,
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

NAMES = ["Ava", "Ben", "Carla", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kenji", "Lena"]
ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "shells", "cards"]


def _problem(rng: random.Random) -> tuple[str, list[str], int]:
    """One grade-school word problem: (question, reasoning lines in GSM8K style, integer answer)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 9)
    kind = rng.randrange(5)
    if kind == 0:
        return (
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            [f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item} now."],
            a + b,
        )
    if kind == 1:
        a, b = max(a, b) + 1, min(a, b)
        return (
            f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?",
            [f"{name} has {a} - {b} = <<{a}-{b}={a - b}>>{a - b} {item} left."],
            a - b,
        )
    if kind == 2:
        return (
            f"{name} buys {c} boxes with {b} {item} in each box. How many {item} does {name} buy?",
            [f"{name} buys {c} * {b} = <<{c}*{b}={c * b}>>{c * b} {item}."],
            c * b,
        )
    if kind == 3:
        return (
            f"Each of the {item} costs ${c}. How much do {b} of them cost?",
            [f"They cost {b} * {c} = $<<{b}*{c}={b * c}>>{b * c}."],
            b * c,
        )
    total = a + b
    return (
        f"{name} has {a} {item}, finds {b} more and then shares {c} with a friend. How many {item} are left?",
        [
            f"After finding more, {name} has {a} + {b} = <<{a}+{b}={total}>>{total} {item}.",
            f"After sharing, {total} - {c} = <<{total}-{c}={total - c}>>{total - c} {item} are left.",
        ],
        total - c,
    )


def make_problems(n: int, seed: int = 0) -> list[dict]:
    """`n` problems as GSM8K rows: {"question", "answer": "reasoning...\\n#### N"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, lines, answer = _problem(rng)
        rows.append({"question": question, "answer": "\n".join(lines) + f"\n#### {answer}"})
    return rows


def write_splits(path: str | Path, train: list[dict], test: list[dict]) -> Path:
    """A folder with train.jsonl and test.jsonl (one GSM8K row a line), as `--dataset` reads it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        with (path / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def write_gsm8k_folder(path: str | Path, n_train: int = 64, n_test: int = 32, seed: int = 0) -> Path:
    """`write_splits` of `n_train` and `n_test` generated problems."""
    return write_splits(path, make_problems(n_train, seed), make_problems(n_test, seed + 1))


def corpus(answer_format, rows: list[dict]) -> list[str]:
    """The texts a tokenizer for `rows` is trained on: their prompts and their solutions in `answer_format`."""
    instructions = [text for text in answer_format.prompt_texts("") if text]  # the system prompt
    return (
        instructions + [row["question"] for row in rows] + [answer_format.gsm8k_solution(row["answer"]) for row in rows]
    )


def build_tokenizer(corpus: list[str], tags: tuple[str, ...], vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on `corpus`, with a ChatML template; `tags` are the answer format's
    (reasoning open / close, answer open / close).

    The answer-format tags (with their newlines) are single tokens, as `<think>` is in recent chat models: a tiny
    model then meets the format in a handful of samples instead of thousands.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
    r_open, r_close, a_open, a_close = tags
    fast.add_tokens([f"{r_open}\n", f"\n{r_close}\n", f"{a_open}\n", f"\n{a_close}"])
    return fast


def build_tiny_model(tokenizer, seed: int = 0, hidden_size: int = 64, num_layers: int = 2):
    """A randomly initialised Qwen2-architecture causal LM sized for CPU tests."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


def prepare(answer_format, model_dir: str, data_dir: str | None, seed: int = 0) -> None:
    """Write the generated problems and the tiny model wherever the smoke defaults still point at them."""
    if data_dir == DATA_DIR:
        write_gsm8k_folder(data_dir, seed=seed)
    if model_dir == MODEL_DIR:
        tokenizer = build_tokenizer(corpus(answer_format, make_problems(256, seed)), answer_format.tags)
        model = build_tiny_model(tokenizer, seed)
        tokenizer.save_pretrained(model_dir)
        model.save_pretrained(model_dir)
