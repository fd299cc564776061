"""The offline preset: GSM8K-format problems generated here and a tiny model built from a config.

`python grpo_demo.py --smoke` points the recipe at what `prepare` writes, so the run takes the same code path
as a real one (data prep, rewards, GRPOTrainer, checkpoints, evaluation) without a GPU, a download or a login.
The tokenizer is built for the recipe's own answer format (its tags are single tokens).

The tiny model comes in the two kinds the recipe names (`--tiny_model`): `qwen2`, a Qwen2 model with Qwen2.5's ChatML
conventions, and `llama3`, a Llama model with Llama 3's, which differ where recipes break:

- the chat template writes `<|begin_of_text|>` itself, and the tokenizer adds it again to any text it encodes with
  special tokens (as Llama 3's tokenizer.json does): a prompt tokenized that way starts with two;
- a turn ends with `<|eot_id|>`, and the tokenizer's end of sequence is another token, `<|end_of_text|>` (as in
  Llama 3 base models and the first Llama 3 Instruct release): only the generation config lists `<|eot_id|>`
  among the tokens that end generation, as every Llama 3 Instruct model's does;
- no pad token is set, and `<|finetune_right_pad_id|>`, which Llama 3.1 and later reserve for padding, is in the
  vocabulary;
- the template trims each message and writes the system message under a header with two date lines (Llama 3.1's
  template: a fixed date, so that prompts are the same on every day).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

logger = logging.getLogger("grpo_demo")

TINY_MODELS = ("qwen2", "llama3")  # the kinds of tiny model --smoke and --demo build; the first is the default

ASSETS_DIR = "outputs/smoke-assets"
MODEL_DIRS = {kind: f"{ASSETS_DIR}/tiny-{kind}" for kind in TINY_MODELS}
DATA_DIR = f"{ASSETS_DIR}/gsm8k-generated"

DEFAULTS = dict(
    dataset=DATA_DIR,
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

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\n' }}"
    "{{- 'Today Date: ' + date_string + '\n\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
# Each kind's architecture and chat conventions: its special tokens (in their order in the real vocabulary), the
# tokenizer's own special tokens, the text its template writes around messages (learnt by the tokenizer, as a real
# one has it in few tokens), the token its tokenizer prefixes encoded text with, the model config's BOS and what
# ends generation (the model config's and generation config's eos_token_id).
CONVENTIONS = {
    "qwen2": dict(
        template=CHATML_TEMPLATE,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        frame=[],  # the role names are left to bytes, as they were when the demo's figures were measured
        prefix=None,
        bos="<|endoftext|>",
        ends=["<|im_end|>"],
    ),
    "llama3": dict(
        template=LLAMA3_TEMPLATE,
        special_tokens=[
            "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
        ],
        tokens=dict(bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"),  # no pad token
        frame=["system", "user", "assistant", "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"],
        prefix="<|begin_of_text|>",
        bos="<|begin_of_text|>",
        ends=["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    ),
}  # fmt: skip

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


def corpus(answer_format, rows: list[dict], kind: str = "qwen2") -> list[str]:
    """The texts a tokenizer of `kind` for `rows` is trained on: their prompts and their solutions in `answer_format`,
    and the words its chat template writes around them."""
    instructions = [text for text in answer_format.prompt_texts("") if text]  # the system prompt
    questions = [row["question"] for row in rows]
    return (
        CONVENTIONS[kind]["frame"]
        + instructions
        + questions
        + [answer_format.gsm8k_solution(r["answer"]) for r in rows]
    )


def build_tokenizer(corpus: list[str], tags: tuple[str, ...], vocab_size: int = 512, kind: str = "qwen2"):
    """A byte-level BPE tokenizer trained on `corpus`, with the chat template and special tokens of `kind` (one of
    TINY_MODELS); `tags` are the answer format's (reasoning open / close, answer open / close).

    The answer-format tags (with their newlines) are single tokens, as `<think>` is in recent chat models: a tiny
    model then meets the format in a handful of samples instead of thousands.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    conventions = CONVENTIONS[kind]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=conventions["special_tokens"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if prefix := conventions["prefix"]:  # what `tokenizer(text)` adds unless add_special_tokens=False
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{prefix} $A",
            pair=f"{prefix} $A {prefix} $B:1",
            special_tokens=[(prefix, tokenizer.token_to_id(prefix))],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, chat_template=conventions["template"], **conventions["tokens"]
    )
    r_open, r_close, a_open, a_close = tags
    fast.add_tokens([f"{r_open}\n", f"\n{r_close}\n", f"{a_open}\n", f"\n{a_close}"])
    return fast


def build_tiny_model(tokenizer, seed: int = 0, hidden_size: int = 64, num_layers: int = 2, kind: str = "qwen2"):
    """A randomly initialised causal LM of `kind` (Qwen2 or Llama architecture) sized for CPU tests, for a tokenizer
    of the same kind: its config and generation config name the token ids as the real models' do."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    conventions = CONVENTIONS[kind]
    ends = tokenizer.convert_tokens_to_ids(conventions["ends"])
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama3": (LlamaConfig, LlamaForCausalLM)}
    config_class, model_class = classes[kind]
    torch.manual_seed(seed)
    # Rotary embeddings keep transformers' default base (10000) for both kinds: a tiny model's positions, not a long
    # context. With Llama 3's 500000 the demo's warm start did not learn to count (measured on three seeds).
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(conventions["bos"]),
        eos_token_id=ends[0] if len(ends) == 1 else ends,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = model_class(config)
    if kind == "llama3":  # Llama 3 Instruct's generation_config.json: sampling by default, every end token listed
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=ends, do_sample=True, temperature=0.6, top_p=0.9
        )
    return model


def prepare(answer_format, model_dir: str, data_dir: str | None, seed: int = 0) -> None:
    """Write the generated problems and the tiny model wherever the smoke defaults still point at them."""
    if data_dir == DATA_DIR:
        write_gsm8k_folder(data_dir, seed=seed)
    kind = next((kind for kind, folder in MODEL_DIRS.items() if folder == model_dir), None)
    if kind is not None:
        texts = corpus(answer_format, make_problems(256, seed), kind)
        tokenizer = build_tokenizer(texts, answer_format.tags, kind=kind)
        model = build_tiny_model(tokenizer, seed, kind=kind)
        tokenizer.save_pretrained(model_dir)
        model.save_pretrained(model_dir)
