"""GSM8K as published numbers measure it: lm-evaluation-harness's own `gsm8k` (5-shot, `Question: ...\\nAnswer:`) and
`gsm8k_cot` (the 8 exemplars of Wei et al.) tasks, run by lm-eval itself, with or without the model's chat template.
Nothing of lm-eval is copied here: its packaged task files are read and only the data they load is changed, to the
local copy `--dataset` names (JSON lines or the Hub's parquet layout; the Hub's openai/gsm8k without it).

Each evaluation writes the task file it ran (`lm_eval_task.yaml`) and lm-eval's own per-question samples
(`lm_eval_samples.jsonl`, as `lm_eval --log_samples` writes them), and its summary records lm-eval's version, the
task's version, its shots, every setting and the `lm_eval` command line that gives the same numbers."""

import json
import logging
import shlex
import shutil
from importlib.metadata import version
from pathlib import Path

from grpo_kit import RecipeError, layout, scoring

logger = logging.getLogger("grpo_demo")

TASK_FILES = {"gsm8k": "gsm8k.yaml", "gsm8k_cot": "gsm8k-cot.yaml"}  # in lm_eval/tasks/gsm8k/
CHAT = "-chat"  # a protocol name's ending: the chat template, the shots as earlier turns
PROTOCOLS = tuple(f"{task}{chat}" for task in TASK_FILES for chat in ("", CHAT))
FILTERS = {"strict": "strict-match", "lenient": "flexible-extract"}  # the tasks' two readings of an answer
TASK_FILE, RESULTS_FILE, SAMPLES_FILE = "lm_eval_task.yaml", "lm_eval_results.json", "lm_eval_samples.jsonl"
SEEDS = ("random", "numpy", "torch", "fewshot")  # lm-eval's four seeds, as its results name them


class Harness:
    """A protocol run by lm-eval: its task, and whether the chat template applies (`fewshot_as_multiturn` with it)."""

    def __init__(self, name: str):
        self.name, self.task, self.chat = name, name.removesuffix(CHAT), name.endswith(CHAT)
        self.judges_format = False

    @property
    def options(self) -> dict:
        """simple_evaluate's settings for this protocol (lm-eval's defaults for everything else)."""
        return {"apply_chat_template": self.chat, "fewshot_as_multiturn": self.chat}


def is_harness(name: str) -> bool:
    return name in PROTOCOLS


def task_config(task: str, dataset_dir: str | None) -> dict:
    """lm-eval's packaged config of `task`, its data read from `dataset_dir`'s files where given."""
    import lm_eval
    import yaml

    from grpo_kit.data import split_files

    packaged = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / TASK_FILES[task]
    config = yaml.safe_load(packaged.read_text(encoding="utf-8"))
    if dataset_dir:
        files = {split: [str(p.resolve()) for p in split_files(dataset_dir, split)] for split in ("train", "test")}
        parquet = files["test"][0].endswith(".parquet")
        config.update(dataset_path="parquet" if parquet else "json", dataset_name=None)
        config["dataset_kwargs"] = {"data_files": files}
    return config


def model_args(path: str, revision: str | None = None, trust_remote_code: bool = False) -> dict:
    """lm-eval's model arguments for a saved model (a LoRA adapter: on its base, as `peft=`), as the recipe loads it:
    its revision and remote code where set; the dtype lm-eval's (`auto`, the folder's own)."""
    adapter = Path(path) / "adapter_config.json"
    if adapter.is_file():
        args = {"pretrained": json.loads(adapter.read_text(encoding="utf-8"))["base_model_name_or_path"], "peft": path}
    else:
        args = {"pretrained": path}
    if revision not in (None, "main"):
        args["revision"] = revision
    if trust_remote_code:
        args["trust_remote_code"] = True
    return args


def command(model: dict, protocol: Harness, task_file: Path, settings: dict) -> str:
    """The `lm_eval` command line that measures `model` (`model_args`) as this evaluation did (`settings`:
    `run_settings`')."""
    shown = ",".join(f"{k}={v}" for k, v in model.items())
    words = ["lm_eval", "--model", settings.get("backend", "hf"), "--model_args", shown, "--tasks", str(task_file)]
    words += ["--batch_size", str(settings["batch_size"]), "--device", settings["device"]]
    words += ["--apply_chat_template", "--fewshot_as_multiturn"] if protocol.chat else []
    words += ["--limit", str(settings["limit"])] if settings["limit"] is not None else []
    words += [f"--gen_kwargs=max_gen_toks={n}"] if (n := settings["max_gen_toks"]) is not None else []
    return shlex.join([*words, "--log_samples", "--output_path", "lm_eval_out"])


def run_settings(batch_size: int, limit: int | None, max_gen_toks: int | None) -> dict:
    """What of the run's settings an lm-eval evaluation takes: the batch, the questions, the completion's length
    (None: lm-eval's, 256 tokens), the device (the GPU where there is one, as lm-eval's default)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"batch_size": batch_size, "limit": limit, "max_gen_toks": max_gen_toks, "device": device}


def protocol_details(protocol: Harness, dataset_dir, settings: dict) -> dict:
    """What an evaluation's summary records of its protocol (and what two evaluations must share to compare):
    lm-eval's version, the task, its version and shots as its file says, its filters, every setting, lm-eval's
    seeds (its defaults), the data."""
    import inspect

    from lm_eval import simple_evaluate

    config, defaults = task_config(protocol.task, None), inspect.signature(simple_evaluate).parameters
    seeds = {k: defaults[f"{k}_random_seed" if k != "random" else "random_seed"].default for k in SEEDS}
    return {
        "lm_eval": version("lm-eval"),
        "task": protocol.task,
        "task_version": config["metadata"]["version"],
        "num_fewshot": config["num_fewshot"],
        "filters": FILTERS,
        **protocol.options,
        "batch_size": settings["batch_size"],
        "limit": settings["limit"],
        "max_gen_toks": settings["max_gen_toks"],
        "seeds": seeds,
        "dataset": str(Path(dataset_dir).resolve()) if dataset_dir else config["dataset_path"],
    }


def evaluate(lm, protocol: Harness, dataset_dir, folder: Path, settings: dict, *, model_name, saved_as):
    """`protocol` by lm-eval on `lm` (an `HFLM` of the trainer's model, or ("hf" or "vllm", model_args)) with
    `settings` (`run_settings`), its task file and samples written to `folder`. Returns (summary, records) as
    `evaluation.evaluate` does: the recipe's fields with the answers and verdicts of lm-eval's filters and metric,
    lm-eval's own accuracy beside them, and the command line that measures the model saved as `saved_as`
    (`model_args`)."""
    import time

    from lm_eval.loggers import EvaluationTracker

    from grpo_kit.scoring import summarize

    # Written beside `folder` and moved into it when lm-eval is done: an evaluation stopped half way (a signal, a
    # kill, a full disk) leaves no folder that a later one could take for a result; a stopped one's is cleared.
    part = layout.part(folder)
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    config = task_config(protocol.task, dataset_dir)
    task_file = part / TASK_FILE
    task_file.write_text(_yaml(config), encoding="utf-8")
    model, model_args = lm if isinstance(lm, tuple) else (lm, None)
    tracker = EvaluationTracker(output_path=str(part / "results.json"))  # a .json path: its files beside it
    started = time.perf_counter()
    results = _simple_evaluate(model, model_args, protocol, task_file, tracker, settings, part)
    seconds = time.perf_counter() - started
    samples = results.pop("samples")
    task_file = _keep_files(tracker, results, samples, protocol.task, part, folder)
    samples = samples[protocol.task]
    max_gen_toks = results["configs"][protocol.task]["generation_kwargs"].get("max_gen_toks", 256)
    records = to_records(samples)
    details = protocol_details(protocol, dataset_dir, settings)
    ran = {"task_version": results["versions"][protocol.task], "num_fewshot": results["n-shot"][protocol.task]}
    ran["seeds"] = {k: results["config"][f"{k}_seed"] for k in SEEDS}
    if any(details[k] != v for k, v in ran.items()):  # what is recorded must be what ran
        raise RuntimeError(f"lm-eval ran {ran}, and its task file and defaults say {details}")
    own = results["results"][protocol.task]
    summary = {
        **summarize(records),
        "protocol": protocol.name,
        "protocol_details": details,
        "lm_eval_results": {f"{k}": own[f"exact_match,{f}"] for k, f in FILTERS.items()},
        "model": model_name,
        "questions_sha256": scoring.fingerprint((r["question"], r["gold"]) for r in records),
        "backend": results["config"]["model"] if isinstance(model, str) else "hf",
        "max_new_tokens": max_gen_toks,
        "processes": 1,
        "seconds": round(seconds, 2),
        "questions_per_second": round(len(records) / seconds, 2) if seconds else None,
        "lm_eval_command": command(saved_as, protocol, task_file, settings),
    }
    if samples:
        summary["first_prompt"] = _prompt(samples[0])
    return summary, records


def _simple_evaluate(model, model_args, protocol: Harness, task_file: Path, tracker, settings: dict, part: Path):
    """lm-eval's `simple_evaluate` of the one task in `task_file`; where it fails or is stopped, `part` is cleared
    (no evaluation folder without its evaluation), and one that lm-eval would cut to the model's length is refused."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    stop = _StopAtTruncation()  # lm-eval cuts a context past the model's length and says so only in a warning
    logging.getLogger("lm_eval.models").addHandler(stop)
    try:
        return simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=[str(task_file)],
            batch_size=settings["batch_size"],
            limit=settings["limit"],
            device=settings["device"],
            gen_kwargs={"max_gen_toks": settings["max_gen_toks"]} if settings["max_gen_toks"] is not None else None,
            log_samples=True,
            evaluation_tracker=tracker,
            task_manager=TaskManager(include_defaults=False),  # the task is its file: no index of lm-eval's 10k others
            **protocol.options,
        )
    except _Truncated as cut:  # at its first batch: nothing of it is scored
        shutil.rmtree(part, ignore_errors=True)  # no evaluation folder without its evaluation
        raise RecipeError(
            f"Cannot measure in {protocol.name}: lm-eval cut its prompts to fit the model's length ({cut}), so its "
            "answers there are not the model's to those questions. Choose another --eval_protocols, or a model with "
            "more positions"
        ) from None
    except BaseException:  # stopped, failed: nothing of it is kept
        shutil.rmtree(part, ignore_errors=True)
        raise
    finally:
        logging.getLogger("lm_eval.models").removeHandler(stop)


def _keep_files(tracker, results: dict, samples: dict, task: str, part: Path, folder: Path) -> Path:
    """lm-eval's own files, written as `lm_eval --log_samples` writes them (its results, then the task's samples),
    moved with the task file from `part` into `folder`; returns the task file's place there."""
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name=task, samples=samples[task])
    files = {TASK_FILE: part / TASK_FILE}
    for pattern, file in (("results_*.json", RESULTS_FILE), (f"samples_{task}_*.jsonl", SAMPLES_FILE)):
        if not (written := sorted(part.glob(pattern))):
            raise RuntimeError(f"lm-eval wrote no {pattern} in {part} (its log says why)")
        files[file] = written[-1]
    folder.mkdir(parents=True, exist_ok=True)
    for file, path in files.items():
        path.replace(folder / file)
    shutil.rmtree(part, ignore_errors=True)
    return folder / TASK_FILE


class _Truncated(Exception):
    """lm-eval cut a prompt to fit the model (its warning's text)."""


class _StopAtTruncation(logging.Handler):
    """Stops lm-eval at its warning that a prompt was cut to fit the model (hf: left truncation; vllm: the context
    truncated, or max_gen_toks reduced, to fit the model's max length)."""

    def __init__(self):
        super().__init__(logging.WARNING)

    def emit(self, record):
        message = record.getMessage()
        if "Left truncation applied" in message or "exceeds model's max length" in message:
            raise _Truncated(message)


def to_records(samples: list[dict]) -> list[dict]:
    """lm-eval's samples (one per question and filter) as the recipe's records: the completion, each filter's answer
    (None for lm-eval's `[invalid]`) and its exact_match verdict. lm-eval keeps no token count: the completion's
    length and truncation are unknown (None); `max_gen_toks` bounds them."""
    by_doc: dict[int, dict] = {}
    for sample in samples:
        record = by_doc.setdefault(sample["doc_id"], {"doc": sample["doc"], "completion": sample["resps"][0][0]})
        record[sample["filter"]] = (sample["filtered_resps"][0], float(sample["exact_match"]) == 1.0)
    records = []
    for doc_id in sorted(by_doc):
        record, doc = by_doc[doc_id], by_doc[doc_id]["doc"]
        out = {"question": doc["question"], "gold": doc["answer"].split("####")[-1].strip()}
        out["completion"] = record["completion"]
        for verdict, name in FILTERS.items():
            answer, correct = record[name]
            out[f"answer_{verdict}"] = None if answer == "[invalid]" else answer
            out[f"correct_{verdict}"] = bool(correct)
        out |= {"format_strict": None, "format_soft": None, "completion_tokens": None, "truncated": None}
        records.append(out)
    return records


def _prompt(sample: dict) -> str:
    """The text the model was given for a sample (a chat template's rendering where one applied)."""
    argument = sample["arguments"]
    first = argument.get("gen_args_0", argument) if isinstance(argument, dict) else argument[0]
    return first.get("arg_0", "") if isinstance(first, dict) else str(first[0])


def _yaml(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
