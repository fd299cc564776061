"""The learning demo: `python grpo_demo.py --demo` raises held-out accuracy with GRPO, offline, on a CPU."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest
import torch
from conftest import REWARD_NAMES, resolved, run_printed, run_recipe
from transformers import AutoTokenizer

import grpo_demo
from grpo_kit import demo, generation, presets

FMT = grpo_demo.ANSWER_FORMAT

FULL_REWARD = 4.0  # xmlcount 0.5 + soft 0.5 + strict 0.5 + int 0.5 + correctness 2.0


def test_held_out_problems_are_new_sums():
    train, test = demo.make_problems(2000, 256, seed=3)
    assert (len(train), len(test)) == (2000, 256)

    def sum_asked(row) -> tuple:  # ("48", "+", "8") for "... has 48 apples and gets 8 more ..."
        a, b = re.findall(r"\d+", row["question"])
        return a, "+" if "more" in row["question"] else "-", b

    held_out = {sum_asked(row) for row in test}
    assert len(held_out) == 256  # each test problem a different sum...
    assert not held_out & {sum_asked(row) for row in train}  # ...and none of them in training
    for row in test + train:
        a, op, b = sum_asked(row)
        assert row["answer"].endswith(f"#### {int(a) + int(b) if op == '+' else int(a) - int(b)}")
    counting = [row for row in train if ", counting" in row["answer"]]
    assert 0.45 < len(counting) / len(train) < 0.55  # COUNTING_SHARE 0.5


def test_the_demos_problems_are_the_ones_its_figures_were_measured_on():
    """The README's figures and the 30 measured runs start from these exact problems: a change to how they are drawn
    (the random draws or their order included) would make another demo, and a warm start the figures do not cover."""
    import hashlib

    train, test = demo.make_problems(demo.N_TRAIN, demo.N_TEST, demo.ASSETS_SEED)
    assert test[0] == {
        "question": "Kenji has 13 books and gets 5 more. How many books does Kenji have now?",
        "answer": "13 + 5 = 18\n#### 18",
    }
    assert train[0] == {
        "question": "Grace has 10 apples and gets 4 more. How many apples does Grace have now?",
        "answer": "10 + 4, counting on: 10+4=11+3=12+2=13+1=14\n#### 14",
    }
    digest = hashlib.sha256(json.dumps([train, test]).encode()).hexdigest()
    assert digest == "8cc78722650d231d5aeb95c4ae674ad7866e7462686e1c7a7a76208068677650"


def test_solutions_count_on_and_back_to_the_result_one_unit_a_step():
    assert demo.solutions(48, 3, "+") == ("48 + 3 = 51", "48 + 3, counting on: 48+3=49+2=50+1=51", 51)
    assert demo.solutions(12, 4, "-") == ("12 - 4 = 8", "12 - 4, counting back: 12-4=11-3=10-2=9-1=8", 8)
    assert demo.solutions(10, 1, "-") == ("10 - 1 = 9", "10 - 1, counting back: 10-1=9", 9)


def test_the_warm_start_teaches_counting_on_half_its_solutions_and_the_choice_to_count_at_its_share(tiny):
    """Every counting solution teaches how to count; the token that chooses to count (`,` after the restated sum,
    where one-line solutions write ` =`) is in the loss on only enough of them that CHOICE_SHARE of the choices the
    loss sees are to count: greedy decoding then answers at once, and sampling counts about that often."""
    import random

    tokenizer, _ = tiny
    train, _ = demo.make_problems(400, 10, seed=3)
    triples = demo.examples(tokenizer, FMT, train)
    counting = [row[2] is not None for row in triples]
    assert counting == [", counting" in r["answer"] for r in train]
    for (_, target, choice), row in zip(triples, train, strict=True):
        if choice is not None:
            assert tokenizer.decode(target[choice:]).startswith(", counting")  # the choice, and only it, left out
            assert row["answer"].split(",")[0] in tokenizer.decode(target[:choice])
    rng, seen = random.Random(0), {True: 0, False: 0}
    for _ in range(50):
        _, labels, _ = demo.batch(triples, 0, rng)
        for (prompt, _, choice), row_labels, counts in zip(triples, labels.tolist(), counting, strict=True):
            if choice is not None and row_labels[len(prompt) + choice] == -100:
                continue  # how to count, not when
            seen[counts] += 1  # a choice the loss sees: to count, or to answer at once
    assert seen[True] / (seen[True] + seen[False]) == pytest.approx(demo.CHOICE_SHARE, abs=0.02)


def test_warm_start_targets_earn_every_reward():
    """The warm start teaches exactly what the rewards pay for: both styles, formatted, earn the full 4.0."""
    train, _ = demo.make_problems(200, 10)
    completions = [[{"role": "assistant", "content": FMT.gsm8k_solution(r["answer"]).rstrip("\n")}] for r in train]
    answers = [grpo_demo.extract_hash_answer(r["answer"]) for r in train]
    totals = [0.0] * len(train)
    for func in grpo_demo.REWARD_FUNCS:
        scores = func(prompts=[None] * len(train), completions=completions, answer=answers)
        totals = [t + s for t, s in zip(totals, scores, strict=True)]
    assert totals == [FULL_REWARD] * len(train)


def test_prepare_writes_the_assets_and_reuses_the_warm_start(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "WARM_STEPS", 3)  # the machinery, not the learning: that is the test below
    d = presets.defaults("demo", "qwen2")
    demo.prepare(FMT, d["model_name_or_path"], d["dataset"])
    model_dir = tmp_path / d["model_name_or_path"]
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    assert json.loads((model_dir / "warm_start.json").read_text())["warm_steps"] == 3
    test_rows = grpo_demo.get_gsm8k_questions("test", d["dataset"])
    assert len(test_rows) == demo.N_TEST

    # Every solution, the longest counting ones included, fits in max_completion_length with its end of turn, in
    # the tokenizer of either kind.
    texts = [
        FMT.gsm8k_solution(f"{style}\n#### {result}").rstrip("\n")
        for a in range(10, 100)
        for b in range(1, 10)
        for op in "+-"
        for *styles, result in [demo.solutions(a, b, op)]
        for style in styles
    ]
    train, _ = demo.make_problems(demo.N_TRAIN, demo.N_TEST, demo.ASSETS_SEED)
    for tokenizer in (AutoTokenizer.from_pretrained(model_dir), demo.build_tokenizer(FMT, train, "llama3")):
        longest = max(len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
        assert 70 < longest <= d["max_completion_length"]
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        demo.prepare(FMT, d["model_name_or_path"], d["dataset"])
    assert "Reusing the warm-started model" in caplog.text

    # A rebuild (another seed) cut short: built beside the folder, it leaves the old model whole, its stamp true.
    weights = (model_dir / "model.safetensors").read_bytes()
    monkeypatch.setattr(demo, "warm_start", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        demo.prepare(FMT, d["model_name_or_path"], d["dataset"], seed=1)
    assert (model_dir / "model.safetensors").read_bytes() == weights
    assert json.loads((model_dir / "warm_start.json").read_text())["seed"] == demo.ASSETS_SEED
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        demo.prepare(FMT, d["model_name_or_path"], d["dataset"])
    assert "Reusing the warm-started model" in caplog.text
    with pytest.raises(KeyboardInterrupt):  # the build cut short is cleared by the next one
        demo.prepare(FMT, d["model_name_or_path"], d["dataset"], seed=1)
    assert len(list(model_dir.parent.glob(f".{model_dir.name}.*.part"))) == 1


def test_the_seed_varies_grpo_alone_not_the_demos_start_model(monkeypatch, tmp_path):
    """`--demo --seed N` trains from the same problems and warm-started model whatever N (the assets' seed is fixed,
    so runs of several seeds compare GRPO alone); the smoke preset's tiny model follows the seed."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from grpo_kit import presets, smoke

    monkeypatch.chdir(tmp_path)
    made = []
    monkeypatch.setattr(demo, "prepare", lambda fmt, model, data, seed: made.append(("demo", seed)))
    monkeypatch.setattr(smoke, "prepare", lambda fmt, model, data, seed: made.append(("smoke", seed)))
    for preset, seed in (("demo", 7), ("demo", 1234), ("smoke", 7)):
        run = SimpleNamespace(smoke=preset == "smoke", demo=preset == "demo", eval_only=False, ask=None, dataset=None)
        run.__dict__.update(reasoning_tag="reasoning", answer_tag="answer", tiny_model="qwen2")
        args = SimpleNamespace(
            seed=seed,
            output_dir=str(tmp_path / "elsewhere"),
            resume_from_checkpoint=None,
            process_index=0,
            main_process_first=lambda **kwargs: nullcontext(),
        )
        presets.prepare(run, args, SimpleNamespace(model_name_or_path="m"), FMT)
    assert made == [("demo", demo.ASSETS_SEED), ("demo", demo.ASSETS_SEED), ("smoke", 7)]


@pytest.mark.parametrize("preset", ["smoke", "demo"])
def test_presets_on_other_terms_build_their_assets_in_folders_of_their_own(preset, tmp_path, monkeypatch):
    """Two preset runs at once with other tags (or, for --smoke, another seed; or another tiny model) never share a
    folder either writes: each one's tokenizer holds its own tags."""
    monkeypatch.chdir(tmp_path)
    runs = [[], ["--reasoning_tag", "think"], ["--answer_tag", "final"], ["--seed", "7"], ["--tiny_model", "llama3"]]
    folders = [(v.model_name_or_path, v.dataset) for v in (resolved([f"--{preset}", *extra]) for extra in runs)]
    plain = presets.defaults(preset)
    assert folders[0] == (plain["model_name_or_path"], plain["dataset"])  # the recipe's tags, seed 42: as documented
    assert folders[1][0] == f"{plain['model_name_or_path']}.think.answer"
    models = [model for model, _ in folders]
    if preset == "smoke":  # its seed draws the weights and the problems
        assert len(set(models)) == 5 and folders[3] == (f"{models[0]}.seed7", f"{plain['dataset']}.seed7")
    else:  # the demo's start model is one for every seed
        assert len(set(models)) == 4 and folders[3] == folders[0]


def test_smoke_assets_in_other_tags_hold_their_own_tokenizer(tmp_path, monkeypatch):
    from contextlib import nullcontext
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)
    for tag in ("reasoning", "think"):
        run = resolved(["--smoke", "--reasoning_tag", tag])
        args = SimpleNamespace(seed=run.seed, output_dir="elsewhere", resume_from_checkpoint=None, process_index=0)
        args.main_process_first = lambda **kwargs: nullcontext()
        fmt = grpo_demo.answer_format(grpo_demo.Tags(tag, "answer"))
        presets.prepare(run, args, SimpleNamespace(model_name_or_path=run.model_name_or_path), fmt)
    for folder, tag in (("tiny-qwen2", "reasoning"), ("tiny-qwen2.think.answer", "think")):
        vocabulary = AutoTokenizer.from_pretrained(tmp_path / "outputs" / "smoke-assets" / folder).get_vocab()
        other = ({"reasoning", "think"} - {tag}).pop()
        assert f"<{tag}>\n" in vocabulary and f"<{other}>\n" not in vocabulary


def test_an_asset_folder_is_built_beside_it_under_a_lock_and_renamed_into_place(tmp_path):
    import fcntl

    from grpo_kit import smoke

    folder = tmp_path / "assets" / "tiny"
    assert smoke.build_once(folder, {"v": 1}, lambda path: (path / "a.txt").write_text("old"))
    assert not smoke.build_once(folder, {"v": 1}, lambda path: pytest.fail("built again"))  # its stamp holds: kept

    def build(path):
        assert path.parent == folder.parent and path != folder  # beside it...
        assert (folder / "a.txt").read_text() == "old"  # ...while the folder stays as it was...
        other = os.open(folder.parent, os.O_RDONLY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ...and no other builder gets in
        os.close(other)
        (path / "a.txt").write_text("new")

    assert smoke.build_once(folder, {"v": 2}, build)
    assert (folder / "a.txt").read_text() == "new" and json.loads((folder / smoke.STAMP).read_text()) == {"v": 2}
    assert [p.name for p in folder.parent.iterdir()] == ["tiny"]  # nothing half-built left, no lock file
    with pytest.raises(KeyboardInterrupt):  # a build cut short leaves the folder as it was
        smoke.build_once(folder, {"v": 3}, lambda path: (_ for _ in ()).throw(KeyboardInterrupt))
    assert (folder / "a.txt").read_text() == "new" and json.loads((folder / smoke.STAMP).read_text()) == {"v": 2}


def test_an_asset_folder_is_built_where_there_is_no_flock(tmp_path, monkeypatch):
    from grpo_kit import smoke

    monkeypatch.setitem(sys.modules, "fcntl", None)  # as on Windows: importing it fails
    assert smoke.build_once(tmp_path / "tiny", {"v": 1}, lambda path: (path / "a.txt").write_text("built"))
    assert (tmp_path / "tiny" / "a.txt").read_text() == "built"


# The bounds of the two demo runs below sit well inside what 30 runs measured (benchmarks/demo_runs.py, docs/
# demo_seeds.json: either model, warm-start seeds 42, 11 and 12, as another machine's float sums change a warm start,
# and 5 GRPO seeds each): strict accuracy 5.5-19.9 % before, 91.8-96.9 % after, a rise of 73-89 points; strict format
# 97.7 % or more before, 97.3 % or more after; completions 28 tokens longer or more; at most 4 questions lost.
RISE = 0.45  # the project's bar is 20 points; the least of 30 runs rose 73


@pytest.mark.slow
def test_demo_raises_held_out_accuracy_with_grpo(tmp_path):
    """The whole demo as documented, fixed seeds (the preset's): greedy strict accuracy on 256 held-out problems
    rises from the warm-started model to the GRPO-trained one, keeping the format (bounds: see RISE)."""
    result = run_recipe(["--demo"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    run = tmp_path / "outputs" / "demo-GRPO"
    comparison = json.loads((run / "eval" / "comparison.json").read_text())
    before, after = comparison["baseline"], comparison["final"]
    assert before["n"] == after["n"] == demo.N_TEST
    assert before["format_rate"] >= 0.9  # the warm start taught the format...
    assert before["accuracy_strict"] <= 0.35  # ...but the model answers at once, mostly wrong
    rise = after["accuracy_strict"] - before["accuracy_strict"]
    assert rise >= RISE, f"accuracy {before['accuracy_strict']:.1%} -> {after['accuracy_strict']:.1%}"
    assert after["accuracy_strict"] >= 0.75 and after["format_rate"] >= 0.9
    assert after["mean_completion_tokens"] > before["mean_completion_tokens"] + 15  # it learned to count
    # The comparison says the rise is no chance: intervals apart, the paired test's verdict, the questions it moved.
    assert before["interval_strict"][1] < after["interval_strict"][0]
    paired = comparison["paired"]["strict"]
    assert paired["verdict"] == "a rise larger than chance (p < 0.05)" and paired["gained"] > 10 * paired["lost"]
    assert len(comparison["paired"]["flipped"]["gained"]) == paired["gained"]
    assert "Paired, strict:" in result.stdout and "questions gained" in result.stdout

    state = json.loads((run / "trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "reward" in e]
    assert len(steps) == presets.SETTINGS["demo"]["max_steps"]
    assert all(f"rewards/{name}/mean" in e for e in steps for name in REWARD_NAMES)
    measured = [e["step"] for e in state["log_history"] if "eval_accuracy_strict" in e]
    assert measured == list(range(0, 41, 5))  # the start, then every 5 steps, for the curves
    health = json.loads((run / "health.json").read_text())
    assert health["findings"] == []  # a healthy run says so, and which check its 40 steps are too few for
    assert list(health["too_few_steps"]) == ["length_runaway"]  # two windows of 50 steps
    assert "Training health: no finding, but too few steps to judge 1 of 7 checks (40 logged)" in result.stdout
    # The console a person reads: a line per step, the accuracy table, the verdict and where it all is, in <= 120
    lines = result.stdout.splitlines()
    assert len(lines) <= 120, f"{len(lines)} lines"
    assert len([line for line in lines if line.startswith("step ") and "/40  reward " in line]) == 40
    assert "| accuracy, strict (answer block) | " in result.stdout and "Paired, strict: " in result.stdout
    assert "Written to outputs/demo-GRPO:" in lines and "  curves       outputs/demo-GRPO/curves.png" in lines
    assert not [line for line in lines if "Warning" in line or "┃" in line or "{'loss'" in line]
    asked = run_printed(result.stdout, "Ask it: ", tmp_path)  # the closing hint, as printed: the trained model answers
    assert asked.returncode == 0 and "outputs/demo-GRPO answers (sampled, seed 42):" in asked.stdout, asked.stdout


@pytest.mark.slow
@pytest.mark.long
def test_the_demo_learns_on_the_llama_model_too(tmp_path):
    """`--demo --tiny_model llama3`: the same problems, rewards and GRPO on a tiny Llama with Llama 3's chat
    conventions. Greedy strict accuracy on the 256 held-out problems rises as on Qwen2 (bounds: see RISE), and every
    completion ends at `<|eot_id|>`, the end of a turn, not at the tokenizer's end of sequence."""
    from transformers import AutoModelForCausalLM

    result = run_recipe(["--demo", "--tiny_model", "llama3"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    run = tmp_path / "outputs" / "demo-llama3-GRPO"
    comparison = json.loads((run / "eval" / "comparison.json").read_text())
    before, after = comparison["baseline"], comparison["final"]
    assert before["n"] == after["n"] == demo.N_TEST
    assert before["format_rate"] >= 0.9 and after["format_rate"] >= 0.9
    assert before["truncated"] == 0 and after["truncated"] <= 5  # completions stop: a rare one runs to the limit
    rise = after["accuracy_strict"] - before["accuracy_strict"]
    assert rise >= RISE, f"accuracy {before['accuracy_strict']:.1%} -> {after['accuracy_strict']:.1%}"

    tokenizer = AutoTokenizer.from_pretrained(run)
    model = AutoModelForCausalLM.from_pretrained(run).eval()
    rows = grpo_demo.get_gsm8k_questions("test", str(tmp_path / demo.DATA_DIR))
    ids = generation.prompt_ids(tokenizer, rows["prompt"][:16])
    input_ids, attention_mask = generation.left_pad(ids, tokenizer.pad_token_id)
    stops = generation.stop_ids(model, tokenizer)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=80, do_sample=False,
            eos_token_id=stops, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    ends = [next((t for t in row if t in stops), None) for row in output[:, input_ids.shape[1] :].tolist()]
    assert ends == [tokenizer.convert_tokens_to_ids("<|eot_id|>")] * 16
