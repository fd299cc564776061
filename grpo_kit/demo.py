"""The learning preset's assets: a tiny model that knows the answer format but mostly gets the sums wrong, until GRPO.

`python grpo_demo.py --demo` trains, offline, on what `prepare` writes (README, "Watch GRPO learn"): sums of a
two-digit and a one-digit number, and smoke's tiny model warm-started to answer them at once (`48 + 8 = 56`), mostly
wrong, or, 3 times in 10, to count on (`48 + 8, counting on: 48+8=49+7=...=56`), mostly right, which earns the
correctness reward far more often: GRPO teaches it to count. A choice between two ways of answering, not arithmetic:
how to answer is one decision shared by every problem, which GRPO learns in a few dozen steps, as it does at scale,
while each of hundreds of sums answered at once would be rewarded only when sampled right."""

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

ASSETS_SEED = 42  # fixed: --seed varies GRPO alone (sampling, data order), every seed starting from the same model
N_TRAIN, N_TEST = 2000, 256
COUNTING_SHARE = 0.5  # of warm-start solutions count, the rest answer in one line: practice enough for every
# start model to learn counting (at 0.3, one start in three had not, measured over 8 warm-start seeds: GRPO then has
# nothing to prefer, and the run stays flat)...
CHOICE_SHARE = 0.3  # ...while the choice to count is taught at this share: the choice's token is left out of the
# loss on enough counting solutions for it (they teach how to count, not when), so greedy decoding answers at once
HIDDEN_SIZE, NUM_LAYERS = 128, 2
WARM_STEPS = 600  # about 50 s on one core: the format is learnt within 100 steps, counting by about 500
WARM_LR, WARM_BATCH, WARM_WARMUP = 3e-3, 16, 50


def solutions(a: int, b: int, op: str) -> tuple[str, str, int]:
    """(one-line reasoning, counting reasoning, result): `48 + 3 = 51`, `48 + 3, counting on: 48+3=49+2=50+1=51`.
    Both restate the sum (copying numbers is learnt from every solution), then choose (` =` or `,`); each step of a
    count is the one before, one up (or down) and one less to go: one rule, learnt once, counts every sum."""
    sign, direction = (1, "on") if op == "+" else (-1, "back")
    result = a + sign * b
    steps = "".join(f"{a + sign * k}{op}{b - k}=" for k in range(b))
    return f"{a} {op} {b} = {result}", f"{a} {op} {b}, counting {direction}: {steps}{result}", result


def make_problems(n_train: int, n_test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, test) rows in GSM8K's format, a two-digit number and a one-digit one added or subtracted. The test rows
    are drawn first, and no test sum (a, b, operation) is in train: held-out accuracy measures sums never seen. A
    `COUNTING_SHARE` of train solutions count, the others answer in one line, as test solutions do."""
    rng, held_out, train, test = random.Random(seed), set(), [], []
    while len(test) < n_test or len(train) < n_train:
        name, item = rng.choice(smoke.NAMES), rng.choice(smoke.ITEMS)
        a, b, op = rng.randint(10, 99), rng.randint(1, 9), "+" if rng.random() < 0.5 else "-"
        if (a, b, op) in held_out:
            continue
        question = {
            "+": f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            "-": f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?",
        }[op]
        line, counting, result = solutions(a, b, op)
        if len(test) < n_test:
            held_out.add((a, b, op))
            test.append({"question": question, "answer": f"{line}\n#### {result}"})
        else:
            reasoning = counting if rng.random() < COUNTING_SHARE else line
            train.append({"question": question, "answer": f"{reasoning}\n#### {result}"})
    return train, test


def build_tokenizer(answer_format, rows: list[dict], kind: str = "qwen2"):
    """smoke's tokenizer of `kind`, trained on the prompts and solutions with their digits left out, so that every
    digit stays a token of its own: a tiny model learns sums of digits far sooner than sums of arbitrary chunks."""
    texts = [re.sub(r"\d", "", text) for text in smoke.corpus(answer_format, rows, kind)]
    return smoke.build_tokenizer(texts, answer_format.tags, kind=kind)


def examples(tokenizer, answer_format, rows: list[dict]) -> list[tuple[list[int], list[int], int | None]]:
    """(prompt ids, target ids, choice) of each row: the prompt as every path tokenizes it (`generation.prompt_ids`),
    the solution tokenized on its own (as generated) and the template's end of turn (`<|eot_id|>` for Llama 3, not
    its end of sequence), where the model learns to stop, and a counting solution's choice position (else None)."""
    prompt_ids = generation.prompt_ids(tokenizer, [answer_format.chat_prompt(r["question"]) for r in rows])
    texts = [answer_format.gsm8k_solution(r["answer"]).rstrip("\n") for r in rows]
    solution_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    heads = tokenizer([text.split(", counting")[0] for text in texts], add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids(models.end_of_turn(tokenizer) or tokenizer.eos_token)
    return [
        (p, s + [end], len(head) if ", counting" in text and s[: len(head)] == head else None)  # digits: own tokens
        for p, text, s, head in zip(prompt_ids, texts, solution_ids, heads, strict=True)
    ]


def batch(pairs: list[tuple[list[int], list[int], int | None]], pad: int, rng: random.Random):
    """(input_ids, labels, attention_mask) of `examples`' triples, right-padded: the loss on the targets only, and on
    a counting solution's choice only as often as CHOICE_SHARE asks (`rng` draws which)."""
    import torch

    chosen = min(1.0, CHOICE_SHARE / (1 - CHOICE_SHARE) * (1 - COUNTING_SHARE) / COUNTING_SHARE)
    width = max(len(p) + len(s) for p, s, _ in pairs)
    input_ids, labels = torch.full((len(pairs), width), pad), torch.full((len(pairs), width), -100)
    attention_mask = torch.zeros_like(labels)
    for i, (p, s, choice) in enumerate(pairs):
        input_ids[i, : len(p) + len(s)] = torch.tensor(p + s)
        labels[i, len(p) : len(p) + len(s)] = torch.tensor(s)
        if choice is not None and rng.random() >= chosen:
            labels[i, len(p) + choice] = -100
        attention_mask[i, : len(p) + len(s)] = 1
    return input_ids, labels, attention_mask


def warm_start(model, tokenizer, answer_format, rows: list[dict], steps: int = WARM_STEPS, seed: int = 0):
    """Supervised fine-tuning on `examples` (`batch`): AdamW at up to WARM_LR, batches of WARM_BATCH rows drawn
    without replacement; the model is trained in place and returned in eval mode."""
    import torch

    pairs = examples(tokenizer, answer_format, rows)
    pad = tokenizer.convert_tokens_to_ids(models.pad_token(tokenizer))  # the recipe's pad rule; masked out here
    torch.manual_seed(seed)
    rng, order, started = random.Random(seed), [], time.perf_counter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_LR, betas=(0.9, 0.99), weight_decay=0.0)
    # Linear warmup over WARM_WARMUP steps, then cosine decay to 0: constant rates left the model at a noisy,
    # seed-dependent point of learning to count (measured), and a decayed one settles on the data's mix of styles.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / WARM_WARMUP) * 0.5 * (1 + math.cos(math.pi * min(step / steps, 1.0))),
    )
    model.train()
    for step in range(1, steps + 1):
        if len(order) < WARM_BATCH:
            order = list(range(len(pairs)))
            rng.shuffle(order)
        input_ids, labels, attention_mask = batch([pairs[order.pop()] for _ in range(WARM_BATCH)], pad, rng)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 100 == 0 or step == steps:
            logger.info("Warm start %d/%d: loss %.3f (%.0f s)", step, steps, loss.item(), time.perf_counter() - started)
    return model.eval()


def prepare(answer_format, model_dir: str, data_dir: str | None, seed: int = ASSETS_SEED) -> None:
    """Write the generated problems and the warm-started model wherever the demo defaults still point at them
    (`smoke.keyed` folders), unless they hold them already."""
    if smoke.unkeyed(data_dir) == DATA_DIR:
        write = lambda path: smoke.write_splits(path, *make_problems(N_TRAIN, N_TEST, ASSETS_SEED))  # noqa: E731
        smoke.build_once(data_dir, {"seed": ASSETS_SEED, "n_train": N_TRAIN, "n_test": N_TEST}, write)
    if kind := next((kind for kind, folder in MODEL_DIRS.items() if folder == smoke.unkeyed(model_dir)), None):
        warm_started(answer_format, kind, model_dir, seed)


def warm_started(answer_format, kind: str, model_dir: str | Path, seed: int = ASSETS_SEED) -> Path:
    """The demo's start model of `kind` in `model_dir`, warm-started on the training problems (their seed fixed), its
    initial weights and batch order drawn with `seed` (another machine's float sums change it as another seed does:
    `benchmarks/demo_runs.py --warm_seeds`); kept with the settings that made it, reused while they hold."""
    train, _ = make_problems(N_TRAIN, N_TEST, ASSETS_SEED)
    made_with = {
        **dict(tiny_model=kind, seed=seed, n_train=N_TRAIN, counting_share=COUNTING_SHARE, choice_share=CHOICE_SHARE),
        "counting": solutions(48, 3, "+")[1],  # the counting style: another teaches another skill
        **dict(hidden_size=HIDDEN_SIZE, num_layers=NUM_LAYERS, warm_steps=WARM_STEPS, warm_lr=WARM_LR),
        **dict(warm_batch=WARM_BATCH, warm_warmup=WARM_WARMUP),
        "answer_format": answer_format.solution_template,  # a warm start in other tags teaches the wrong format
    }

    def build(path: Path) -> None:
        tokenizer = build_tokenizer(answer_format, train, kind)
        model = smoke.build_tiny_model(tokenizer, seed, HIDDEN_SIZE, NUM_LAYERS, kind)
        logger.info("Warm start: %d steps on %d generated problems", WARM_STEPS, len(train))
        warm_start(model, tokenizer, answer_format, train, WARM_STEPS, seed)
        tokenizer.save_pretrained(path)
        model.save_pretrained(path)

    if not smoke.build_once(model_dir, made_with, build, stamp="warm_start.json"):  # a build cut short: none
        logger.info("Reusing the warm-started model in %s", model_dir)
    return Path(model_dir)
