"""GRPO on GSM8K: teach a chat model grade-school math with five rule rewards.

    pip install -r requirements.txt
    python grpo_demo.py                                   # Qwen2.5-1.5B-Instruct on GSM8K, logs to wandb
    python grpo_demo.py --smoke                           # offline, on CPU: a tiny model, a few steps
    python grpo_demo.py --demo                            # offline, ~2 min on CPU: watch GRPO raise accuracy
    python grpo_demo.py --dataset ../gsm8k --max_steps 50 # a local GSM8K copy, a short run
    python grpo_demo.py --config my_recipe.yaml           # any GRPOConfig / ModelConfig field, as YAML

Every setting below is a default: any GRPOConfig or ModelConfig field can be overridden on the command line
(`--learning_rate 1e-6`) or in a YAML file (`--config`), command line winning.

Where this recipe departs from the reference script it descends from, and why:
1. Today's TRL has no `max_prompt_length`: prompts over 256 tokens are dropped in data prep, and counted.
2. `per_device_train_batch_size` now counts completions, not prompts: 16 completions per device step is the
   reference's one prompt x 16 generations, and 4 accumulation steps make 4 prompts per optimizer step.
3. The rewards parse multi-line reasoning (the reference's regexes never crossed a newline), compare numbers
   rather than strings (`1,080` == `1080`, `$18.00` == `18`) and never print.
4. The model is placed by the trainer (no `.to("cuda")`), so `accelerate launch` puts each process on its own GPU.
5. KL is off (`beta=0`, today's TRL default; the reference ran with 0.04): it saves the reference model's memory.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

logger = logging.getLogger("grpo_demo")

# ----------------------------------------------------------------------------------------------------------------
# Recipe constants: the block to edit. The command line and --config override any of them.

# model
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"  # or "meta-llama/Llama-3.2-1B-Instruct": outputs/ and run name follow

# answer format
REASONING_TAG = "reasoning"  # "think" gives the R1-style <think>...</think> format, in prompt and rewards alike
ANSWER_TAG = "answer"

# data
DATASET_NAME, DATASET_CONFIG = "openai/gsm8k", "main"
MAX_PROMPT_TOKENS = 256  # nearly every GSM8K prompt fits; longer ones are dropped, not cut (unanswerable then)

# GRPO: the reference's hyperparameters on today's TRL (GRPOConfig fields)
GRPO_DEFAULTS = dict(
    learning_rate=5e-6,  # small: RL nudges an instruct model that can already solve many problems
    adam_beta1=0.9,
    adam_beta2=0.99,
    weight_decay=0.1,
    warmup_steps=0.1,  # a float below 1 is a ratio: 10 % warmup (transformers v5 removed warmup_ratio)
    lr_scheduler_type="cosine",
    logging_steps=1,
    num_generations=16,  # the group GRPO normalises rewards within: more = lower-variance advantages
    # Per optimizer step with N processes: completions = per_device_train_batch_size (16) x
    # gradient_accumulation_steps (4) x N = 64 N; prompts = completions / num_generations = 4 N. Every process
    # generates for and scores its own prompts; rewards are gathered before advantages, so a group may span GPUs.
    # For the reference's 4 prompts per step on N GPUs, divide gradient_accumulation_steps by N (2 GPUs: 2,
    # 4 GPUs: 1), then per_device_train_batch_size (8 GPUs: 8). The total must divide by num_generations (checked).
    per_device_train_batch_size=16,  # completions per device per micro-step: one prompt's 16 generations
    gradient_accumulation_steps=4,  # micro-steps per optimizer step: 4 prompts x 16 = 64 completions on one GPU
    max_completion_length=786,
    temperature=0.9,  # the reference ran TRL 0.14's default; today's is 1.0
    num_train_epochs=1,
    save_steps=100,
    max_grad_norm=0.1,  # tight clipping keeps single noisy groups from wrecking the policy
    report_to=["wandb"],
    log_on_each_node=False,
    log_completions=True,  # the sample the reference printed, as a table in the console, wandb and outputs/
    num_completions_to_print=2,
)
# LoRA, used with --use_peft (add --load_in_4bit for QLoRA on CUDA): the reference's configuration
LORA_DEFAULTS = dict(
    lora_r=16,
    lora_alpha=64,  # alpha/r = 4: a strong adapter update, as the reference had it
    lora_dropout=0.05,
    lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)


# ----------------------------------------------------------------------------------------------------------------
# The answer format and its parsing


def _tag_block(tag: str, body: str) -> str:
    return f"<{tag}>\n{body}\n</{tag}>\n"


SYSTEM_PROMPT = (
    "\nRespond in the following format:\n" + _tag_block(REASONING_TAG, "...") + _tag_block(ANSWER_TAG, "...")
)
XML_COT_FORMAT = _tag_block(REASONING_TAG, "{reasoning}") + _tag_block(ANSWER_TAG, "{answer}")

R_OPEN, R_CLOSE = f"<{REASONING_TAG}>", f"</{REASONING_TAG}>"
A_OPEN, A_CLOSE = f"<{ANSWER_TAG}>", f"</{ANSWER_TAG}>"

# A number as people write it: thousands separators only in groups of three, an optional sign and decimals.
NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+", re.ASCII)
# An integer written the way GSM8K's gold answers are: 72, -3, 1,080.
GSM8K_INT_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)", re.ASCII)
BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
MAX_ANSWER_CHARS = 300  # an answer block is a number and perhaps a short sentence; longer is an essay, not an answer
MAX_NUMBER_CHARS = 40  # far beyond any GSM8K answer; keeps arbitrary-precision parsing cheap


def extract_xml_answer(text: str) -> str:
    """The stripped content of the last complete <answer>...</answer> block; "" when there is none."""
    close = text.rfind(A_CLOSE)
    if close < 0:
        return ""
    start = text.rfind(A_OPEN, 0, close)
    if start < 0:
        return ""
    return text[start + len(A_OPEN) : close].strip()


def extract_hash_answer(text: str) -> str | None:
    """The gold answer after GSM8K's `####`, canonical: sign kept, thousands separators dropped; None if absent."""
    if "####" not in text:
        return None
    return text.split("####")[-1].strip().replace(",", "")


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number when it is one (`1,080`, `-3`, `18.00`, `.5`), else None."""
    text = str(text).strip()
    if len(text) > MAX_NUMBER_CHARS or not NUMBER_RE.fullmatch(text):
        return None
    return Fraction(Decimal(text.replace(",", "")))


def answer_number(answer: str) -> Fraction | None:
    """The one number an answer block commits to, else None.

    `\\boxed{...}` is looked into; currency signs, units and words around a single number are ignored
    (`$1,080.00 in total.` is 1080). A block with no number, with two different ones (`18 or 20`,
    `3 * 6 = 18`), or longer than MAX_ANSWER_CHARS commits to nothing.
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    boxed = BOXED_RE.findall(answer)
    if boxed:
        answer = boxed[-1]
    numbers = {parse_number(n) for n in NUMBER_RE.findall(answer)}
    return numbers.pop() if len(numbers) == 1 else None


# ----------------------------------------------------------------------------------------------------------------
# Data


def load_gsm8k_split(split: str, dataset_dir: str | None = None):
    """GSM8K rows (`question`, `answer`) from a local folder of `<split>.jsonl`, or from the Hub."""
    from datasets import Dataset, load_dataset

    if dataset_dir:
        path = Path(dataset_dir) / f"{split}.jsonl"
        if not path.is_file():
            sys.exit(f"--dataset {dataset_dir}: no {path.name} there (expected GSM8K's train.jsonl / test.jsonl)")
        with path.open(encoding="utf-8") as f:
            return Dataset.from_list([json.loads(line) for line in f if line.strip()])
    try:
        return load_dataset(DATASET_NAME, DATASET_CONFIG, split=split)
    except Exception as err:  # the Hub is unreachable or the data set is not cached
        sys.exit(
            f"Could not load {DATASET_NAME} ({type(err).__name__}: {str(err)[:200]}).\n"
            "Offline? Use a local copy: --dataset DIR (a folder with train.jsonl and test.jsonl), "
            "or try the whole recipe on generated problems: --smoke"
        )


def chat_prompt(question: str) -> list[dict]:
    """The conversation the model answers: the format instructions as the system message, then the question."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def get_gsm8k_questions(split: str = "train", dataset_dir: str | None = None, strict: bool = False):
    """GSM8K as system+user chat prompts with canonical gold answers: columns `question`, `prompt`, `answer`.

    Rows with no `####` answer, an empty question or a gold answer that is not a number are counted, named and
    dropped (or, with `strict`, stop the run): a row without a usable answer would only ever teach noise.
    """
    data = load_gsm8k_split(split, dataset_dir)
    bad: dict[str, list[int]] = {"no '####' answer": [], "an empty question": [], "a gold answer that is no number": []}
    rows = []
    for i, row in enumerate(data):
        question, answer = (row.get("question") or "").strip(), extract_hash_answer(row.get("answer") or "")
        if answer is None:
            bad["no '####' answer"].append(i)
        elif not question:
            bad["an empty question"].append(i)
        elif parse_number(answer) is None:
            bad["a gold answer that is no number"].append(i)
        else:
            rows.append({"question": question, "prompt": chat_prompt(question), "answer": answer})
    for reason, ids in bad.items():
        if ids:
            message = f"{len(ids)} {split} rows with {reason} (row ids {ids[:20]}{' ...' if len(ids) > 20 else ''})"
            if strict:
                sys.exit(f"Bad data: {message}. Fix the data, or drop such rows: --strict_data false")
            logger.warning("Dropped %s", message)
    if not rows:
        sys.exit(f"No usable {split} rows in {dataset_dir or DATASET_NAME}: every row was dropped (see above)")
    from datasets import Dataset

    return Dataset.from_list(rows)


def drop_long_prompts(data, tokenizer, max_tokens: int = MAX_PROMPT_TOKENS):
    """Drop rows whose chat-templated prompt exceeds `max_tokens` (a cut question is unanswerable), and say so."""
    lengths = [
        len(tokenizer.apply_chat_template(p, tokenize=True, add_generation_prompt=True, return_dict=False))
        for p in data["prompt"]
    ]
    long_rows = [i for i, n in enumerate(lengths) if n > max_tokens]
    logger.info(
        "Prompts: %d rows, %d-%d tokens; %d over %d tokens dropped%s",
        len(lengths),
        min(lengths, default=0),
        max(lengths, default=0),
        len(long_rows),
        max_tokens,
        f" (rows {long_rows[:20]})" if long_rows else "",
    )
    if not long_rows:
        return data
    keep = sorted(set(range(len(lengths))) - set(long_rows))
    return data.select(keep)


# ----------------------------------------------------------------------------------------------------------------
# Rewards: pure functions of TRL's conversational completions, one float per completion, never raising.


def completion_texts(completions) -> list[str]:
    """The assistant text of each completion, conversational (`[[{"content": ...}]]`) or plain strings."""
    return [c if isinstance(c, str) else (c[0].get("content") or "") if c else "" for c in completions]


def correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    """2.0 if the last answer block commits to the gold number, else 0.0.

    Numbers are compared, not strings: `1,080`, `$1080`, `1080.00`, `\\boxed{1080}` and `1080 apples` all
    equal gold `1080`. A number outside the answer block does not count.
    """
    extracted = [extract_xml_answer(t) for t in completion_texts(completions)]
    if "log_extra" in kwargs:  # shown beside each completion in TRL's completions table
        kwargs["log_extra"]("gold", list(answer))
        kwargs["log_extra"]("extracted", extracted)
    golds = {a: parse_number(a) for a in set(answer)}  # parse each gold once per group
    return [
        2.0 if golds[a] is not None and answer_number(r) == golds[a] else 0.0
        for r, a in zip(extracted, answer, strict=True)
    ]


def int_reward_func(completions, **kwargs) -> list[float]:
    """0.5 if the answer block is exactly an integer as GSM8K writes them (`72`, `-3`, `1,080`), else 0.0."""
    blocks = [extract_xml_answer(t) for t in completion_texts(completions)]
    return [0.5 if len(b) <= MAX_ANSWER_CHARS and GSM8K_INT_RE.fullmatch(b) else 0.0 for b in blocks]


def is_strict_format(text: str) -> bool:
    """Whether `text` is in the exact answer format (see `strict_format_reward_func`)."""
    body = text[:-1] if text.endswith("\n") else text
    if not all(body.count(tag) == 1 for tag in (R_OPEN, R_CLOSE, A_OPEN, A_CLOSE)):
        return False  # each tag once: no nested or repeated blocks
    head, middle, tail = R_OPEN + "\n", f"\n{R_CLOSE}\n{A_OPEN}\n", "\n" + A_CLOSE
    split = body.find(middle)
    return (
        body.startswith(head)
        and body.endswith(tail)
        and split >= len(head)  # the reasoning may be empty, its newlines may not be shared
        and split + len(middle) <= len(body) - len(tail)
    )


def strict_format_reward_func(completions, **kwargs) -> list[float]:
    """0.5 if the completion is exactly `<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>` (one final
    newline allowed, each tag once, nothing around it), else 0.0."""
    return [0.5 if is_strict_format(t) else 0.0 for t in completion_texts(completions)]


def is_soft_format(text: str) -> bool:
    """Whether `text` opens with a reasoning block and then an answer block (see `soft_format_reward_func`)."""
    text = text.lstrip()
    if not text.startswith(R_OPEN):
        return False
    close = text.find(R_CLOSE)
    if close < 0:
        return False
    rest = text[close + len(R_CLOSE) :].lstrip()
    return rest.startswith(A_OPEN) and rest.find(A_CLOSE, len(A_OPEN)) >= 0


def soft_format_reward_func(completions, **kwargs) -> list[float]:
    """0.5 if the completion opens (after any whitespace) with a reasoning block followed, whitespace between
    allowed, by an answer block; line breaks anywhere inside, text after it allowed; else 0.0."""
    return [0.5 if is_soft_format(t) else 0.0 for t in completion_texts(completions)]


def count_xml(text: str) -> float:
    """The reference's tag-by-tag score: 0.125 for each of `<reasoning>\\n`, `\\n</reasoning>\\n`, `\\n<answer>\\n`
    and `\\n</answer>` appearing exactly once, the two answer tags losing 0.001 per character after the closing
    tag (a final newline is free), never below 0. From 0.0 to 0.5; a strictly formatted completion earns 0.5."""
    close = "\n" + A_CLOSE
    after = text.rsplit(close, 1)[1] if close in text else ""
    penalty = 0.001 * (len(after) - after.startswith("\n"))
    score = 0.0
    if text.count(R_OPEN + "\n") == 1:
        score += 0.125
    if text.count(f"\n{R_CLOSE}\n") == 1:
        score += 0.125
    if text.count(f"\n{A_OPEN}\n") == 1:
        score += max(0.0, 0.125 - penalty)
    if text.count(close) == 1:
        score += max(0.0, 0.125 - penalty)
    return score


def xmlcount_reward_func(completions, **kwargs) -> list[float]:
    """`count_xml` of each completion: 0.0 to 0.5 (see there)."""
    return [count_xml(t) for t in completion_texts(completions)]


REWARD_FUNCS = [
    xmlcount_reward_func,
    soft_format_reward_func,
    strict_format_reward_func,
    int_reward_func,
    correctness_reward_func,
]


# ----------------------------------------------------------------------------------------------------------------
# Settings: the constants above are the defaults; YAML (--config) overrides them, the command line overrides both.


@dataclass
class RecipeArguments:
    dataset: str | None = field(
        default=None, metadata={"help": "Folder with GSM8K's train.jsonl/test.jsonl; default: the Hub's openai/gsm8k"}
    )
    max_prompt_tokens: int = field(default=MAX_PROMPT_TOKENS, metadata={"help": "Longer prompts are dropped"})
    strict_data: bool = field(
        default=False, metadata={"help": "Stop on a bad data row instead of dropping it (and saying so)"}
    )
    smoke: bool = field(
        default=False, metadata={"help": "Offline CPU check: tiny generated model and problems, a few steps"}
    )
    demo: bool = field(
        default=False,
        metadata={"help": "Offline CPU demo, ~2 min: GRPO raises a tiny warm-started model's accuracy (curves.png)"},
    )
    # GSM8K test accuracy: greedy, max_completion_length new tokens, scored strict (answer block) and lenient
    eval_only: bool = field(
        default=False,
        metadata={"help": "Evaluate --model_name_or_path on the test split into <output_dir>/eval/ and exit"},
    )
    final_eval: bool = field(
        default=True,
        metadata={"help": "Evaluate the start model (unless eval/baseline exists) and the trained one, and compare"},
    )
    eval_every_steps: int = field(
        default=50, metadata={"help": "Accuracy on eval_subset test questions every N steps, logged; 0: off"}
    )
    eval_subset: int = field(default=100, metadata={"help": "The first N test questions, for eval_every_steps"})
    eval_limit: int | None = field(default=None, metadata={"help": "Evaluate the first N test questions; default: all"})
    eval_batch_size: int = field(default=64, metadata={"help": "Questions generated together in evaluation"})
    ask: str | None = field(
        default=None, metadata={"help": "Print a sampled answer of --model_name_or_path to this question and exit"}
    )


def run_names(model_name: str) -> dict:
    """outputs/<short>-GRPO and <short>-GRPO-gsm8k, <short> like `Qwen-1.5B` or `Llama-1B`."""
    base = model_name.rstrip("/").split("/")[-1]
    match = re.match(r"(Qwen|Llama)[-\d.]*?-(\d+(?:\.\d+)?B)\b", base, re.IGNORECASE)
    short = f"{match[1]}-{match[2]}" if match else base
    return {"output_dir": f"outputs/{short}-GRPO", "run_name": f"{short}-GRPO-gsm8k"}


def parse_settings(argv: list[str] | None = None):
    """(RecipeArguments, GRPOConfig, ModelConfig): constants < `--smoke`/`--demo` preset < YAML < command line.

    Every setting that can be checked without the model is checked here, before anything is loaded or downloaded.
    """
    import torch
    from trl import GRPOConfig, ModelConfig, TrlParser

    from grpo_kit import checks, demo, smoke

    argv, yaml_values = checks.read_config_flag(list(sys.argv[1:] if argv is None else argv))
    parser = TrlParser((RecipeArguments, GRPOConfig, ModelConfig))

    def resolve(defaults: dict) -> dict:
        unknown_yaml = parser.set_defaults_with_config(**{**defaults, **yaml_values})
        namespace, unknown_cli = parser.parse_known_args(argv)
        if unknown_yaml or unknown_cli:
            sys.exit(f"Unknown settings: {unknown_yaml + unknown_cli} (python grpo_demo.py --help lists them)")
        return vars(namespace)

    cuda = torch.cuda.is_available()
    defaults = {
        **GRPO_DEFAULTS,
        **LORA_DEFAULTS,
        "model_name_or_path": MODEL_NAME,
        "bf16": cuda,
        "dtype": "bfloat16" if cuda else "float32",  # ModelConfig's own default is float32 everywhere
        "use_cpu": not cuda,  # also makes `accelerate launch` processes on a CPU-only machine join one gloo group
    }
    chosen = resolve(defaults)
    if chosen["smoke"]:
        defaults.update(smoke.SMOKE_DEFAULTS)
    elif chosen["demo"]:
        defaults.update(demo.DEMO_DEFAULTS)
    # The output folder and run name follow the model, wherever it was chosen (a preset may name its own).
    defaults = {**run_names(resolve(defaults)["model_name_or_path"]), **defaults}
    problems = checks.check_settings(resolve(defaults), len(REWARD_FUNCS), (REASONING_TAG, ANSWER_TAG))
    if problems:
        sys.exit("Invalid settings:\n" + "\n".join(f"  - {p}" for p in problems))
    return parser.parse_args_into_dataclasses(argv)


# ----------------------------------------------------------------------------------------------------------------
# Model and logging


def model_init_kwargs(model_args) -> dict:
    """The dtype (bf16 on CUDA, fp32 on CPU, by default) and flash-attention 2 on CUDA when flash-attn imports,
    else sdpa. The trainer loads the model with these and places it."""
    import torch

    attn = model_args.attn_implementation
    if attn is None:
        if not torch.cuda.is_available():
            attn = "sdpa"
        elif importlib.util.find_spec("flash_attn") is not None:
            attn = "flash_attention_2"
        else:
            attn = "sdpa"
            logger.warning("flash-attn is not installed: using sdpa attention (pip install -r requirements-gpu.txt)")
    return {"dtype": model_args.dtype, "attn_implementation": attn, "revision": model_args.model_revision}


def load_tokenizer(model_args, training_args):
    """The model's tokenizer, with a pad token; a short message instead of a traceback when it can't be had."""
    from transformers import AutoTokenizer

    name = model_args.model_name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
    except OSError as err:  # not on disk, not in the cache, and the Hub unreachable or gated
        sys.exit(
            f"Could not load the model {name!r} ({str(err).splitlines()[0][:200]}).\n"
            "Offline? Point --model_name_or_path at a local folder, or try the recipe offline: --smoke. "
            "Gated (Llama)? Accept the licence on the Hub and run `hf auth login`."
        )
    if tokenizer.pad_token is None:  # Llama 3.2 ships none; padding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def main(argv: list[str] | None = None) -> None:
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_kit import checks, demo, evaluate, plots, record, smoke, tracking

    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,  # other processes: warnings
    )
    recipe_args, training_args, model_args = parse_settings(argv)  # checked before anything loads
    out_dir, model_name = training_args.output_dir, model_args.model_name_or_path
    resume = checks.resolve_resume(training_args.resume_from_checkpoint, out_dir)
    trains = not (recipe_args.eval_only or recipe_args.ask)
    preset = smoke if recipe_args.smoke else demo if recipe_args.demo else None
    if preset:  # build the tiny model (warm-started for --demo) and the generated problems the preset points at
        # Under `accelerate launch` every process gets here: the first writes, the others wait, then all read.
        with training_args.main_process_first(local=False, desc="preset assets"):
            if training_args.process_index == 0:
                preset.prepare(model_name, recipe_args.dataset, out_dir, trains and not resume, training_args.seed)
    if recipe_args.ask:  # the trained model answers a new question, sampled as a user would see it
        print(evaluate.ask(model_name, recipe_args.ask, training_args.max_completion_length))
        return

    # 1. data: chat prompts with canonical answers, over-long prompts dropped; the test split for accuracy
    measure = recipe_args.eval_only or recipe_args.final_eval or recipe_args.eval_every_steps > 0
    data = (recipe_args.dataset, recipe_args.strict_data)
    test = get_gsm8k_questions("test", *data) if measure else None
    train = None if recipe_args.eval_only else get_gsm8k_questions("train", *data)
    tokenizer = load_tokenizer(model_args, training_args)
    evals = evaluate.Evaluator(
        test,
        tokenizer,
        out_dir,
        max_new_tokens=training_args.max_completion_length,
        batch_size=recipe_args.eval_batch_size,
        limit=recipe_args.eval_limit,
    )
    if recipe_args.eval_only:  # the start model is the baseline; a model in its own output folder is the final one
        name = "final" if Path(model_name).resolve() == Path(out_dir).resolve() else "baseline"
        evals.run(name, model_name, use_vllm=training_args.use_vllm)
        evals.compare()
        return
    dataset = drop_long_prompts(train, tokenizer, recipe_args.max_prompt_tokens)

    # 2. trainer: the model is loaded by it, placed by it, one copy per process
    tracking.configure_wandb(training_args)
    training_args.model_init_kwargs = model_init_kwargs(model_args)
    trainer = GRPOTrainer(
        model=model_name,
        processing_class=tokenizer,
        reward_funcs=REWARD_FUNCS,
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),  # None unless --use_peft
        quantization_config=get_quantization_config(model_args),  # None unless --load_in_4bit / --load_in_8bit
    )
    main_process = trainer.accelerator.is_main_process

    # 3. before training: a record of the run, and the start model's accuracy (only the main process writes or
    # generates; the others wait for it at their first collective call)
    if main_process:
        settings = {"recipe": recipe_args, "training": training_args, "model": model_args}
        run = record.write_run_record(out_dir, settings, dataset, training_args.seed)
        trainer.add_callback(record.link_to_wandb(run, out_dir))
        if recipe_args.final_eval and not evals.done("baseline"):
            evals.run("baseline", model_name)
    if recipe_args.eval_every_steps > 0:
        trainer.add_callback(evals.callback(trainer, recipe_args.eval_every_steps, recipe_args.eval_subset))

    # 4. train (from the last checkpoint when resuming), save, measure the saved model, close the trackers
    if resume:
        logger.info("Resuming from %s", resume)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(out_dir)
    trainer.save_state()  # trainer_state.json beside the final model: every logged metric, step by step
    if recipe_args.final_eval and main_process:
        evals.run("final", out_dir)
        evals.compare()
    if main_process:
        plots.plot_curves(out_dir)  # curves.png: rewards, completion length and accuracy, readable without wandb
    tracking.finish(trainer)
    logger.info("Model saved to %s", out_dir)


if __name__ == "__main__":
    main()
