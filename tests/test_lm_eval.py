"""lm-evaluation-harness's tasks through the recipe are lm-eval's: on the same model and data, the `lm_eval` command
line its summary records gives the same prompts, responses, filtered answers, verdicts and accuracy question by
question (lm-eval's --log_samples files compared), and the task file it ran is lm-eval's own but for the data."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import offline_env

import grpo_demo
from grpo_kit import RecipeError, harness

LIMIT, MAX_GEN_TOKS = 6, 24


@pytest.fixture(scope="module")
def lively_dir(tiny_dir, tmp_path_factory):
    """The tiny model with large random weights, saved: what it writes (numbers among it) depends on the prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("lively")
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.config.max_position_embeddings = 2048  # as the smoke model's: gsm8k_cot-chat's 8 shots fit, uncut
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_dir / name, folder / name)
    return folder


def recipe(model: Path, data: Path, protocol: str, output_dir: Path) -> dict:
    """`python grpo_demo.py --eval_only` of `model` in `protocol` (in this process); its summary."""
    grpo_demo.main(
        ["--eval_only", "--model_name_or_path", str(model), "--dataset", str(data), "--output_dir", str(output_dir)]
        + ["--eval_protocols", protocol, "--eval_limit", str(LIMIT), "--eval_max_gen_toks", str(MAX_GEN_TOKS)]
        + ["--eval_batch_size", "3"]
    )
    return json.loads((output_dir / "eval" / f"baseline-{protocol}" / "summary.json").read_text())


def with_golds_it_meets(data: Path, summary: dict, output_dir: Path, folder: Path) -> Path:
    """`data` with every other measured test question's gold set to the number lm-eval's flexible filter read from
    the model's answer: the prompts (train shots, the question) are unchanged, and some verdicts are now right."""
    records = [
        json.loads(line)
        for line in (output_dir / "eval" / f"baseline-{summary['protocol']}" / "completions.jsonl").open()
    ]
    test = [json.loads(line) for line in (data / "test.jsonl").open()]
    for i, record in enumerate(records):
        if i % 2 == 0 and record["answer_lenient"]:
            test[i]["answer"] = test[i]["answer"].split("####")[0] + "#### " + record["answer_lenient"]
    folder.mkdir()
    shutil.copy(data / "train.jsonl", folder / "train.jsonl")
    (folder / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in test))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["gsm8k", "gsm8k_cot-chat"])
def test_the_recipe_and_the_lm_eval_command_line_answer_and_score_every_question_alike(
    protocol, lively_dir, gsm8k_dir, tmp_path
):
    first = recipe(lively_dir, gsm8k_dir, protocol, tmp_path / "first")
    data = with_golds_it_meets(gsm8k_dir, first, tmp_path / "first", tmp_path / "data")
    summary = recipe(lively_dir, data, protocol, tmp_path / "out")
    folder = tmp_path / "out" / "eval" / f"baseline-{protocol}"

    # The command line the summary records, run as a user runs it: offline, in its own process.
    words = shlex.split(summary["lm_eval_command"])
    assert words[0] == "lm_eval" and words[-2:] == ["--output_path", "lm_eval_out"]
    cli = tmp_path / "cli"
    ran = subprocess.run(
        [sys.executable, "-m", "lm_eval", *words[1:-1], str(cli)],
        cwd=tmp_path,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    (results,) = cli.rglob("results_*.json")
    (samples_file,) = cli.rglob(f"samples_{harness.Harness(protocol).task}_*.jsonl")

    def keyed(lines):
        samples = [json.loads(line) for line in lines]
        return {(s["doc_id"], s["filter"]): s for s in samples}

    theirs = keyed(samples_file.read_text().splitlines())
    ours = keyed((folder / harness.SAMPLES_FILE).read_text().splitlines())
    assert sorted(ours) == sorted(theirs) and len(ours) == 2 * LIMIT  # every question, under both filters
    for key, sample in theirs.items():
        for field in ("doc", "arguments", "resps", "filtered_resps", "exact_match", "target"):
            assert ours[key][field] == sample[field], (key, field)  # the prompt, the response, the answer, the verdict
    verdicts = [s["exact_match"] for s in theirs.values() if s["filter"] == "flexible-extract"]
    assert 0 < sum(verdicts) < LIMIT  # some questions right and some wrong: the verdicts are compared, not only zeros

    official = json.loads(results.read_text())["results"][harness.Harness(protocol).task]
    assert summary["accuracy_strict"] == summary["lm_eval_results"]["strict"] == official["exact_match,strict-match"]
    assert (
        summary["accuracy_lenient"]
        == summary["lm_eval_results"]["lenient"]
        == official["exact_match,flexible-extract"]
        == sum(verdicts) / LIMIT
    )
    records = [json.loads(line) for line in (folder / "completions.jsonl").open()]
    assert [r["completion"] for r in records] == [theirs[(i, "strict-match")]["resps"][0][0] for i in range(LIMIT)]


@pytest.mark.parametrize("task", list(harness.TASK_FILES))
def test_the_task_file_run_is_lm_evals_own_but_for_the_local_data(task, gsm8k_dir):
    import lm_eval

    packaged = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / harness.TASK_FILES[task]
    own = yaml.safe_load(packaged.read_text())
    ran = harness.task_config(task, gsm8k_dir)
    data = {"dataset_path", "dataset_name", "dataset_kwargs"}
    assert {k: v for k, v in ran.items() if k not in data} == {k: v for k, v in own.items() if k not in data}
    assert (ran["dataset_path"], ran["dataset_name"]) == ("json", None)
    files = {split: [str((gsm8k_dir / f"{split}.jsonl").resolve())] for split in ("train", "test")}
    assert ran["dataset_kwargs"] == {"data_files": files}
    assert (own["num_fewshot"], own["metadata"]["version"]) == ({"gsm8k": 5, "gsm8k_cot": 8}[task], 3.0)


def test_the_hubs_parquet_layout_is_read_as_parquet(gsm8k_dir, tmp_path):
    import pyarrow
    import pyarrow.parquet

    for split in ("train", "test"):
        rows = [json.loads(line) for line in (gsm8k_dir / f"{split}.jsonl").open()]
        (tmp_path / "main").mkdir(exist_ok=True)
        pyarrow.parquet.write_table(
            pyarrow.Table.from_pylist(rows), tmp_path / "main" / f"{split}-00000-of-00001.parquet"
        )
    ran = harness.task_config("gsm8k", tmp_path)
    assert ran["dataset_path"] == "parquet"
    assert ran["dataset_kwargs"]["data_files"]["test"] == [str(tmp_path / "main" / "test-00000-of-00001.parquet")]


def test_lm_eval_tasks_under_several_processes_are_refused_with_the_command_that_measures_them(monkeypatch):
    from conftest import refused

    monkeypatch.setenv("WORLD_SIZE", "2")
    message = refused(["--smoke", "--eval_protocols", "gsm8k", "gsm8k_cot-chat"])
    assert "lm-eval runs its tasks on one whole model in one process, and this launch has 2 processes" in message
    assert (
        "measure after training, with python grpo_demo.py --eval_only --model_name_or_path outputs/smoke-GRPO "
        "--eval_protocols gsm8k gsm8k_cot-chat --dataset outputs/smoke-assets/gsm8k-generated"
    ) in message


# Decorated answers, as chat models write them: lm-eval's verdicts (strict-match, flexible-extract), which the
# gsm8k protocols report as they are. Each: (completion, gold, strict, flexible), a comment saying why.
DECORATED = [
    ("She pays 18 dollars.\n#### 18", "18", True, True),  # the clean form: both
    ("####18", "18", False, True),  # strict-match needs the space after ####
    ("#### $18", "18", False, True),  # ... and no currency sign there; flexible reads $18, the $ is ignored
    ("#### **18**", "18", False, True),  # bold: not strict
    ("#### 18.00", "18", False, False),  # 18.00 is not 18 to exact_match
    ("It costs $1,080.00.", "1080", False, False),  # only the final period goes: 1080.00 is not 1080
    ("#### 8 (5 + 3)", "8", True, False),  # strict takes the first number after ####; flexible the last, 3
    ("#### 1,08", "108", True, True),  # commas are dropped: 108
    ("#### \u22125", "-5", False, False),  # U+2212: lm-eval's regexes are ASCII (the recipe's protocols read -5)
    ("#### -5", "-5", True, True),  # the ASCII minus
]


def test_decorated_answers_get_lm_evals_own_verdicts(tmp_path):
    """A stand-in model answers each question with one decorated completion; the recipe's records carry the verdicts
    lm-eval's filters and metric gave, and its accuracy is lm-eval's."""
    from lm_eval.api.model import LM

    rows = [
        {"question": f"Question number {i}?", "answer": f"Work.\n#### {gold}"}
        for i, (_, gold, *_) in enumerate(DECORATED)
    ]
    answers = {row["question"]: completion for row, (completion, *_) in zip(rows, DECORATED, strict=True)}
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    class Decorated(LM):
        def generate_until(self, requests):
            return [answers[request.doc["question"]] for request in requests]

        def loglikelihood(self, requests):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

    settings = {"batch_size": 1, "limit": None, "max_gen_toks": None, "device": "cpu"}
    summary, records = harness.evaluate(
        Decorated(), harness.Harness("gsm8k"), tmp_path, tmp_path / "eval", settings, model_name="m",
        saved_as={"pretrained": "m"},
    )  # fmt: skip
    verdicts = [(r["completion"], r["gold"], r["correct_strict"], r["correct_lenient"]) for r in records]
    assert verdicts == DECORATED
    assert summary["accuracy_strict"] == summary["lm_eval_results"]["strict"] == 4 / len(DECORATED)
    assert summary["accuracy_lenient"] == summary["lm_eval_results"]["lenient"] == 6 / len(DECORATED)


def test_a_task_whose_prompts_lm_eval_cuts_to_fit_the_model_is_refused_not_scored(tiny, gsm8k_dir, tmp_path):
    """lm-eval left-truncates a 5-shot prompt past the model's length (max_length - max_gen_toks) and scores what the
    model says to the cut text: a number that does not measure it. The recipe says so and writes no evaluation."""
    from lm_eval.models.huggingface import HFLM

    tokenizer, model = tiny
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=2, max_length=96)  # 5 shots are several hundred
    settings = {"batch_size": 2, "limit": 2, "max_gen_toks": 8, "device": "cpu"}
    folder = tmp_path / "eval" / "final-gsm8k"
    with pytest.raises(RecipeError, match=r"Cannot measure in gsm8k: lm-eval cut its prompts .*truncating to last 88"):
        harness.evaluate(lm, harness.Harness("gsm8k"), gsm8k_dir, folder, settings, model_name="m", saved_as={})
    assert not folder.exists()


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, OSError])
def test_an_evaluation_stopped_half_way_leaves_no_folder_to_take_for_a_result(
    stop, tiny, gsm8k_dir, tmp_path, monkeypatch
):
    """A stop signal, Ctrl-C or a failure while lm-eval generates: neither the evaluation's folder (which a later run
    could take for a result) nor the folder it was written in is left."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr(lm_eval, "simple_evaluate", stopped)
    tokenizer, model = tiny
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=2)
    settings = {"batch_size": 2, "limit": 2, "max_gen_toks": 8, "device": "cpu"}
    folder = tmp_path / "eval" / "baseline-gsm8k-chat"
    with pytest.raises(stop):
        harness.evaluate(lm, harness.Harness("gsm8k-chat"), gsm8k_dir, folder, settings, model_name="m", saved_as={})
    assert list((tmp_path / "eval").iterdir()) == []


MODEL_ARGS = {  # (the folder holds an adapter, revision, trust_remote_code): lm-eval's --model_args
    "a model folder": (False, None, False, {"pretrained": "FOLDER"}),
    "a LoRA adapter, on its base": (True, None, False, {"pretrained": "base/model", "peft": "FOLDER"}),
    "the default revision, not said": (False, "main", False, {"pretrained": "FOLDER"}),
    "a revision": (False, "v1.1", False, {"pretrained": "FOLDER", "revision": "v1.1"}),
    "remote code": (False, None, True, {"pretrained": "FOLDER", "trust_remote_code": True}),
}


@pytest.mark.parametrize("case", MODEL_ARGS, ids=list(MODEL_ARGS))
def test_lm_eval_loads_the_model_as_the_recipe_does(case, tmp_path):
    adapter, revision, remote, expected = MODEL_ARGS[case]
    if adapter:
        (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "base/model"}))
    said = harness.model_args(str(tmp_path), revision, remote)
    assert said == {k: str(tmp_path) if v == "FOLDER" else v for k, v in expected.items()}
