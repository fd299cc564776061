"""GSM8K evaluation: exact verdicts and rates, collective generation, reports, and the trainer's own model measured
before, during and after training (no second model loaded); `--eval_only` and `--ask`."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import refused, resolved

import grpo_demo
from grpo_kit import RecipeError, evaluation, generation, layout, reports, scoring

FMT = grpo_demo.ANSWER_FORMAT
ANSWER = "<reasoning>\n{r}\n</reasoning>\n<answer>\n{a}\n</answer>"
RIGHT = ANSWER.format(r="3 + 4 = 7", a="7")


@pytest.mark.parametrize(
    ("completion", "gold", "answer_strict", "answer_lenient", "correct_strict", "correct_lenient"),
    [
        (RIGHT, "7", "7", "7", True, True),  # strictly formatted and right
        ("3 + 4 makes 7", "7", None, "7", False, True),  # right number outside any answer block: lenient only
        (RIGHT + "\nStep 2 done.", "7", "7", "2", True, False),  # a later number after the block: strict only
        (ANSWER.format(r="...", a="$1,080.00"), "1080", "$1,080.00", "1,080.00", True, True),  # numbers, not strings
        (ANSWER.format(r="...", a="3 * 6 = 18"), "18", "3 * 6 = 18", "18", False, True),  # two numbers commit to none
        (ANSWER.format(r="...", a="nine"), "9", "nine", None, False, False),  # no digits anywhere
        ("", "9", None, None, False, False),  # empty completion
        (ANSWER.format(r="1 - 4 = -3", a="-3"), "-3", "-3", "-3", True, True),  # negative gold answer
    ],
)
def test_score_strict_and_lenient(completion, gold, answer_strict, answer_lenient, correct_strict, correct_lenient):
    scored = scoring.score(completion, gold, FMT)
    assert (scored["answer_strict"], scored["answer_lenient"]) == (answer_strict, answer_lenient)
    assert (scored["correct_strict"], scored["correct_lenient"]) == (correct_strict, correct_lenient)


@pytest.mark.parametrize(
    ("completion", "strict", "soft"),
    [
        (ANSWER.format(r="a\nb", a="7"), True, True),  # the format the prompt asks for
        (ANSWER.format(r="a", a="7") + "\nmore", False, True),  # text after the answer: soft only
        ("The answer is 7", False, False),
    ],
)
def test_score_format_flags(completion, strict, soft):
    scored = scoring.score(completion, "7", FMT)
    assert (scored["format_strict"], scored["format_soft"]) == (strict, soft)


def test_summary_rates_of_hand_made_completions():
    """Four completions with known verdicts: the rates are counted from them, nothing else."""
    cases = [  # (completion, gold, tokens, truncated)
        (RIGHT, "7", 10, False),  # strict and lenient right, strict format
        (ANSWER.format(r="...", a="8") + " so 7", "7", 12, False),  # strict wrong, lenient right, soft format only
        ("It is 7", "7", 4, False),  # lenient right only, no format
        ("<reasoning>\nthinking", "7", 30, True),  # cut off: nothing
    ]
    records = [
        {**scoring.score(text, gold, FMT), "completion_tokens": tokens, "truncated": cut}
        for text, gold, tokens, cut in cases
    ]
    summary = scoring.summarize(records)
    assert summary.pop("interval_strict") == pytest.approx([0.0456, 0.6994], abs=1e-4)  # Wilson, 1 of 4
    assert summary.pop("interval_lenient") == pytest.approx([0.3006, 0.9544], abs=1e-4)  # 3 of 4
    assert summary == {
        "n": 4,
        "accuracy_strict": 0.25,
        "accuracy_lenient": 0.75,
        "format_rate": 0.25,
        "soft_format_rate": 0.5,
        "mean_completion_tokens": 14.0,
        "truncated": 1,
    }


@pytest.mark.parametrize(("n", "processes"), [(32, 2), (7, 3), (2, 4), (5, 1)])
def test_shards_cover_every_question_once_and_are_equally_long(n, processes):
    shards = [evaluation.shard(n, index, processes) for index in range(processes)]
    assert len({len(indices) for indices, _ in shards}) == 1  # as many generate calls on every process
    own = sorted(i for indices, count in shards for i in indices[:count])
    assert own == list(range(n))


@pytest.fixture(scope="module")
def test_rows(gsm8k_dir):
    return grpo_demo.get_gsm8k_questions("test", str(gsm8k_dir)).select(range(8))


@pytest.fixture(scope="module")
def reading_model(tiny):
    """The tiny model's architecture with weights ten times as large (std 0.2): its greedy completions differ from
    prompt to prompt and change when any token before them does, a pad token read as context too. (The smoke
    model's 0.02 barely moves the last token's embedding: it writes newlines whatever it reads.)"""
    import copy

    tokenizer, model = tiny
    config = copy.deepcopy(model.config)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    return type(model)(config)


@pytest.mark.parametrize(
    "pad",
    [
        "own",  # a pad token of its own (Qwen's): padding could be told from the prompt by its id alone
        "end-of-sequence",  # the end of sequence as pad (models.pad_token's last resort): only the mask tells it
    ],
)
def test_batched_generation_matches_one_at_a_time(tiny, reading_model, test_rows, pad):
    """Left-padded batches (their attention mask and positions) generate what each prompt alone does."""
    import copy

    tokenizer, model = copy.deepcopy(tiny[0]), reading_model
    if pad == "end-of-sequence":
        tokenizer.pad_token = tokenizer.eos_token
    assert (generation.pad_id(tokenizer) == tokenizer.eos_token_id) == (pad == "end-of-sequence")
    prompts = test_rows["prompt"]
    lengths = {len(ids) for ids in generation.prompt_ids(tokenizer, prompts)}
    assert len(lengths) > 1  # so the batch is padded
    model.train()
    single = generation.generate_greedy(model, tokenizer, prompts, max_new_tokens=16, batch_size=1)
    assert len({g.text for g in single}) == len(prompts)  # each prompt its own completion: a test that can fail
    batched = generation.generate_greedy(model, tokenizer, prompts, max_new_tokens=16, batch_size=8)
    assert batched == single
    assert model.training  # put back in the mode it was in


def test_generate_calls_depend_only_on_the_number_of_prompts(tiny, test_rows, monkeypatch):
    """ZeRO-3's generate synchronises every token across processes: each process must call it as often as every
    other, whatever its prompts; and with the KV cache (the trainer turns the config's off)."""
    tokenizer, model = tiny
    calls = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kwargs: calls.append(kwargs["use_cache"]) or generate(**kwargs))
    for prompts in (test_rows["prompt"][:7], [test_rows["prompt"][0]] * 7):
        calls.clear()
        generation.generate_greedy(model, tokenizer, prompts, max_new_tokens=4, batch_size=3)
        assert calls == [True, True, True]


def test_evaluate_writes_a_consistent_report(tiny, test_rows, tmp_path, capsys, monkeypatch):
    import time

    tokenizer, model = tiny
    generate = evaluation.generate_greedy
    monkeypatch.setattr(evaluation, "generate_greedy", lambda *a, **k: time.sleep(0.5) or generate(*a, **k))
    summary, records = evaluation.evaluate(
        model, tokenizer, test_rows, FMT, max_new_tokens=16, batch_size=3, model_name="tiny"
    )
    assert summary["seconds"] >= 0.5  # the time generation took, and the rate of it
    assert summary["questions_per_second"] == pytest.approx(8 / summary["seconds"], rel=0.02)
    folder = reports.write_report(tmp_path, "baseline", summary, records)
    assert folder == layout.eval_dir(tmp_path, "baseline") == tmp_path / "eval" / "baseline"
    saved = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]
    assert saved == summary and lines == records
    assert [r["question"] for r in lines] == test_rows["question"]  # input order restored after length sorting
    assert [r["gold"] for r in lines] == test_rows["answer"]
    assert {k: summary[k] for k in scoring.summarize(records)} == scoring.summarize(lines)
    assert (summary["n"], summary["model"], summary["processes"], summary["max_new_tokens"]) == (8, "tiny", 1, 16)
    assert all(r["completion_tokens"] == 16 for r in lines if r["truncated"])
    assert "| accuracy, strict (answer block) |" in capsys.readouterr().out


def records_of(strict: list[bool], lenient: list[bool] | None = None, tag: str = "") -> list[dict]:
    """Scored records of questions q0, q1, ... with the given verdicts (lenient: as strict unless given)."""
    lenient = strict if lenient is None else lenient
    return [
        {
            "question": f"q{i}",
            "gold": str(i),
            "completion": f"{tag} answer {i}",
            "correct_strict": s,
            "correct_lenient": v,
        }
        for i, (s, v) in enumerate(zip(strict, lenient, strict=True))
    ]


def test_compare_writes_before_and_after(tmp_path, capsys):
    def summary(records, truncated):
        strict = sum(r["correct_strict"] for r in records) / len(records)
        lenient = sum(r["correct_lenient"] for r in records) / len(records)
        rates = dict(accuracy_strict=strict, accuracy_lenient=lenient, format_rate=strict, soft_format_rate=strict)
        return {"n": 4, **rates, "mean_completion_tokens": 100.0, "truncated": truncated, "model": "m", "seconds": 1}

    before = records_of([True, False, False, False], [True, True, False, False], tag="before")
    after = records_of([True, True, True, False], [True, True, True, False], tag="after")
    assert reports.compare(tmp_path) is None  # no evaluations yet
    reports.write_report(tmp_path, "baseline", summary(before, 2), before)
    assert reports.compare(tmp_path) is None  # a baseline alone
    reports.write_report(tmp_path, "final", summary(after, 0), after)
    comparison = reports.compare(tmp_path)
    assert comparison == json.loads((tmp_path / "eval" / "comparison.json").read_text())
    assert comparison["change"]["accuracy_strict"] == 0.5
    assert comparison["change"]["truncated"] == -2
    strict = comparison["paired"]["strict"]
    assert (strict["gained"], strict["lost"], strict["p_value"]) == (2, 0, 0.5)  # 2 x P(X <= 0), X ~ B(2, 1/2)
    assert strict["verdict"] == "within chance (p >= 0.05)"
    assert comparison["paired"]["flipped"]["gained"] == [
        {"question": f"q{i}", "gold": str(i), "before": f"before answer {i}", "after": f"after answer {i}"}
        for i in (1, 2)
    ]
    assert comparison["paired"]["flipped"]["lost"] == []
    assert comparison["paired"]["lenient"]["gained"] == 1
    table = capsys.readouterr().out
    assert "| accuracy, strict (answer block) | 25.0 % | 75.0 % | +50.0 pp |" in table
    assert "| truncated (hit max_new_tokens) | 2 | 0 | -2 |" in table
    assert "Paired, strict: 2 questions gained, 0 lost; exact McNemar p = 0.5: within chance" in table


def test_the_comparison_shows_intervals_and_calls_a_large_change_beyond_chance(tmp_path, capsys):
    before, after = records_of([i < 20 for i in range(100)]), records_of([i < 60 for i in range(100)])
    for name, records in (("baseline", before), ("final", after)):
        reports.write_report(tmp_path, name, scoring.summarize([{**r, **FILLER} for r in records]) | TERMS, records)
    comparison = reports.compare(tmp_path)
    assert comparison["paired"]["strict"]["verdict"] == "a rise larger than chance (p < 0.05)"
    assert comparison["paired"]["strict"]["p_value"] == pytest.approx(2 * 0.5**40)  # 40 gained, 0 lost
    table = capsys.readouterr().out
    assert "| accuracy, strict (answer block) | 20.0 % [13.3, 28.9] | 60.0 % [50.2, 69.1] | +40.0 pp |" in table


FILLER = {"format_strict": True, "format_soft": True, "completion_tokens": 10, "truncated": False}
TERMS = {"model": "m", "seconds": 1, "max_new_tokens": 786}


def test_no_comparison_of_a_baseline_of_another_model(tmp_path, caplog):
    def summary(model, **extra):
        rates = dict(accuracy_strict=0.5, accuracy_lenient=0.5, format_rate=0.5, soft_format_rate=0.5)
        return {"n": 4, **rates, "mean_completion_tokens": 9.0, "truncated": 0, "model": model, "seconds": 1, **extra}

    records = records_of([True, True, False, False])
    reports.write_report(tmp_path, "baseline", summary("Qwen/Qwen2.5-1.5B-Instruct", max_new_tokens=786), records)
    reports.write_report(
        tmp_path, "final", summary("run", start_model="Qwen/Qwen2.5-1.5B-Instruct", max_new_tokens=786), records
    )
    assert reports.compare(tmp_path) is not None
    reports.write_report(tmp_path, "baseline", summary("Qwen/Qwen2.5-0.5B-Instruct", max_new_tokens=786), records)
    assert reports.compare(tmp_path) is None
    assert not (tmp_path / "eval" / "comparison.json").exists()  # the older one is no longer true
    assert "the baseline measured Qwen/Qwen2.5-0.5B-Instruct, and the trained model started from Qwen" in caplog.text
    reports.write_report(tmp_path, "baseline", summary("Qwen/Qwen2.5-1.5B-Instruct", max_new_tokens=786), records)
    reports.write_report(
        tmp_path,
        "final",
        summary("run", start_model="Qwen/Qwen2.5-1.5B-Instruct", max_new_tokens=786, protocol="chat"),
        records,
    )
    assert reports.compare(tmp_path) is None
    assert "measured in different protocols: recipe vs chat" in caplog.text


def test_an_evaluation_in_other_tags_is_written_beside_and_not_compared(tiny_dir, gsm8k_dir, tmp_path, capsys):
    """`--eval_only --reasoning_tag think` where an evaluation in <reasoning> is: another measurement (the prompt asks
    for other tags and the answer is read in them), written beside the first, never over it nor compared with it."""
    out = tmp_path / "out"
    flags = ["--eval_only", "--model_name_or_path", str(tiny_dir), "--dataset", str(gsm8k_dir), "--output_dir"]
    flags += [str(out), "--max_completion_length", "4", "--eval_limit", "3", "--eval_batch_size", "3"]
    grpo_demo.main(flags)
    grpo_demo.main(flags)  # the same terms: measured again in place
    assert sorted(p.name for p in (out / "eval").iterdir()) == ["baseline"]
    first = layout.read_summary(out, "baseline")
    assert first["tags"] == ["<reasoning>", "</reasoning>", "<answer>", "</answer>"]
    grpo_demo.main([*flags, "--reasoning_tag", "think"])
    assert sorted(p.name for p in (out / "eval").iterdir()) == ["baseline", "baseline-2"]
    assert layout.read_summary(out, "baseline") == first
    assert layout.read_summary(out, "baseline-2")["tags"] == ["<think>", "</think>", "<answer>", "</answer>"]
    assert "<think>" in layout.read_summary(out, "baseline-2")["first_prompt"]
    # The chat protocol asks for no tags: other tags change nothing it measures.
    grpo_demo.main([*flags, "--eval_protocols", "chat"])
    grpo_demo.main([*flags, "--eval_protocols", "chat", "--reasoning_tag", "think"])
    assert "baseline-chat-2" not in {p.name for p in (out / "eval").iterdir()}


@pytest.mark.slow  # the recipe trains, in-process
def test_a_run_stopped_in_its_final_evaluation_resumes_to_it_and_saves_its_model(tmp_path, monkeypatch, caplog):
    """Ctrl-C twice in the final evaluation (after the last step): no model, the last step's checkpoint. The hint
    said then, `--resume_from_checkpoint latest`, does the final evaluation and saves the model, with no step more;
    a cut completions.jsonl of the baseline is said, not a traceback; a finished run has nothing to train."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "smoke-GRPO"
    smoke = ["--smoke", "--eval_every_steps", "0", "--max_steps", "3"]  # save_steps 2: the last step saved too
    measure = evaluation.AccuracyCallback.measure

    def second_ctrl_c(self, rows, model_name, desc, *args, **kwargs):
        if "final" in desc:
            raise KeyboardInterrupt  # what stopping.StopOnSignal.receive raises on a second Ctrl-C
        return measure(self, rows, model_name, desc, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(evaluation.AccuracyCallback, "measure", second_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            grpo_demo.main(smoke)
    assert not (run / "model.safetensors").exists() and not (run / "eval" / "final").exists()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    baseline = run / "eval" / "baseline" / "completions.jsonl"
    baseline.write_bytes(baseline.read_bytes()[:-40])  # cut short

    with caplog.at_level("WARNING", logger="grpo_demo"):
        grpo_demo.main([*smoke, "--resume_from_checkpoint", "latest"])
    assert "checkpoint-3 is the run's last step, and the run has no final model: finishing it" in caplog.text
    assert (
        f"No comparison of baseline and final in {run.relative_to(tmp_path) / 'eval'}: "
        f"{baseline.relative_to(tmp_path)} cannot be read (cut short?): measure baseline again, with the settings it "
        "was measured with: --eval_only --model_name_or_path outputs/smoke-assets/tiny-qwen2 --output_dir "
        "outputs/smoke-GRPO"
    ) in caplog.text
    assert layout.read_summary(run, "final")["n"] == 32 and not (run / "eval" / "comparison.json").exists()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]  # no step more
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 3
    trained = completions_of(run, grpo_demo.get_gsm8k_questions("test", "outputs/smoke-assets/gsm8k-generated"))
    assert [r["completion"] for r in reports.read_records(run, "final")] == trained  # the saved model's
    from safetensors.torch import load_file

    saved, last = load_file(run / "model.safetensors"), load_file(run / "checkpoint-3" / "model.safetensors")
    assert all(torch.equal(saved[name], last[name]) for name in last)  # the last step's weights

    # The hint followed: the baseline measured again, and the comparison is made.
    grpo_demo.main(["--smoke", "--eval_only", "--model_name_or_path", "outputs/smoke-assets/tiny-qwen2"]
                   + ["--output_dir", "outputs/smoke-GRPO"])  # fmt: skip
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["baseline", "comparison.json", "final"]
    with pytest.raises(RecipeError, match="checkpoint-3 is at step 3, and this run ends at max_steps=3: nothing to"):
        grpo_demo.main([*smoke, "--resume_from_checkpoint", "latest"])


def test_a_run_without_checkpoints_is_warned_it_cannot_resume_to_its_final_evaluation(caplog):
    with caplog.at_level("WARNING", logger="grpo_demo"):
        resolved(["--save_strategy", "no"])
        resolved(["--eval_only", "--save_strategy", "no"])  # nothing to resume: no word
    assert caplog.text.count("save_strategy=no: no checkpoint of the last step, so a run stopped in its final") == 1


def test_the_split_and_the_rows_held_out_are_terms_of_an_evaluation(tmp_path, caplog):
    """Two evaluations of the same questions on another split, or other held-out rows, are not the same one."""
    test = {"model": "m", "questions_sha256": "q", "max_new_tokens": 8, "split": "test", "seconds": 1}
    validation = {**test, "split": "validation", "validation_rows": 8}
    records = records_of([True, False])
    reports.write_report(tmp_path, "final", {**scoring.summarize([{**r, **FILLER} for r in records]), **test}, records)
    assert reports.free_name(tmp_path, "final", test) == "final"
    assert reports.free_name(tmp_path, "final", {k: v for k, v in test.items() if k != "split"}) == "final"  # older
    assert reports.free_name(tmp_path, "final", validation) == "final-2"
    reports.write_report(
        tmp_path, "final-2", {**scoring.summarize([{**r, **FILLER} for r in records]), **validation}, records
    )
    assert reports.free_name(tmp_path, "final", {**validation, "validation_rows": 16}) == "final-3"
    assert reports.why_not_comparable(test, validation) == "they were measured on different splits: test vs validation"
    tags = {"tags": ["<reasoning>", "</reasoning>", "<answer>", "</answer>"]}
    think = {"tags": ["<think>", "</think>", "<answer>", "</answer>"]}
    assert reports.why_not_comparable({**test, **tags}, {**test, **think}) == (
        "they were asked for and read in other tags: <reasoning> </reasoning> <answer> </answer> vs "
        "<think> </think> <answer> </answer>"
    )


# ----------------------------------------------------------------------------------------------------------------
# A training run measures the trainer's own model, and loads it once


def completions_of(model_dir, rows, tokenizer_dir=None) -> list[str]:
    """Greedy completions of a saved model, as the run's evaluation generates them (same batch size and length)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.presets import SETTINGS

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = [row["prompt"] for row in rows]
    max_new = SETTINGS["smoke"]["max_completion_length"]
    return [g.text for g in generation.generate_greedy(model, tokenizer, prompts, max_new, batch_size=64)]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`python grpo_demo.py --smoke` in this process (the recipe's main), counting every model load. A large learning
    rate makes the trained model answer differently from the start model."""
    from transformers import PreTrainedModel

    folder = tmp_path_factory.mktemp("smoke")
    loads = []
    original = PreTrainedModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(args[0] if args else kwargs.get("pretrained_model_name_or_path"))
        return original(cls, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(PreTrainedModel, "from_pretrained", classmethod(counting))
        grpo_demo.main(
            ["--smoke", "--report_to", "none", "--learning_rate", "0.01", "--eval_every_steps", "2"]
            + ["--eval_protocols", "gsm8k-chat", "chat", "--eval_max_gen_toks", "16", "--eval_samples", "4"]
        )
    return folder, loads


@pytest.mark.slow  # the recipe trains, in-process
def test_a_training_run_loads_one_model(smoke_run):
    _, loads = smoke_run
    assert loads == ["outputs/smoke-assets/tiny-qwen2"]  # the trainer's; the evaluations use it too


def test_baseline_and_final_evaluate_the_start_and_the_trained_model(smoke_run):
    folder, _ = smoke_run
    run = folder / "outputs" / "smoke-GRPO"
    rows = grpo_demo.get_gsm8k_questions("test", str(folder / "outputs" / "smoke-assets" / "gsm8k-generated"))

    def evaluated(name):
        return [json.loads(line)["completion"] for line in (run / "eval" / name / "completions.jsonl").open()]

    start = completions_of(folder / "outputs" / "smoke-assets" / "tiny-qwen2", rows)
    trained = completions_of(run, rows)
    assert start != trained  # training changed the answers...
    assert evaluated("baseline") == start  # ...and each evaluation scored the model it names
    assert evaluated("final") == trained
    comparison = json.loads((run / "eval" / "comparison.json").read_text())
    assert (comparison["baseline"]["n"], comparison["final"]["n"]) == (32, 32)
    assert comparison["baseline"]["model"] == "outputs/smoke-assets/tiny-qwen2"
    assert comparison["final"]["model"] == "outputs/smoke-GRPO"

    state = json.loads((run / "trainer_state.json").read_text())
    accuracy = [e for e in state["log_history"] if "eval_accuracy_strict" in e]
    assert [e["step"] for e in accuracy] == [0, 2, 4]  # step 0: the baseline's, on the questions measured after
    first = [json.loads(line) for line in (run / "eval" / "baseline" / "completions.jsonl").open()][:8]  # eval_subset
    assert accuracy[0]["eval_accuracy_strict"] == sum(r["correct_strict"] for r in first) / 8
    rewards = [e for e in state["log_history"] if "reward" in e]
    assert [e["step"] for e in rewards] == [1, 2, 3, 4]  # the rewards still log in their own entries


@pytest.mark.slow  # the recipe trains, in-process
def test_a_training_run_measures_every_protocol_asked_before_and_after(smoke_run, capsys):
    folder, _ = smoke_run
    evaluations = folder / "outputs" / "smoke-GRPO" / "eval"
    for protocol, name in (("recipe", ""), ("gsm8k-chat", "-gsm8k-chat"), ("chat", "-chat")):
        for base in ("baseline", "final"):
            summary = json.loads((evaluations / f"{base}{name}" / "summary.json").read_text())
            assert summary["protocol"] == protocol and summary["n"] == 32
            if protocol == "gsm8k-chat":  # lm-eval's task: greedy, its own verdicts, its accuracy
                assert summary["accuracy_strict"] == summary["lm_eval_results"]["strict"]
                assert summary["accuracy_lenient"] == summary["lm_eval_results"]["lenient"]
                assert summary["format_rate"] is None and "sampling" not in summary
                continue
            assert set(summary["sampling"]["strict"]) == {"pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"}
            assert summary["sampling"]["temperature"] == 0.9  # the training temperature
            lines = (evaluations / f"{base}{name}" / "completions.jsonl").read_text().splitlines()
            assert all(len(json.loads(line)["samples"]) == 4 for line in lines)
        comparison = json.loads((evaluations / f"comparison{name}.json").read_text())
        paired = comparison["paired"]["strict"]
        assert paired["gained"] == len(comparison["paired"]["flipped"]["gained"])
        assert 0 <= paired["p_value"] <= 1 and paired["verdict"]
    details = json.loads((evaluations / "baseline-gsm8k-chat" / "summary.json").read_text())["protocol_details"]
    assert (details["task"], details["num_fewshot"], details["task_version"]) == ("gsm8k", 5, 3.0)
    assert (details["apply_chat_template"], details["fewshot_as_multiturn"], details["max_gen_toks"]) == (
        True,
        True,
        16,
    )


@pytest.mark.slow  # the recipe trains, in-process
def test_eval_only_and_ask_use_the_saved_model(smoke_run, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, _ = smoke_run
    run = "outputs/smoke-GRPO"
    evaluations = folder / run / "eval"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        before = json.loads((evaluations / "final" / "summary.json").read_text())
        # A trained run's folder: its final evaluation, measured again on the same terms, beside the model.
        trained_by_lm_eval = (evaluations / "final-gsm8k-chat" / "completions.jsonl").read_text()
        same = ["--eval_samples", "4", "--eval_protocols", "recipe", "gsm8k-chat", "--eval_max_gen_toks", "16"]
        grpo_demo.main(["--smoke", "--eval_only", "--model_name_or_path", run, *same])
        again = json.loads((evaluations / "final" / "summary.json").read_text())
        assert (again["n"], again["model"], again["start_model"]) == (32, run, "outputs/smoke-assets/tiny-qwen2")
        assert again["accuracy_strict"] == before["accuracy_strict"]
        assert json.loads((evaluations / "comparison.json").read_text())["final"] == again
        # lm-eval on the saved folder answers as it did on the trainer's model: the same completions and verdicts.
        assert (evaluations / "final-gsm8k-chat" / "completions.jsonl").read_text() == trained_by_lm_eval
        assert (evaluations / "comparison-gsm8k-chat.json").is_file()
        # On other terms (5 questions; no samples; other examples) each is written beside the first, which stays.
        grpo_demo.main(["--smoke", "--eval_only", "--model_name_or_path", run, "--eval_limit", "5"])
        assert json.loads((evaluations / "final-2" / "summary.json").read_text())["n"] == 5
        assert json.loads((evaluations / "final" / "summary.json").read_text())["n"] == 32
        other = ["--eval_protocols", "gsm8k-chat", "--eval_max_gen_toks", "8"]
        grpo_demo.main(["--smoke", "--eval_only", "--model_name_or_path", run, *other])
        assert json.loads((evaluations / "final-gsm8k-chat-2" / "summary.json").read_text())["max_new_tokens"] == 8
        assert json.loads((evaluations / "final-gsm8k-chat" / "summary.json").read_text())["max_new_tokens"] == 16

        capsys.readouterr()
        question = "Ava has 3 apples and gets 4 more. How many apples does Ava have now?"
        grpo_demo.main(["--smoke", "--model_name_or_path", run, "--ask", question, "--seed", "5"])
        printed = capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(folder / run)
    model = AutoModelForCausalLM.from_pretrained(folder / run).eval()
    expected = generation.sample(model, tokenizer, FMT.chat_prompt(question), max_new_tokens=48, seed=5)
    assert expected and printed == f"{run} answers (sampled, seed 5):\n{expected}\n"


def test_eval_only_of_a_folder_with_a_damaged_model_is_a_message(tiny_dir, tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in tiny_dir.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError, match="model.safetensors truncated or damaged"):  # found before anything loads
        grpo_demo.main(["--smoke", "--eval_only", "--model_name_or_path", str(broken)])
    (broken / "config.json").write_text("{not json")  # a damaged config: found when the tokenizer or model loads
    weights.write_bytes((tiny_dir / "model.safetensors").read_bytes())
    with pytest.raises(RecipeError, match=f"Could not load the model '{broken}'"):
        grpo_demo.main(["--smoke", "--eval_only", "--model_name_or_path", str(broken)])


def trained_folder(tmp_path, validation_rows):
    """A run's output folder as the recipe leaves it: its model (a config), its state and its run record."""
    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    for folder in (run, run / "checkpoint-4"):
        (folder / "config.json").write_text("{}")
        (folder / "trainer_state.json").write_text("{}")
    record = {"settings": {"run": {"validation_rows": validation_rows}}}
    (run / "run_record.json").write_text(json.dumps(record))
    return run


@pytest.mark.parametrize("checkpoint", [False, True], ids=["model", "checkpoint"])
def test_validation_rows_a_model_trained_on_are_refused_as_held_out(gsm8k_dir, tmp_path, checkpoint):
    run = trained_folder(tmp_path, 0)
    model = run / "checkpoint-4" if checkpoint else run
    flags = ["--eval_only", "--dataset", str(gsm8k_dir), "--eval_split", "validation", "--validation_rows", "8"]
    message = refused([*flags, "--model_name_or_path", str(model)])
    assert message == (
        f"Invalid settings:\n  - eval_split=validation: {model} was trained with validation_rows=0 (its run "
        f"record, {run / 'run_record.json'}), so of the 8 train rows --validation_rows 8 holds out it trained on "
        "every one of them: measure the test split (--eval_split test)"
    )
    (run / "run_record.json").write_text(json.dumps({"settings": {"run": {"validation_rows": 3}}}))
    assert refused([*flags, "--model_name_or_path", str(model)]).endswith(
        "it trained on all but 3 of them: measure the test split (--eval_split test), or the rows its run held out "
        "(--validation_rows 3)"
    )
    # As many as its run held out, or fewer (one draw: they are among them), are held out indeed; so is the test split.
    for rows in ("3", "2"):
        resolved([*flags[:-1], rows, "--model_name_or_path", str(model)])
    resolved(["--eval_only", "--dataset", str(gsm8k_dir), "--validation_rows", "8", "--model_name_or_path", str(model)])


def test_validation_rows_of_a_trained_model_without_a_run_record_are_said_unknown(gsm8k_dir, tmp_path, caplog):
    run = trained_folder(tmp_path, 0)
    (run / "run_record.json").unlink()
    flags = ["--eval_only", "--dataset", str(gsm8k_dir), "--eval_split", "validation", "--validation_rows", "8"]
    with caplog.at_level("WARNING", logger="grpo_demo"):
        resolved([*flags, "--model_name_or_path", str(run)])
    assert (
        f"eval_split=validation: {run} has no run record ({run / 'run_record.json'}): whether it trained on the rows "
        "--validation_rows 8 holds out cannot be told, and they are called held out on its word"
    ) in caplog.text


@pytest.mark.parametrize("before_and_after", [True, False], ids=["final-eval", "no-final-eval"])
def test_the_accuracy_curve_starts_at_step_0_with_or_without_the_final_evaluation(monkeypatch, before_and_after):
    """Step 0 is where not_learning's start is read: the baseline's records on the subset where it is measured, else
    the subset measured alone; a resumed run logs no second start, and no in-training accuracy logs none."""
    from test_stopping import fake_trainer
    from transformers import TrainerControl, TrainerState

    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(3)]
    records = [
        {
            "correct_strict": right,
            "correct_lenient": True,
            "format_strict": True,
            "format_soft": True,
            "completion_tokens": tokens,
            "truncated": False,
        }
        for right, tokens in [(1, 10), (0, 30), (0, 50)]
    ]
    measured, logged = [], []

    def measure(rows_asked, model_name, desc, *args, **kwargs):
        measured.append((len(rows_asked), desc))
        return {}, records[: len(rows_asked)]

    def accuracy(every_steps, global_step=0):
        callback = evaluation.AccuracyCallback(
            fake_trainer(TrainerState()),
            rows,
            grpo_demo.ANSWER_FORMAT,
            evaluation.Plan(before_and_after=before_and_after, every_steps=every_steps, subset=2, batch_size=2),
        )
        monkeypatch.setattr(callback, "measure", measure)
        monkeypatch.setattr(callback, "report", lambda base, model: measure(rows, model, base)[1])
        monkeypatch.setattr(callback, "log_subset", lambda summary, control: logged.append(summary))
        callback.on_train_begin(None, TrainerState(global_step=global_step), TrainerControl())
        return callback

    assert accuracy(every_steps=5).measured == 2
    assert measured == ([(3, "baseline")] if before_and_after else [(2, "accuracy at step 0")])
    assert [(s["n"], s["accuracy_strict"], s["mean_completion_tokens"]) for s in logged] == [(2, 0.5, 20.0)]
    measured.clear(), logged.clear()
    assert accuracy(every_steps=0).measured == 0 and logged == []
    measured.clear()
    accuracy(every_steps=5, global_step=4)
    assert logged == [] and measured == []


def test_validation_rows_that_changed_since_the_run_are_refused(gsm8k_dir, tmp_path):
    run = trained_folder(tmp_path, 8)
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(8)]
    settings = evaluation.Plan(split={"split": "validation", "validation_rows": 8}, dataset=str(gsm8k_dir))
    (run / "eval" / "baseline").mkdir(parents=True)
    summary = {"split": "validation", "validation_rows": 8, "n": 8, "questions_sha256": "0" * 64}
    (run / "eval" / "baseline" / "summary.json").write_text(json.dumps(summary))
    record = {"settings": {"run": {"validation_rows": 8, "dataset": str(gsm8k_dir)}}}
    (run / "run_record.json").write_text(json.dumps(record))
    with pytest.raises(RecipeError, match="are not those .* run held out and measured"):
        evaluation.same_held_out_rows(str(run), settings, rows, scoring.questions_fingerprint(rows))
    other = evaluation.Plan(split={"split": "validation", "validation_rows": 8}, dataset=str(tmp_path))  # another set
    evaluation.same_held_out_rows(str(run), other, rows, scoring.questions_fingerprint(rows))
    summary["questions_sha256"] = scoring.questions_fingerprint(rows)  # the same rows: measured
    (run / "eval" / "baseline" / "summary.json").write_text(json.dumps(summary))
    evaluation.same_held_out_rows(str(run / "checkpoint-4"), settings, rows, summary["questions_sha256"])


ROWS = [("What is 2 + 2?", "4"), ("And 3 + 3?", "6")]


@pytest.mark.parametrize(
    ("other", "same"),
    [
        (ROWS, True),  # the same questions and golds, in order
        ([("What is 2 + 2?", "4"), ("And 3 + 3?", "7")], False),  # a gold answer changed
        (ROWS[::-1], False),  # another order
        (ROWS[:1], False),  # fewer rows
        ([("What is 2 + 2? ", "4"), ("And 3 + 3?", "6")], False),  # a question's text changed
    ],
)
def test_two_evaluations_compare_only_on_the_same_rows(other, same):
    """The one row fingerprint, as an evaluation's summary (`questions_sha256`) and lm-eval's bridge compute it."""
    as_rows = lambda pairs: [{"question": q, "answer": a} for q, a in pairs]  # noqa: E731
    assert (scoring.questions_fingerprint(as_rows(other)) == scoring.questions_fingerprint(as_rows(ROWS))) == same
    assert scoring.questions_fingerprint(as_rows(other)) == scoring.fingerprint(other)  # the harness's, the same
