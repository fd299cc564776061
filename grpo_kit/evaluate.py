"""GSM8K accuracy of a model: greedy decoding over the test split, scored with the rewards' own parsing.

Two verdicts per question, as others report them:
- strict: the number the last `<answer>` block commits to equals the gold answer (what `correctness_reward_func`
  pays for);
- lenient: the last number anywhere in the completion equals the gold answer (format ignored).

`evaluate` gives a summary and one record per question, `write_report` saves them under `<output_dir>/eval/<name>/`
and prints a table, `compare` sets a baseline against the final model, `AccuracyCallback` logs accuracy on a fixed
subset while training, and `ask` samples one answer to a question of your own.

Decoding is greedy with no repetition penalty (a model's own generation config may ask for sampling or a penalty:
both are overridden), so the HF and vLLM paths score the same completions up to numerics.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import NamedTuple

from transformers import Trainer, TrainerCallback

import grpo_demo

logger = logging.getLogger("grpo_demo")

# Logged during training under `eval_` names: the trainer's wandb integration shows them as `eval/accuracy_strict`...
LOGGED_METRICS = ("accuracy_strict", "accuracy_lenient", "format_rate", "mean_completion_tokens")
# Rows of the printed tables: (summary key, label, shown as a percentage).
TABLE_ROWS = (
    ("accuracy_strict", "accuracy, strict (answer block)", True),
    ("accuracy_lenient", "accuracy, lenient (last number)", True),
    ("format_rate", "strict format", True),
    ("soft_format_rate", "soft format", True),
    ("mean_completion_tokens", "mean completion tokens", False),
    ("truncated", "truncated (hit max_new_tokens)", False),
)


# ----------------------------------------------------------------------------------------------------------------
# Scoring


def last_number(text: str) -> str | None:
    """The last number anywhere in `text`, as written (`1,080`, `-3`, `18.50`), else None."""
    numbers = grpo_demo.NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def score(completion: str, gold: str) -> dict:
    """The extracted answers and verdicts of one completion against a canonical gold answer (`1080`).

    `answer_strict` is the last answer block's content (None without one), `answer_lenient` the last number in the
    completion (None without one); `format_strict` / `format_soft` are the strict / soft format rewards' checks.
    """
    gold_number = grpo_demo.parse_number(gold)
    block = grpo_demo.extract_xml_answer(completion) or None
    number = last_number(completion)
    gradable = gold_number is not None  # no answer equals an unparsable gold (get_gsm8k_questions drops those)
    return {
        "answer_strict": block,
        "answer_lenient": number,
        "correct_strict": gradable and block is not None and grpo_demo.answer_number(block) == gold_number,
        "correct_lenient": gradable and number is not None and grpo_demo.parse_number(number) == gold_number,
        "format_strict": grpo_demo.is_strict_format(completion),
        "format_soft": grpo_demo.is_soft_format(completion),
    }


def summarize(records: list[dict]) -> dict:
    """Rates and counts over scored records (see `evaluate`)."""
    n = len(records)

    def rate(key: str) -> float:
        return sum(r[key] for r in records) / n if n else 0.0

    return {
        "n": n,
        "accuracy_strict": rate("correct_strict"),
        "accuracy_lenient": rate("correct_lenient"),
        "format_rate": rate("format_strict"),
        "soft_format_rate": rate("format_soft"),
        "mean_completion_tokens": rate("completion_tokens"),
        "truncated": sum(r["truncated"] for r in records),
    }


# ----------------------------------------------------------------------------------------------------------------
# Generation


class Generation(NamedTuple):
    text: str
    tokens: int  # generated tokens, the end-of-turn token included
    truncated: bool  # stopped at max_new_tokens without an end-of-turn token


def _prompt_ids(tokenizer, prompts: list[list[dict]]) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]  # the template already holds any BOS


def _left_pad(sequences: list[list[int]], pad_id: int):
    """(input_ids, attention_mask) with every prompt ending in the last column, where generation continues."""
    import torch

    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, width - len(seq) :] = 1
    return input_ids, attention_mask


def _eos_ids(model, tokenizer) -> list[int]:
    """Every token that ends a turn: the tokenizer's and the generation config's (Qwen lists two)."""
    configured = model.generation_config.eos_token_id
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return sorted({*configured, tokenizer.eos_token_id} - {None})


def generate_greedy(
    model,
    tokenizer,
    prompts: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    desc: str = "GSM8K",
) -> list[Generation]:
    """Greedy completions of chat prompts, in input order, generated in left-padded batches.

    Prompts run longest first (similar lengths share a batch, and running out of memory happens at once, not at
    the end). The model is put in eval mode and back in the mode it was in; the tokenizer is not modified.
    """
    import torch
    from tqdm.auto import tqdm

    encoded = _prompt_ids(tokenizer, prompts)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    results: list[Generation | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), tqdm(total=len(encoded), desc=desc, unit="q", leave=False) as progress:
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                input_ids, attention_mask = _left_pad([encoded[i] for i in batch], pad_id)
                output = model.generate(
                    input_ids=input_ids.to(model.device),
                    attention_mask=attention_mask.to(model.device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    repetition_penalty=1.0,
                    eos_token_id=eos_ids,
                    pad_token_id=pad_id,
                )
                for i, ids in zip(batch, output[:, input_ids.shape[1] :].tolist(), strict=True):
                    results[i] = _finished(ids, eos_ids, tokenizer)
                progress.update(len(batch))
    finally:
        model.train(was_training)
    return results


def _finished(ids: list[int], eos_ids: list[int], tokenizer) -> Generation:
    end = next((k for k, token in enumerate(ids) if token in eos_ids), None)
    length = len(ids) if end is None else end + 1  # what follows the first end-of-turn token is padding
    return Generation(tokenizer.decode(ids[:length], skip_special_tokens=True), length, end is None)


def generate_vllm(model_path: str, tokenizer, prompts: list[list[dict]], max_new_tokens: int) -> list[Generation]:
    """Greedy completions from vLLM, on the same token ids as `generate_greedy` (GPU, vllm installed)."""
    if (Path(model_path) / "adapter_config.json").is_file():
        raise ValueError(
            f"{model_path} holds a LoRA adapter, not a model: vLLM needs full weights. "
            "Merge the adapter into its base model and save that, or evaluate without use_vllm"
        )
    try:
        from vllm import LLM, SamplingParams
    except ImportError as err:
        raise ImportError(
            "use_vllm needs vLLM, which is not installed: pip install -r requirements-gpu.txt (or evaluate without it)"
        ) from err

    llm = LLM(model=str(model_path), tokenizer=str(model_path), seed=0)
    params = SamplingParams(temperature=0, max_tokens=max_new_tokens)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in _prompt_ids(tokenizer, prompts)], params)
    return [
        Generation(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length")
        for o in outputs
    ]


def load_model(model_path: str):
    """A saved model for inference: bf16 on the current GPU, fp32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if cuda else torch.float32)
    return model.to(torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")


# ----------------------------------------------------------------------------------------------------------------
# Evaluation and reports


def evaluate(
    model_or_path,
    tokenizer,
    rows,
    *,
    max_new_tokens: int,
    batch_size: int,
    limit: int | None = None,
    use_vllm: bool = False,
    desc: str = "GSM8K",
) -> tuple[dict, list[dict]]:
    """Greedy accuracy on `rows` (`get_gsm8k_questions` rows: `prompt`, `answer`, `question`), the first `limit`.

    Returns (summary, records): the summary holds the rates of `summarize` plus `model`, `backend`,
    `max_new_tokens`, `seconds` and `questions_per_second`; a record holds the question, gold answer, completion,
    `score`'s fields, `completion_tokens` and `truncated`. vLLM needs a saved model's path.
    """
    rows = list(islice(rows, limit))
    prompts = [row["prompt"] for row in rows]
    is_path = isinstance(model_or_path, str | Path)
    started = time.perf_counter()
    if use_vllm:
        if not is_path:
            raise ValueError("use_vllm evaluates a saved model: pass its path, not a loaded model")
        generations = generate_vllm(model_or_path, tokenizer, prompts, max_new_tokens)
    else:
        model = load_model(model_or_path) if is_path else model_or_path
        generations = generate_greedy(model, tokenizer, prompts, max_new_tokens, batch_size, desc)
    seconds = time.perf_counter() - started
    records = [
        {
            "question": row["question"],
            "gold": row["answer"],
            "completion": g.text,
            **score(g.text, row["answer"]),
            "completion_tokens": g.tokens,
            "truncated": g.truncated,
        }
        for row, g in zip(rows, generations, strict=True)
    ]
    summary = {
        **summarize(records),
        "model": str(model_or_path) if is_path else model_or_path.name_or_path,
        "backend": "vllm" if use_vllm else "hf",
        "max_new_tokens": max_new_tokens,
        "seconds": round(seconds, 2),
        "questions_per_second": round(len(records) / seconds, 2) if seconds else None,
    }
    return summary, records


def _cell(value, percent: bool, change: bool = False) -> str:
    """A table cell: a rate as a percentage (a change of one in points), a count as is, a mean to one decimal."""
    sign = "+" if change else ""
    if percent:
        return f"{100 * value:{sign}.1f} {'pp' if change else '%'}"
    return f"{value:{sign}.1f}" if isinstance(value, float) else f"{value:{sign}d}"


def write_report(out_dir: str | Path, name: str, summary: dict, records: list[dict]) -> Path:
    """`<out_dir>/eval/<name>/summary.json` and `completions.jsonl` (one record a line); prints a table."""
    folder = Path(out_dir) / "eval" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with (folder / "completions.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    lines = [
        f"GSM8K {name}: {summary['model']}, {summary['n']} questions, {summary['seconds']} s",
        "| metric | value |",
        "| --- | --- |",
        *(f"| {label} | {_cell(summary[key], percent)} |" for key, label, percent in TABLE_ROWS),
    ]
    print("\n".join(lines))
    logger.info("Evaluation written to %s", folder)
    return folder


def compare(out_dir: str | Path, before: str = "baseline", after: str = "final") -> dict | None:
    """`<out_dir>/eval/comparison.json`: the `before` and `after` summaries side by side with their changes, and
    a printed table; None (nothing written) unless both evaluations exist."""
    eval_dir = Path(out_dir) / "eval"
    paths = [eval_dir / name / "summary.json" for name in (before, after)]
    if not all(p.is_file() for p in paths):
        return None
    old, new = (json.loads(p.read_text(encoding="utf-8")) for p in paths)
    if old["n"] != new["n"]:
        logger.warning("Comparing evaluations of different sizes: %d vs %d questions", old["n"], new["n"])
    keys = [key for key, _, _ in TABLE_ROWS]
    comparison = {
        before: old,
        after: new,
        "change": {key: new[key] - old[key] for key in keys},
    }
    (eval_dir / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"GSM8K, {before} vs {after} ({old['n']} / {new['n']} questions)",
        f"| metric | {before} | {after} | change |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {_cell(old[key], pct)} | {_cell(new[key], pct)} | {_cell(new[key] - old[key], pct, True)} |"
            for key, label, pct in TABLE_ROWS
        ),
    ]
    print("\n".join(lines))
    return comparison


# ----------------------------------------------------------------------------------------------------------------
# During training


@dataclass
class Evaluator:
    """The evaluations of one run on one test split, each written to `<output_dir>/eval/<name>/`."""

    rows: object  # get_gsm8k_questions rows
    tokenizer: object
    output_dir: str
    max_new_tokens: int
    batch_size: int
    limit: int | None = None

    def run(self, name: str, model, use_vllm: bool = False) -> dict:
        summary, records = evaluate(
            model,
            self.tokenizer,
            self.rows,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            limit=self.limit,
            use_vllm=use_vllm,
            desc=f"GSM8K {name}",
        )
        write_report(self.output_dir, name, summary, records)
        return summary

    def done(self, name: str) -> bool:
        return (Path(self.output_dir) / "eval" / name / "summary.json").is_file()

    def compare(self) -> dict | None:
        return compare(self.output_dir)

    def callback(self, trainer, every_steps: int, subset: int) -> AccuracyCallback:
        """Accuracy on the first `subset` rows every `every_steps` steps of `trainer`."""
        rows = list(islice(self.rows, subset))
        return AccuracyCallback(
            trainer, rows, every_steps=every_steps, max_new_tokens=self.max_new_tokens, batch_size=self.batch_size
        )


class AccuracyCallback(TrainerCallback):
    """Greedy accuracy on a fixed set of rows every `every_steps` optimizer steps (never when 0), logged as
    `eval_accuracy_strict`, `eval_accuracy_lenient`, `eval_format_rate` and `eval_mean_completion_tokens` in
    `trainer_state.json`'s log history, and as `eval/...` in wandb.

        trainer.add_callback(AccuracyCallback(trainer, test_rows.select(range(100)), every_steps=50, ...))

    Only the main process generates, with no collective call, so the other processes simply wait at the next
    gradient sync: keep the subset small enough to finish well within `ddp_timeout`. The model must be whole on
    the main process, so ZeRO-3 and FSDP are refused.
    """

    def __init__(self, trainer, rows, *, every_steps: int, max_new_tokens: int, batch_size: int):
        self.trainer = trainer
        self.rows = list(rows)
        self.every_steps = every_steps
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    def on_train_begin(self, args, state, control, **kwargs):
        plugin = self.trainer.accelerator.state.deepspeed_plugin
        if self.every_steps > 0 and (self.trainer.is_fsdp_enabled or (plugin is not None and plugin.zero_stage == 3)):
            raise ValueError("In-training accuracy needs the whole model on one process: turn it off under ZeRO-3/FSDP")

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_steps <= 0 or state.global_step % self.every_steps or not state.is_world_process_zero:
            return
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        summary, _ = evaluate(
            model,
            self.trainer.processing_class,
            self.rows,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            desc=f"accuracy at step {state.global_step}",
        )
        logger.info(
            "Step %d: GSM8K accuracy %.1f %% strict, %.1f %% lenient on %d questions",
            state.global_step,
            100 * summary["accuracy_strict"],
            100 * summary["accuracy_lenient"],
            summary["n"],
        )
        # The base Trainer.log, not GRPOTrainer.log: that one would take the rewards pending for this step's log
        # entry into this one and print the completion sample again. Logging clears `should_log`, which the
        # trainer set for that entry: keep it.
        should_log = control.should_log
        Trainer.log(self.trainer, {f"eval_{key}": summary[key] for key in LOGGED_METRICS})
        control.should_log = should_log


# ----------------------------------------------------------------------------------------------------------------
# Ask mode

ASK_TEMPERATURE, ASK_TOP_P = 0.8, 0.95  # a sample, as a user would see it, not the greedy evaluation answer


def ask(
    model_path: str,
    question: str,
    max_new_tokens: int = grpo_demo.GRPO_DEFAULTS["max_completion_length"],
    seed: int = 0,
) -> str:
    """A sampled answer of the model at `model_path` to `question`, in the recipe's system+user prompt."""
    import torch
    from transformers import AutoTokenizer, set_seed

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_model(model_path).eval()
    input_ids = torch.tensor(_prompt_ids(tokenizer, [grpo_demo.chat_prompt(question)]), device=model.device)
    set_seed(seed)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=ASK_TEMPERATURE,
            top_p=ASK_TOP_P,
            eos_token_id=_eos_ids(model, tokenizer),
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
    return tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
