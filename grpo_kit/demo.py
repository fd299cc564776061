"""The learning preset: a tiny model that knows the answer format but mostly gets the sums wrong, until GRPO.

`python grpo_demo.py --demo` points the recipe at what `prepare` writes, then trains with the recipe's own GRPO and
rewards, offline, in about two minutes on two CPU cores (about half of it the warm start):

1. Problems: grade-school word problems, a two-digit number plus or minus a one-digit one, in GSM8K's format.
   The held-out test split (256 problems) shares no sum (numbers and operation) with the training split.
2. A tiny model (Qwen2 by default, or Llama with Llama 3's chat conventions: `--tiny_model llama3`; hidden size
   128, 2 layers, 0.35-0.36 M parameters) and a tokenizer built here, then a short
   supervised warm start (`warm_start`) on the training problems written in the recipe's answer format. Their
   solutions come in two styles, as people's do: most give the result at once (`48 + 8 = 56`), some count on one
   by one (`48 + 8, counting on: 49+7=50+6=...=56`). After the warm start the model has the format and answers at
   once, and those sums are mostly wrong. Sampled at the training temperature it sometimes counts, and its
   counting is mostly right.
3. GRPO with the five rewards: counting earns the correctness reward far more often than answering at once, so
   the model learns to count, and greedy accuracy on the held-out problems rises (the README gives the figures).

Why a choice between two ways of answering rather than arithmetic alone: each of hundreds of sums answered at once
would be rewarded only when sampled right, while how to answer is one decision shared by every problem, which GRPO
learns in a few dozen steps, as it does at scale (longer, more careful reasoning, where that earns the reward).
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from pathlib import Path

from grpo_kit import generation, models, smoke

logger = logging.getLogger("grpo_demo")

ASSETS_DIR = "outputs/demo-assets"
MODEL_DIRS = {kind: f"{ASSETS_DIR}/warm-{kind}" for kind in smoke.TINY_MODELS}
DATA_DIR = f"{ASSETS_DIR}/gsm8k-generated"

DEFAULTS = dict(
    dataset=DATA_DIR,
    report_to=["none"],
    bf16=False,
    activation_checkpointing=False,  # nothing to save on a model this small
    learning_rate=3e-4,  # a tiny model fresh from a warm start: 5e-6 would take thousands of steps
    max_steps=40,
    num_generations=8,
    per_device_train_batch_size=64,  # 8 prompts x 8 generations per step
    gradient_accumulation_steps=1,
    max_completion_length=72,  # the longest solution (99 + 9, counting on) is 69 tokens with its end of turn
    save_steps=20,
    num_completions_to_print=1,
    eval_every_steps=5,  # accuracy on eval_subset held-out problems every 5 steps, for the curves
    eval_subset=64,
)

# The problems and the warm start (see the module docstring)
ASSETS_SEED = 42  # fixed: --seed varies GRPO alone (sampling, data order), every seed starting from the same model
N_TRAIN, N_TEST = 2000, 256
COUNTING_SHARE = 0.3  # of warm-start solutions; the rest answer in one line
HIDDEN_SIZE, NUM_LAYERS = 128, 2
WARM_STEPS = 600  # about 50 s on one core: the format is learnt within 100 steps, counting by about 500
WARM_LR, WARM_BATCH, WARM_WARMUP = 3e-3, 16, 50


def solutions(a: int, b: int, op: str) -> tuple[str, str, int]:
    """(one-line reasoning, counting reasoning, result) of `a op b` for op `+` or `-`.

    Both start by restating the sum, so that copying the numbers is learnt from every solution; the next token
    (` =` or `,`) is the choice between answering at once and counting one by one.

    >>> solutions(48, 3, "+")
    ('48 + 3 = 51', '48 + 3, counting on: 49+2=50+1=51', 51)
    """
    sign = 1 if op == "+" else -1
    result = a + sign * b
    steps = "".join(f"{a + sign * k}{op}{b - k}=" for k in range(1, b))
    direction = "on" if op == "+" else "back"
    return f"{a} {op} {b} = {result}", f"{a} {op} {b}, counting {direction}: {steps}{result}", result


def _problem(rng: random.Random) -> tuple[tuple[int, int, str], str]:
    """((a, b, op), question): a two-digit number and a one-digit one, added or subtracted."""
    name, item = rng.choice(smoke.NAMES), rng.choice(smoke.ITEMS)
    a, b = rng.randint(10, 99), rng.randint(1, 9)
    if rng.random() < 0.5:
        return (a, b, "+"), f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
    return (a, b, "-"), f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?"


def make_problems(n_train: int, n_test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, test) rows in GSM8K's format, {"question", "answer": "reasoning\\n#### N"}.

    No test problem's (a, b, operation) appears in train: held-out accuracy measures sums the model never saw.
    A `COUNTING_SHARE` of train solutions count, the others answer in one line; test solutions are one line.
    """
    rng = random.Random(seed)
    held_out: set[tuple[int, int, str]] = set()
    test, train = [], []
    while len(test) < n_test:
        key, question = _problem(rng)
        if key not in held_out:
            held_out.add(key)
            line, _, result = solutions(*key)
            test.append({"question": question, "answer": f"{line}\n#### {result}"})
    while len(train) < n_train:
        key, question = _problem(rng)
        if key not in held_out:
            line, counting, result = solutions(*key)
            reasoning = counting if rng.random() < COUNTING_SHARE else line
            train.append({"question": question, "answer": f"{reasoning}\n#### {result}"})
    return train, test


def build_tokenizer(answer_format, rows: list[dict], kind: str = "qwen2"):
    """smoke's tokenizer of `kind`, trained on the prompts and solutions with their digits left out, so that every
    digit stays a token of its own: a tiny model learns sums of digits far sooner than sums of arbitrary digit
    chunks."""
    texts = smoke.corpus(answer_format, rows, kind)
    return smoke.build_tokenizer([re.sub(r"\d", "", text) for text in texts], answer_format.tags, kind=kind)


def examples(tokenizer, answer_format, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) of each row for the warm start: the recipe's chat prompt as every other path tokenizes
    it (`generation.prompt_ids`: one BOS, the template's), and the formatted solution followed by the token the chat
    template ends a turn with (`<|eot_id|>` for Llama 3, whose end of sequence is another token), so that the model
    learns to stop where a turn ends."""
    prompt_ids = generation.prompt_ids(tokenizer, [answer_format.chat_prompt(r["question"]) for r in rows])
    # The trainer generates after the prompt's tokens, so the solution is tokenized on its own, as generated.
    solutions = [answer_format.gsm8k_solution(r["answer"]).rstrip("\n") for r in rows]
    solution_ids = tokenizer(solutions, add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids(models.end_of_turn(tokenizer) or tokenizer.eos_token)
    return [(p, s + [end]) for p, s in zip(prompt_ids, solution_ids, strict=True)]


def warm_start(model, tokenizer, answer_format, rows: list[dict], steps: int = WARM_STEPS, seed: int = 0):
    """Supervised fine-tuning on `examples` (recipe prompt, formatted solution + end of turn), loss on the solution
    only.

    AdamW at up to WARM_LR (linear warmup over WARM_WARMUP steps, then cosine decay to 0), batches of WARM_BATCH
    rows drawn without replacement. The model is trained in place and returned in eval mode.
    """
    import torch

    pairs = examples(tokenizer, answer_format, rows)
    pad = tokenizer.convert_tokens_to_ids(models.pad_token(tokenizer))  # the recipe's pad rule; masked out here

    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_LR, betas=(0.9, 0.99), weight_decay=0.0)
    # Linear warmup, then cosine decay to 0: constant rates left the model at a noisy, seed-dependent point of
    # learning to count (measured), and a decayed one settles on the data's mix of styles.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / WARM_WARMUP) * 0.5 * (1 + math.cos(math.pi * min(step / steps, 1.0))),
    )
    model.train()
    order: list[int] = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        if len(order) < WARM_BATCH:
            order = list(range(len(pairs)))
            rng.shuffle(order)
        batch = [pairs[order.pop()] for _ in range(WARM_BATCH)]
        width = max(len(p) + len(s) for p, s in batch)
        input_ids = torch.full((WARM_BATCH, width), pad)
        labels = torch.full((WARM_BATCH, width), -100)  # ignored by the loss: prompt and padding
        attention_mask = torch.zeros((WARM_BATCH, width), dtype=torch.long)
        for i, (p, s) in enumerate(batch):
            input_ids[i, : len(p) + len(s)] = torch.tensor(p + s)
            labels[i, len(p) : len(p) + len(s)] = torch.tensor(s)
            attention_mask[i, : len(p) + len(s)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 100 == 0 or step == steps:
            logger.info("Warm start %d/%d: loss %.3f (%.0f s)", step, steps, loss.item(), time.perf_counter() - started)
    return model.eval()


def prepare(answer_format, model_dir: str, data_dir: str | None, seed: int = 0) -> None:
    """Write the generated problems and the warm-started model wherever the demo defaults still point at them.

    The warm start is kept in `model_dir` with the settings that made it, and reused while they stay the same.
    """
    train, test = make_problems(N_TRAIN, N_TEST, seed)
    if data_dir == DATA_DIR:
        smoke.write_splits(data_dir, train, test)
    kind = next((kind for kind, folder in MODEL_DIRS.items() if folder == model_dir), None)
    if kind is None:
        return
    made_with = {
        "tiny_model": kind,
        "seed": seed,
        "n_train": N_TRAIN,
        "counting_share": COUNTING_SHARE,
        "hidden_size": HIDDEN_SIZE,
        "num_layers": NUM_LAYERS,
        "warm_steps": WARM_STEPS,
        "warm_lr": WARM_LR,
        "warm_batch": WARM_BATCH,
        "warm_warmup": WARM_WARMUP,
        "answer_format": answer_format.solution_template,  # a warm start in other tags teaches the wrong format
    }
    stamp = Path(model_dir) / "warm_start.json"
    if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == made_with:
        logger.info("Reusing the warm-started model in %s", model_dir)
        return
    stamp.unlink(missing_ok=True)  # a rebuild cut short must not pass for the old model
    tokenizer = build_tokenizer(answer_format, train, kind)
    model = smoke.build_tiny_model(tokenizer, seed, HIDDEN_SIZE, NUM_LAYERS, kind)
    logger.info("Warm start: %d steps on %d generated problems", WARM_STEPS, len(train))
    warm_start(model, tokenizer, answer_format, train, WARM_STEPS, seed)
    tokenizer.save_pretrained(model_dir)
    model.save_pretrained(model_dir)
    stamp.write_text(json.dumps(made_with, indent=2) + "\n", encoding="utf-8")
