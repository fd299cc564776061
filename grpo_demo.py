"""GRPO on GSM8K: teach a chat model grade-school math with five rule rewards.

    pip install -r requirements.txt
    python grpo_demo.py                                   # Qwen2.5-1.5B-Instruct on GSM8K, logs to wandb
    python grpo_demo.py --smoke                           # offline, on CPU: a tiny model, a few steps
    python grpo_demo.py --demo                            # offline, ~2 min on CPU: watch GRPO raise accuracy
    python grpo_demo.py --dataset ../gsm8k --max_steps 50 # a local GSM8K copy, a short run
    python grpo_demo.py --config my_recipe.yaml           # any GRPOConfig / ModelConfig field, as YAML
    sbatch slurm/grpo.sbatch                              # Slurm: one node serves vLLM, the others train
    python grpo_demo.py --config configs/dr_grpo.yaml     # another objective: configs/ holds the GRPO variants
    python -m grpo_kit.search --trials 20                 # search the reward weights with Optuna (optional)

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
6. Full fine-tuning keeps fp32 weights and computes in bf16: the reference's pure-bf16 weights lost most updates.
7. The loss is today's TRL default, token-level (`loss_type="dapo"`); the reference's averaged each completion
   first (`"grpo"`). `--config configs/reference_objective.yaml` trains the reference's objective.
"""

from __future__ import annotations

import sys
from functools import partial

from grpo_kit.answer_format import AnswerFormat, Tags, bind
from grpo_kit.data import drop_long_prompts  # prompts over --max_prompt_tokens are dropped, and counted
from grpo_kit.numbers import answer_number, is_gsm8k_integer, parse_number

# ----------------------------------------------------------------------------------------------------------------
# Recipe constants: the block to edit. The command line and --config override any of them.

# model
MODEL_NAME = "Qwen/Qwen2.5-1.5B-Instruct"  # or "meta-llama/Llama-3.2-1B-Instruct": outputs/ and run name follow

# answer format: the default tags (--reasoning_tag, --answer_tag)
REASONING_TAG = "reasoning"  # "think" gives the R1-style <think>...</think> format, in prompt and rewards alike
ANSWER_TAG = "answer"

# data
DATASET_NAME, DATASET_CONFIG = "openai/gsm8k", "main"
MAX_PROMPT_TOKENS = 256  # nearly every GSM8K prompt fits; longer ones are dropped, not cut (unanswerable then)

# supervised warm start before GRPO (--warm_start_rows): none for the instruct models above, which write the format
# when asked. A small model that never writes it earns 0 on every completion, and GRPO learns nothing from groups that
# all score alike: 64 GSM8K solutions in the format (one epoch of TRL's SFTTrainer) give SmolLM2-135M-Instruct 41 %
# of its completions in the format, and 15 GRPO steps take it to 82 % (docs/real_model.md)
WARM_START_ROWS = 0
WARM_START_LEARNING_RATE = 5e-5  # a few steps on a small model: far above GRPO's, as supervised fine-tuning runs

# GRPO: the reference's hyperparameters on today's TRL (GRPOConfig fields)
GRPO_DEFAULTS = dict(
    learning_rate=5e-6,  # small: RL nudges an instruct model that can already solve many problems
    adam_beta1=0.9,
    adam_beta2=0.99,
    weight_decay=0.1,
    warmup_steps=0.1,  # a float below 1 is a ratio: 10 % warmup (transformers v5 removed warmup_ratio)
    lr_scheduler_type="cosine",
    logging_steps=1,
    logging_nan_inf_filter=False,  # a NaN loss is logged as NaN, not as the mean before it (health checks stop on it)
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
    # The objective: TRL 1.16's defaults, named because the reference's TRL 0.14 trained another one
    # (configs/reference_objective.yaml restores it; README "Objectives" lists the others).
    loss_type="dapo",  # all tokens of the accumulated batch weigh alike; the reference: "grpo", a mean per completion
    scale_rewards="group",  # advantage = (reward - group mean) / group std, as in the reference; "none": Dr. GRPO's
    beta=0.0,  # no KL penalty, so no reference model in memory; the reference: 0.04
    num_train_epochs=1,
    save_steps=100,
    save_total_limit=3,  # a full fine-tuning checkpoint of the 1.5B model is ~19 GB (fp32 weights + AdamW moments)
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
# The answer format and its parsing: each function takes a run's tags, by default the constants above (as the
# public names SYSTEM_PROMPT, XML_COT_FORMAT and the rewards called directly use them).

TAGS = Tags(REASONING_TAG, ANSWER_TAG)


def _tag_block(tag: str, body: str) -> str:
    return f"<{tag}>\n{body}\n</{tag}>\n"


def system_prompt(tags: Tags = TAGS) -> str:
    """The format instructions every prompt opens with."""
    return "\nRespond in the following format:\n" + _tag_block(tags.reasoning, "...") + _tag_block(tags.answer, "...")


def solution_template(tags: Tags = TAGS) -> str:
    """A perfectly formatted completion: a str.format template with {reasoning} and {answer}."""
    return _tag_block(tags.reasoning, "{reasoning}") + _tag_block(tags.answer, "{answer}")


SYSTEM_PROMPT, XML_COT_FORMAT = system_prompt(), solution_template()


def extract_xml_answer(text: str, tags: Tags = TAGS) -> str:
    """The stripped content of the last complete <answer>...</answer> block; "" when there is none."""
    close = text.rfind(tags.a_close)
    start = text.rfind(tags.a_open, 0, max(close, 0))
    if close < 0 or start < 0:
        return ""
    return text[start + len(tags.a_open) : close].strip()


def extract_hash_answer(text: str) -> str | None:
    """The gold answer after GSM8K's `####`, canonical: sign kept, thousands separators dropped; None if absent."""
    if "####" not in text:
        return None
    return text.split("####")[-1].strip().replace(",", "")


def is_strict_format(text: str, tags: Tags = TAGS) -> bool:
    """Whether `text` is exactly `<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>`: one final newline
    allowed, each tag once, nothing around it."""
    body = text[:-1] if text.endswith("\n") else text
    if not all(body.count(tag) == 1 for tag in tags.written):
        return False  # each tag once: no nested or repeated blocks
    head, middle, tail = tags.r_open + "\n", f"\n{tags.r_close}\n{tags.a_open}\n", "\n" + tags.a_close
    split = body.find(middle)
    return (
        body.startswith(head)
        and body.endswith(tail)
        and split >= len(head)  # the reasoning may be empty, its newlines may not be shared
        and split + len(middle) <= len(body) - len(tail)
    )


def is_soft_format(text: str, tags: Tags = TAGS) -> bool:
    """Whether `text` opens (after any whitespace) with a reasoning block followed, whitespace between allowed, by
    an answer block; line breaks anywhere inside, text after it allowed."""
    text = text.lstrip()
    if not text.startswith(tags.r_open):
        return False
    close = text.find(tags.r_close)
    if close < 0:
        return False
    rest = text[close + len(tags.r_close) :].lstrip()
    return rest.startswith(tags.a_open) and rest.find(tags.a_close, len(tags.a_open)) >= 0


# ----------------------------------------------------------------------------------------------------------------
# Data


def chat_prompt(question: str, tags: Tags = TAGS) -> list[dict]:
    """The conversation the model answers: the format instructions as the system message, then the question."""
    return [{"role": "system", "content": system_prompt(tags)}, {"role": "user", "content": question}]


def get_gsm8k_questions(split: str = "train", dataset_dir: str | None = None, strict: bool = False, tags: Tags = TAGS):
    """GSM8K as system+user chat prompts (in `tags`) with canonical gold answers: columns `question`, `prompt`,
    `answer`, and `solution` (GSM8K's worked solution). Lines that are no JSON object, and rows with no `####` answer,
    an empty question or a gold that is no number are counted, named (file and line) and dropped, or with `strict`
    stop the run: a row without a usable answer would only ever teach noise."""
    from datasets import Dataset

    from grpo_kit.data import load_split, report_bad_rows

    examples, bad, named = load_split(split, dataset_dir, DATASET_NAME, DATASET_CONFIG)  # bad: unreadable lines
    rows = []
    for where, row in examples:
        question, solution = row.get("question"), row.get("answer")
        if not (isinstance(question, str) and isinstance(solution, str)):
            bad.setdefault("a question or answer that is not text", []).append(where)
            continue
        question, answer = question.strip(), extract_hash_answer(solution)
        if answer is None:
            bad.setdefault("no '####' answer", []).append(where)
        elif not question:
            bad.setdefault("an empty question", []).append(where)
        elif parse_number(solution.rsplit("####", 1)[-1]) is None:  # as written: `1,2` is no number, `1,200` is
            bad.setdefault("a gold answer that is no number", []).append(where)
        else:
            prompt = chat_prompt(question, tags)
            rows.append({"question": question, "prompt": prompt, "answer": answer, "solution": solution})
    report_bad_rows(bad, len(rows), split, named, strict)
    return Dataset.from_list(rows)


# ----------------------------------------------------------------------------------------------------------------
# Rewards: pure functions of TRL's conversational completions, one float per completion, never raising.


def completion_texts(completions) -> list[str]:
    """The assistant text of each completion, conversational (`[[{"content": ...}]]`) or plain strings."""
    return [c if isinstance(c, str) else (c[0].get("content") or "") if c else "" for c in completions]


def correctness_reward_func(prompts, completions, answer, tags: Tags = TAGS, **kwargs) -> list[float]:
    """2.0 if the last answer block commits to the gold number, else 0.0.

    Numbers are compared, not strings: `1,080`, `$1080`, `1080.00`, `\\boxed{1080}` and `1080 apples` all
    equal gold `1080`. A number outside the answer block does not count.
    """
    extracted = [extract_xml_answer(t, tags) for t in completion_texts(completions)]
    if "log_extra" in kwargs:  # shown beside each completion in TRL's completions table
        kwargs["log_extra"]("gold", list(answer))
        kwargs["log_extra"]("extracted", extracted)
    golds = {a: parse_number(a) for a in set(answer)}  # parse each gold once per group
    return [
        2.0 if golds[a] is not None and answer_number(r) == golds[a] else 0.0
        for r, a in zip(extracted, answer, strict=True)
    ]


def int_reward_func(completions, tags: Tags = TAGS, **kwargs) -> list[float]:
    """0.5 if the answer block is exactly an integer as GSM8K writes them (`72`, `-3`, `1,080`), else 0.0."""
    return [0.5 if is_gsm8k_integer(extract_xml_answer(t, tags)) else 0.0 for t in completion_texts(completions)]


def strict_format_reward_func(completions, tags: Tags = TAGS, **kwargs) -> list[float]:
    """0.5 if the completion is exactly `<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>` (one final
    newline allowed, each tag once, nothing around it), else 0.0."""
    return [0.5 if is_strict_format(t, tags) else 0.0 for t in completion_texts(completions)]


def soft_format_reward_func(completions, tags: Tags = TAGS, **kwargs) -> list[float]:
    """0.5 if the completion opens (after any whitespace) with a reasoning block followed, whitespace between
    allowed, by an answer block; line breaks anywhere inside, text after it allowed; else 0.0."""
    return [0.5 if is_soft_format(t, tags) else 0.0 for t in completion_texts(completions)]


def count_xml(text: str, tags: Tags = TAGS) -> float:
    """The reference's tag-by-tag score: 0.125 for each of `<reasoning>\\n`, `\\n</reasoning>\\n`, `\\n<answer>\\n`
    and `\\n</answer>` appearing exactly once, the two answer tags losing 0.001 per character after the closing
    tag (a final newline is free), never below 0. From 0.0 to 0.5; a strictly formatted completion earns 0.5."""
    close = "\n" + tags.a_close
    after = text.rsplit(close, 1)[1] if close in text else ""
    penalty = 0.001 * (len(after) - after.startswith("\n"))
    worth = {tags.r_open + "\n": 0.125, f"\n{tags.r_close}\n": 0.125}  # the answer tags: less the penalty
    worth |= {f"\n{tags.a_open}\n": max(0.0, 0.125 - penalty), close: max(0.0, 0.125 - penalty)}
    return sum((value for tag, value in worth.items() if text.count(tag) == 1), 0.0)


def xmlcount_reward_func(completions, tags: Tags = TAGS, **kwargs) -> list[float]:
    """`count_xml` of each completion: 0.0 to 0.5 (see there)."""
    return [count_xml(t, tags) for t in completion_texts(completions)]


REWARD_FUNCS = [
    xmlcount_reward_func,
    soft_format_reward_func,
    strict_format_reward_func,
    int_reward_func,
    correctness_reward_func,
]
# What each reward pays for, the right answer ("correct") or the form ("format"), and the most it pays: the health
# checks and the console's "correct" share read these, and the settings refuse a reward without its line.
REWARD_ROLES = {
    "xmlcount_reward_func": ("format", 0.5),
    "soft_format_reward_func": ("format", 0.5),
    "strict_format_reward_func": ("format", 0.5),
    "int_reward_func": ("format", 0.5),
    "correctness_reward_func": ("correct", 2.0),
}


def reward_funcs(tags: Tags = TAGS) -> list:
    """The five rewards reading completions in `tags`, each under its own name."""
    return [bind(func, tags=tags) for func in REWARD_FUNCS]


def answer_format(tags: Tags = TAGS) -> AnswerFormat:
    """What the evaluation, --ask, the offline presets and the warm start need to know of the format in `tags`:
    handed to them, so that an edited copy of this file, or a run with other tags, is measured as it trains."""
    return AnswerFormat(
        chat_prompt=partial(chat_prompt, tags=tags),
        solution_template=solution_template(tags),
        tags=tags.written,
        extract_answer=partial(extract_xml_answer, tags=tags),
        is_strict_format=partial(is_strict_format, tags=tags),
        is_soft_format=partial(is_soft_format, tags=tags),
    )


ANSWER_FORMAT = answer_format()


# ----------------------------------------------------------------------------------------------------------------
# Settings


def recipe_defaults() -> dict:
    """The constants above, as the defaults of settings (GRPOConfig, ModelConfig and the run's own fields)."""
    own = {"max_prompt_tokens": MAX_PROMPT_TOKENS, "reasoning_tag": REASONING_TAG, "answer_tag": ANSWER_TAG}
    own |= {"warm_start_rows": WARM_START_ROWS, "warm_start_learning_rate": WARM_START_LEARNING_RATE}
    return {**GRPO_DEFAULTS, **LORA_DEFAULTS, "model_name_or_path": MODEL_NAME, **own}


def parse_settings(argv: list[str] | None = None):
    """(RunArguments, GRPOConfig, ModelConfig): these constants < `--smoke`/`--demo` preset < YAML < command line,
    each value checked before anything is loaded or downloaded."""
    from grpo_kit import settings

    return settings.parse(argv, recipe_defaults(), REWARD_FUNCS, REWARD_ROLES)


# ----------------------------------------------------------------------------------------------------------------
# Main: settings -> data -> trainer -> train -> save (accuracy is measured on the trainer's own model)


def main(argv: list[str] | None = None) -> None:
    """The recipe, from settings to a saved model. A run stopped early exits with the code that says how to go on;
    a setting, file or folder to fix raises `RecipeError` with the message that says how."""
    run, training_args, model_args = parse_settings(argv)  # first: checked, a --config's env: set, before any import
    from grpo_kit import data, evaluation, models, presets, runs, stopping

    tags = Tags(run.reasoning_tag, run.answer_tag)  # the format, prompt to rewards: the constants unless set
    fmt = answer_format(tags)
    if not (run.eval_only or run.ask):
        stopping.stop_at_once_until_training(training_args)  # a stop signal before the first step: nothing to save
        if training_args.process_index == 0:
            runs.claim(training_args.output_dir)  # one run per output folder
    presets.prepare(run, training_args, model_args, fmt)  # --smoke/--demo: a tiny model, generated data
    if run.ask:  # a sampled answer of a saved model to a question of your own
        return evaluation.ask(run.ask, model_args, training_args, fmt)

    # 1. data: chat prompts with canonical answers; train, and the rows accuracy is measured on (the test split, or
    # the train rows held out for validation, never trained on); over-long prompts dropped
    load = partial(get_gsm8k_questions, dataset_dir=run.dataset, strict=run.strict_data, tags=tags)
    train, measured = data.splits(run, load)
    if run.eval_only:
        plan = evaluation.measurement_plan(run, training_args, fmt, training=False)
        return evaluation.evaluate_only(measured, plan, training_args, model_args, fmt)
    tokenizer = models.load_tokenizer(model_args, training_args)
    train = drop_long_prompts(train, tokenizer, run.max_prompt_tokens)
    train_and_save(run, training_args, model_args, tokenizer, train, measured, fmt, reward_funcs(tags))


def train_and_save(run, training_args, model_args, tokenizer, train, measured, fmt, rewards) -> None:
    """GRPO on `train` with `rewards`, accuracy measured on `measured` before, during and after; the model saved."""
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_kit import checks, console, evaluation, health, models, online, plots, runs, stopping
    from grpo_kit.patches import prepare_trained_model
    from grpo_kit.warm_start import warm_started

    # 2. trainer: it loads the model, once per process, and places it; the run record and wandb beside it. A model
    # that never writes the format gets a supervised warm start on it first (--warm_start_rows), and GRPO starts there.
    online.configure_wandb(training_args)
    checks.before_the_weights(train, run, model_args, training_args, tokenizer)  # data, positions, LoRA, disk
    model_args.dtype = models.weights_dtype(model_args, training_args)  # fp32 weights for full fine-tuning
    training_args.model_init_kwargs = models.init_kwargs(model_args, training_args)  # one GPU per process
    start = model_args.model_name_or_path
    if run.warm_start_rows:
        start = warm_started(train, run, training_args, model_args, fmt, tokenizer)
    trainer = GRPOTrainer(
        model=start,
        processing_class=tokenizer,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=train,
        peft_config=get_peft_config(model_args),  # None unless --use_peft
        quantization_config=get_quantization_config(model_args),  # None unless --load_in_4bit / --load_in_8bit
    )
    prepare_trained_model(trainer)  # fp32 adapters, a base vLLM's syncs keep, rollouts cast once
    plan = evaluation.measurement_plan(run, training_args, fmt, training=True)
    accuracy = evaluation.callback(trainer, measured, plan, fmt)  # before, during and after training
    trainer.add_callback(accuracy)
    watcher = health.watch(trainer, run.health_checks_off, REWARD_ROLES, accuracy.measured)  # said as they happen
    console.install(trainer, watcher.watcher.correct, run.show_completions)  # one bar, a line per logged step
    runs.start(trainer, {"run": run, "training": training_args, "model": model_args}, train)
    if trainer.accelerator.is_main_process:
        print(console.settings_summary(run, training_args, model_args, len(train)), flush=True)

    # 3. train (from the last checkpoint when resuming), 4. save every logged metric and the model. SIGTERM, SIGUSR1
    # (a scheduler's warning before a time limit or preemption) and Ctrl-C stop it after the step in progress, saved.
    with stopping.on_signals(trainer) as signals:
        if not accuracy.finish_last_step(signals):  # resumed at the last step: the final evaluation, no step more
            trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        saved = not (watcher.stopped or signals.stopped)  # a stopped run's checkpoint holds its weights: no model
        if saved:
            trainer.save_model(training_args.output_dir)
        trainer.save_state()
        if trainer.accelerator.is_main_process:
            plots.plot_curves(training_args.output_dir)  # curves.png: rewards, length, accuracy, readable without wandb
            ask = runs.ask_command(training_args.output_dir, measured[0]["question"]) if measured else None
            print(console.where_written(training_args.output_dir, saved, ask), flush=True)
        stopping.record(signals)  # a resumable stop, told to the launcher that asks (slurm/grpo.sbatch)
        trainer.accelerator.wait_for_everyone()  # the first process to end stops the others: the main one may write
        online.finish(trainer)  # the trackers, and the processes' group
        if code := stopping.exit_code(watcher, signals):  # 3 (not finite), 75 (SIGTERM, SIGUSR1), 130 (Ctrl-C)
            sys.exit(code)


if __name__ == "__main__":
    from grpo_kit.runs import as_a_command

    as_a_command(main)  # a setting to fix, Ctrl-C or a full disk: a message and the command that goes on, no traceback
