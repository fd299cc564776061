"""The offline preset's assets: GSM8K-format problems generated here and a tiny model built from a config.

`python grpo_demo.py --smoke` runs the recipe's real code path on what `prepare` writes, without a GPU, a download or
a login. The tokenizer has the recipe's tags as single tokens; `--tiny_model` builds `qwen2` (Qwen2, ChatML) or
`llama3`, Llama with Llama 3's traps (README, "Swapping the model"): a template writing the BOS its tokenizer adds
again, turns ending at `<|eot_id|>`, which only the generation config lists (the end of sequence is `<|end_of_text|>`,
as in the first Instruct release), no pad token, and Llama 3.1's trimmed messages under a dated system header."""

import hashlib
import json
import os
import random
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path

TINY_MODELS = ("qwen2", "llama3")  # the kinds of tiny model --smoke and --demo build; the first is the default
ASSETS_DIR = "outputs/smoke-assets"
MODEL_DIRS = {kind: f"{ASSETS_DIR}/tiny-{kind}" for kind in TINY_MODELS}  # in <reasoning>/<answer>, seed 42
DATA_DIR = f"{ASSETS_DIR}/gsm8k-generated"  # seed 42
PLAIN = {"tags": ("reasoning", "answer"), "seed": 42}  # the assets' terms that their folders' plain names stand for
STAMP = "made_with.json"  # in each asset folder: what built it
# The smoke model's positions: room for lm-eval's tasks with their default 256 new tokens (gsm8k_cot-chat's 8 shots
# run to ~1,700 tokens), so that --smoke runs every protocol; the demo's model keeps 512 (it is refused there).
SMOKE_POSITIONS = 2048
CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # an edit of the builders here builds anew


def keyed(folder: str, tags: tuple[str, str] | None = None, seed: int | None = None) -> str:
    """An asset folder's name for the terms it is built on (`tags`, `seed`; None: not one of its terms): the plain
    name for the recipe's tags and seed 42, else with them (`tiny-qwen2.think.answer`, `gsm8k-generated.seed7`; a
    dot is in no tag name). Presets run at once on other terms so never share a folder that either writes."""
    own = [*(tags if tags not in (None, PLAIN["tags"]) else ()), *([f"seed{seed}"] if seed not in (None, 42) else [])]
    return ".".join([folder, *own])


def unkeyed(folder: str | Path | None) -> str | None:
    """The plain name of an asset folder `keyed` names (`outputs/smoke-assets/tiny-qwen2.think.answer` ->
    `outputs/smoke-assets/tiny-qwen2`), None for another path."""
    return str(Path(folder).parent / Path(folder).name.split(".")[0]) if folder else None


@contextmanager
def _locked(folder: Path):
    """Hold an exclusive lock on `folder` (made if need be) while in the block: one builder in it at a time. The lock
    is the folder's own (flock on it, released when the process ends however it ends): no file is left for it."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the rename into place still keeps readers from a half-built folder
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def build_once(folder: str | Path, made_with: dict, build, stamp: str = STAMP) -> bool:
    """Make asset `folder` with `build(path)` unless it holds what `made_with` says (its `stamp`); True when built.
    Built into a folder beside it and renamed into place, under a lock: a process reading it never sees a half-built
    or another process's folder, and a build cut short leaves the folder as it was."""
    folder = Path(folder)
    made = json.loads(json.dumps(made_with))  # as the stamp reads back: tuples as lists
    with _locked(folder.parent):
        with suppress(OSError, ValueError):  # no stamp, or a damaged one: built again
            if json.loads((folder / stamp).read_text(encoding="utf-8")) == made:
                return False
        for stale in folder.parent.glob(f".{folder.name}.*.part"):  # builds cut short: none runs, the lock is ours
            shutil.rmtree(stale, ignore_errors=True)
        part = folder.parent / f".{folder.name}.{os.getpid()}.part"
        part.mkdir()
        build(part)
        (part / stamp).write_text(json.dumps(made, indent=2) + "\n", encoding="utf-8")
        old = folder.parent / f".{folder.name}.{os.getpid()}.old.part"
        if folder.exists():
            folder.rename(old)
        part.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    return True


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}{{- 'Cutting Knowledge Date: December 2023\n' }}"
    "{{- 'Today Date: ' + date_string + '\n\n' }}{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
# Each kind's chat conventions: its special tokens (in the real vocabulary's order), the tokenizer's own (one with a
# BOS prefixes encoded text with it), the text its template writes around messages (learnt by the tokenizer, as a
# real one has it in few tokens), the model config's BOS and the config's and generation config's eos_token_id.
CONVENTIONS = {
    "qwen2": dict(
        template=CHATML_TEMPLATE,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        frame=[],  # the role names are left to bytes, as they were when the demo's figures were measured
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
        bos="<|begin_of_text|>",
        ends=["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    ),
}  # fmt: skip

NAMES = ["Ava", "Ben", "Carla", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kenji", "Lena"]
ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "shells", "cards"]


def _problem(rng: random.Random) -> dict:
    """One grade-school word problem of five kinds, as a GSM8K row: {"question", "answer": "reasoning\\n#### N"}."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 9)
    kind = rng.randrange(5)
    if kind == 1:  # a subtraction that leaves some
        a, b = max(a, b) + 1, min(a, b)
    total, difference, product, left = a + b, a - b, c * b, a + b - c
    questions = [
        f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
        f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?",
        f"{name} buys {c} boxes with {b} {item} in each box. How many {item} does {name} buy?",
        f"Each of the {item} costs ${c}. How much do {b} of them cost?",
        f"{name} has {a} {item}, finds {b} more and then shares {c} with a friend. How many {item} are left?",
    ]
    reasoning = [
        f"{name} has {a} + {b} = <<{a}+{b}={total}>>{total} {item} now.",
        f"{name} has {a} - {b} = <<{a}-{b}={difference}>>{difference} {item} left.",
        f"{name} buys {c} * {b} = <<{c}*{b}={product}>>{product} {item}.",
        f"They cost {b} * {c} = $<<{b}*{c}={product}>>{product}.",
        f"After finding more, {name} has {a} + {b} = <<{a}+{b}={total}>>{total} {item}.\n"
        f"After sharing, {total} - {c} = <<{total}-{c}={left}>>{left} {item} are left.",
    ]
    answer = [total, difference, product, product, left][kind]
    return {"question": questions[kind], "answer": f"{reasoning[kind]}\n#### {answer}"}


def make_problems(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [_problem(rng) for _ in range(n)]


def write_splits(path: str | Path, train: list[dict], test: list[dict]) -> Path:
    """A folder with train.jsonl and test.jsonl (one GSM8K row a line), as `--dataset` reads it."""
    (path := Path(path)).mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        (path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_gsm8k_folder(path: str | Path, n_train: int = 64, n_test: int = 32, seed: int = 0) -> Path:
    return write_splits(path, make_problems(n_train, seed), make_problems(n_test, seed + 1))


def corpus(answer_format, rows: list[dict], kind: str = "qwen2") -> list[str]:
    """What a tokenizer of `kind` learns: its template's words, the system prompt, `rows`' questions and solutions."""
    system = [message["content"] for message in answer_format.chat_prompt("") if message["content"]]
    solutions = [answer_format.gsm8k_solution(row["answer"]) for row in rows]
    return CONVENTIONS[kind]["frame"] + system + [row["question"] for row in rows] + solutions


def build_tokenizer(corpus: list[str], tags: tuple[str, ...], vocab_size: int = 512, kind: str = "qwen2"):
    """A byte-level BPE tokenizer trained on `corpus`, with the chat template and special tokens of `kind`, and the
    answer format's `tags` (with their newlines) as single tokens, as `<think>` is in recent chat models: a tiny
    model then meets the format in a handful of samples instead of thousands."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    conventions = CONVENTIONS[kind]
    tokens, specials = conventions["tokens"], conventions["special_tokens"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if bos := tokens.get("bos_token"):  # what `tokenizer(text)` adds unless add_special_tokens=False
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=conventions["template"], **tokens)
    r_open, r_close, a_open, a_close = tags
    fast.add_tokens([f"{r_open}\n", f"\n{r_close}\n", f"{a_open}\n", f"\n{a_close}"])
    return fast


def build_tiny_model(
    tokenizer, seed: int = 0, hidden_size: int = 64, num_layers: int = 2, kind: str = "qwen2", positions: int = 512
):
    """A randomly initialised causal LM of `kind` sized for CPU tests, for a tokenizer of that kind: its config and
    generation config name the token ids as the real models' do; `positions` its max_position_embeddings."""
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
        max_position_embeddings=positions,
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
    """Write the generated problems and the tiny model wherever the smoke defaults still point at them (`keyed`
    folders), unless they hold them already (`build_once`)."""
    if unkeyed(data_dir) == DATA_DIR:
        build_once(data_dir, {"seed": seed, "code": CODE}, lambda path: write_gsm8k_folder(path, seed=seed))
    if kind := next((kind for kind, folder in MODEL_DIRS.items() if folder == unkeyed(model_dir)), None):

        def build(path: Path) -> None:
            texts = corpus(answer_format, make_problems(256, seed), kind)
            tokenizer = build_tokenizer(texts, answer_format.tags, kind=kind)
            tokenizer.save_pretrained(path)
            build_tiny_model(tokenizer, seed, kind=kind, positions=SMOKE_POSITIONS).save_pretrained(path)

        system = [message["content"] for message in answer_format.chat_prompt("")]
        made_with = dict(kind=kind, seed=seed, tags=answer_format.tags, system=system, conventions=CONVENTIONS[kind])
        made_with |= {"solution_template": answer_format.solution_template, "code": CODE}  # this file, as built
        build_once(model_dir, made_with, build)
