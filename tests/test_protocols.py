"""Accuracy numbers people can compare: the evaluation protocols, pass@k and maj@k from samples drawn off one prefill,
95 % intervals and the paired test, each against hand-computed or textbook values."""

from __future__ import annotations

import sys
import types
from fractions import Fraction

import pytest
import torch
from conftest import refused, resolved

import grpo_demo
from grpo_kit import RecipeError, evaluation, generation, scoring, smoke

FMT = grpo_demo.ANSWER_FORMAT


@pytest.fixture(scope="module")
def rows():
    """(train, test) rows in the recipe's shape, solutions included, from generated GSM8K-format problems."""

    def shaped(problems):
        return [
            {
                "question": p["question"],
                "answer": grpo_demo.extract_hash_answer(p["answer"]),
                "solution": p["answer"],
                "prompt": grpo_demo.chat_prompt(p["question"]),
            }
            for p in problems
        ]

    return shaped(smoke.make_problems(64, seed=1)), shaped(smoke.make_problems(16, seed=2))


@pytest.fixture(scope="module")
def lively(tiny):
    """(tokenizer, model): the tiny model with large random weights, so that what it writes depends on every token
    and position of the prompt (the smoke model's small ones write the same token whatever it is shown)."""
    import copy

    tokenizer, model = tiny
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return tokenizer, model


# ----------------------------------------------------------------------------------------------------------------
# Protocols


@pytest.mark.parametrize(
    ("name", "completion", "gold", "strict", "lenient"),
    [
        ("chat", "So the answer is $\\boxed{18}$.", "18", True, True),
        ("chat", "\\boxed{18} is it, then 7", "7", False, False),  # a boxed number wins over later numbers
        ("chat", "\\boxed{5}? No: 2 + 5 = \\boxed{7}", "7", True, True),  # the last box is the answer
        ("chat", "\\boxed{A}: so 7", "7", False, True),  # a box without a number: the last number
        ("chat", "\\boxed{\u22125}", "-5", True, True),  # U+2212 MINUS SIGN is a minus in every protocol
        ("chat", "It fell 3\u20134 degrees: \u20137", "-7", False, True),  # an en dash too; between numbers, a range
        ("chat", "She works 3-4 hours", "-4", False, False),  # a hyphen between numbers is no sign
        ("recipe", "<answer>\n\u22125\n</answer>", "-5", True, True),
        ("recipe", "<answer>\n\u22125\n</answer>", "5", False, False),
        ("chat", "She pays 18 dollars.", "18", False, True),  # no box: the last number
        ("chat", "\\boxed{12", "12", False, True),  # an unclosed box is none
        ("recipe", "<reasoning>\n3 + 4\n</reasoning>\n<answer>\n7\n</answer>", "7", True, True),
        ("recipe", "The answer is 7", "7", False, True),
    ],
)
def test_each_protocol_reads_its_own_answer_form(name, completion, gold, strict, lenient, rows):
    protocol = scoring.build_protocol(name, FMT)
    scored = scoring.score(completion, gold, FMT, protocol)
    assert (scored["correct_strict"], scored["correct_lenient"]) == (strict, lenient)
    judged = scored["format_strict"] is not None
    assert judged == (name == "recipe")  # the format is the recipe's question only


def test_chat_asks_the_question_alone_and_recipe_asks_in_its_format():
    question = "Ava has 3 apples and gets 4 more. How many apples does Ava have now?"
    assert scoring.build_protocol("chat", FMT).prompt(question) == [{"role": "user", "content": question}]
    assert scoring.build_protocol("recipe", FMT).prompt(question) == grpo_demo.chat_prompt(question)
    with pytest.raises(ValueError, match="no evaluation protocol 'lm-eval'"):
        scoring.build_protocol("lm-eval", FMT)


# ----------------------------------------------------------------------------------------------------------------
# Statistics, against hand-computed and textbook values


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 5, 0.0),  # n = k, none correct
        (5, 1, 5, 1.0),  # n = k, one correct: it is always drawn
        (5, 2, 2, 0.7),  # 1 - C(3, 2) / C(5, 2) = 1 - 3/10
        (10, 3, 1, 0.3),  # pass@1 is the share correct
        (4, 4, 3, 1.0),
        (16, 1, 4, 0.25),  # 1 - C(15, 4) / C(16, 4) = 4/16
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert scoring.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_more_draws_than_samples():
    with pytest.raises(ValueError, match="0 < k <= n"):
        scoring.pass_at_k(4, 1, 5)


def test_majority_counts_votes_and_breaks_ties_by_the_first_sampled():
    assert scoring.majority([Fraction(3), None, Fraction(5), Fraction(5)]) == 5
    assert scoring.majority([Fraction(5), Fraction(3), Fraction(3), Fraction(5)]) == 5  # 2-2: 5 came first
    assert scoring.majority([None, Fraction(3), Fraction(5)]) == 3  # 1-1: 3 came first; no answer does not vote
    assert scoring.majority([None, None]) is None
    assert scoring.ks_for(8) == [1, 2, 4, 8] and scoring.ks_for(6) == [1, 2, 4, 6] and scoring.ks_for(1) == [1]


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [  # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no continuity correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_intervals_match_the_textbook(successes, n, low, high):
    assert scoring.wilson(successes, n) == pytest.approx((low, high), abs=1e-4)


@pytest.mark.parametrize(
    ("gained", "lost", "p"),
    [
        (9, 1, 22 / 1024),  # 2 x P(X <= 1), X ~ B(10, 1/2) = 2 x 11/1024
        (5, 5, 1.0),
        (0, 0, 1.0),  # nothing changed
        (6, 0, 2 / 64),
        (3, 12, 2 * (1 + 15 + 105 + 455) / 2**15),
    ],
)
def test_exact_mcnemar_against_hand_computed_binomials(gained, lost, p):
    assert scoring.mcnemar_exact(gained, lost) == pytest.approx(p)


def test_the_paired_comparison_lists_the_questions_that_flipped():
    before = [True, True, False, False, True, False]
    after = [True, False, True, True, True, True]
    result = scoring.paired(before, after)
    assert (result["gained"], result["lost"]) == ([2, 3, 5], [1])
    assert result["p_value"] == pytest.approx(2 * (1 + 4) / 16)
    assert result["verdict"] == "within chance (p >= 0.05)"
    assert scoring.paired([False] * 20, [True] * 20)["verdict"] == "a rise larger than chance (p < 0.05)"
    assert scoring.paired([True] * 3, [True] * 3)["verdict"] == "no question changed"


def test_sampling_summary_of_hand_made_samples():
    def sample(answer, correct):
        return {
            "answer_strict": answer,
            "answer_lenient": answer,
            "correct_strict": correct,
            "correct_lenient": correct,
        }

    records = [
        {"gold": "7", "samples": [sample("7", True), sample("3", False), sample("3", False), sample("7", True)]},
        {"gold": "2", "samples": [sample(None, False), sample(None, False), sample("2", True), sample("5", False)]},
    ]
    summary = scoring.summarize_samples(records, 4, 0.9)
    strict = summary["strict"]
    assert strict["pass@1"]["value"] == pytest.approx((0.5 + 0.25) / 2)
    assert strict["pass@4"]["value"] == 1.0
    assert strict["pass@2"]["value"] == pytest.approx((1 - 1 / 6 + 1 - 3 / 6) / 2)  # C(2,2)/C(4,2), C(3,2)/C(4,2)
    assert strict["maj@1"]["value"] == 0.5  # 7: right; no answer: wrong
    assert strict["maj@2"]["value"] == 0.5  # 7 vs 3, a tie: 7 came first, right; no answers: wrong
    assert strict["maj@4"]["value"] == 1.0  # 7 vs 3: 7 first; 2 vs 5: 2 first; both right
    assert strict["maj@4"]["interval"] == pytest.approx(list(scoring.wilson(2, 2)))
    assert summary["samples"] == 4 and summary["temperature"] == 0.9


# ----------------------------------------------------------------------------------------------------------------
# Sampling: n continuations from one prefill


def separate_copies(model, tokenizer, prompts, samples, temperature, max_new_tokens, per_batch, seed):
    """`samples` copies of each prompt, each copy prefilled on its own by `generate` from its whole prompt, drawn in
    `generate_samples`' order (longest first, `per_batch` prompts a batch) from the same seed: the samples one shared
    prefill must reproduce."""
    encoded = generation.prompt_ids(tokenizer, prompts)
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    stops, pad = generation.stop_ids(model, tokenizer), generation.pad_id(tokenizer)
    texts = {}
    with torch.random.fork_rng(), torch.no_grad(), generation.own_generation_config(model, stops, pad):
        torch.manual_seed(seed)
        for start in range(0, len(order), per_batch):
            batch = order[start : start + per_batch]
            padded = generation.left_pad([encoded[i] for i in batch], pad)
            ids, mask = (t.repeat_interleave(samples, dim=0) for t in padded)
            settings = dict(max_new_tokens=max_new_tokens, eos_token_id=stops, pad_token_id=pad)
            full_softmax = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            output = model.generate(input_ids=ids, attention_mask=mask, **settings, **full_softmax)
            drawn = [generation.finished(r, stops, tokenizer).text for r in output[:, ids.shape[1] :].tolist()]
            texts.update({i: drawn[j * samples : (j + 1) * samples] for j, i in enumerate(batch)})
    return [texts[i] for i in range(len(prompts))]


def test_samples_from_one_prefill_per_prompt_are_those_of_separate_copies(lively, rows):
    tokenizer, model = lively
    prompts = [r["prompt"] for r in rows[1][:5]]
    calls = []

    def count(module, args, kwargs):  # a hook: replacing `forward` would hide its signature from `generate`
        calls.append(tuple(kwargs["input_ids"].shape))

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        shared = generation.generate_samples(model, tokenizer, prompts, 3, 1.0, 12, batch_size=6, seed=0)
    finally:
        hook.remove()
    prefills = [shape for shape in calls if shape[1] > 1]  # a whole prompt at once; decoding feeds one token
    assert [rows_ for rows_, _ in prefills] == [2, 2, 1]  # 5 prompts, 6 // 3 = 2 per batch, each prefilled once
    assert len(shared) == 5 and all(len(samples) == 3 for samples in shared)
    texts = [[s.text for s in samples] for samples in shared]
    assert texts == separate_copies(model, tokenizer, prompts, 3, 1.0, 12, per_batch=2, seed=0)  # draw for draw
    assert sum(len(set(own)) > 1 for own in texts) >= 3  # sampled at temperature 1: a prompt's samples differ


def test_samples_are_drawn_from_the_full_softmax_not_its_top_50(tiny):
    """A model whose next token is nearly uniform over its 516 tokens (output weights near zero; distinct logits,
    as top-k keeps every token tied with its k-th) samples far more than 50 distinct tokens: nothing prunes the
    distribution (transformers' `generate` keeps the top 50 unless told top_k=0)."""
    import copy

    tokenizer, model = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    with torch.no_grad():
        model.lm_head.weight.normal_(std=1e-3, generator=torch.Generator().manual_seed(0))
    assert model.config.vocab_size > 400
    drawn, generate = [], model.generate

    def recording(**kwargs):
        output = generate(**kwargs)
        drawn.extend(output[:, kwargs["input_ids"].shape[1] :].tolist())
        return output

    model.generate = recording
    generation.generate_samples(model, tokenizer, [FMT.chat_prompt("Ava has 3 apples.")], 8, 1.0, 32, 8, seed=0)
    stops = generation.stop_ids(model, tokenizer)
    tokens = {t for row in drawn for t in row[: generation.finished(row, stops, tokenizer).tokens]}  # to the end
    assert len(tokens) > 100  # of the 8 x 32 draws from ~516 equally likely tokens, some 200 distinct


def test_sampling_is_seeded_and_leaves_the_training_random_state_alone(lively, rows):
    tokenizer, model = lively
    prompts = [r["prompt"] for r in rows[1][:4]]
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = generation.generate_samples(model, tokenizer, prompts, 4, 1.0, 10, batch_size=8, seed=7)
    assert torch.equal(torch.rand(3), expected_next)  # training draws what it would have drawn
    second = generation.generate_samples(model, tokenizer, prompts, 4, 1.0, 10, batch_size=8, seed=7)
    assert [[g.text for g in s] for s in first] == [[g.text for g in s] for s in second]
    assert len({g.text for s in first for g in s}) > 1  # a random model at temperature 1: samples differ


def test_evaluate_with_samples_reports_pass_and_maj_beside_greedy(tiny, rows):
    tokenizer, model = tiny
    chat = scoring.build_protocol("chat", FMT)
    summary, records = evaluation.evaluate(
        model,
        tokenizer,
        rows[1][:6],
        FMT,
        max_new_tokens=8,
        batch_size=8,
        model_name="tiny",
        protocol=chat,
        samples=4,
        temperature=1.0,
        seed=0,
    )
    assert summary["protocol"] == "chat"
    assert summary["format_rate"] is None  # not a question this protocol asks
    assert set(summary["sampling"]["strict"]) == {"pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"}
    assert all(len(r["samples"]) == 4 and "correct_strict" in r["samples"][0] for r in records)
    expected = sum(sum(s["correct_lenient"] for s in r["samples"]) / 4 for r in records) / 6
    assert summary["sampling"]["lenient"]["pass@1"]["value"] == pytest.approx(expected)


def test_the_vllm_path_serves_every_protocol_and_samples(monkeypatch, tiny, rows):
    """vLLM is not installed here: a stand-in records what the recipe hands it (token ids, sampling parameters)."""
    tokenizer, _ = tiny
    handed = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def generate(self, requests, params):
            handed.append((requests, params.kwargs))
            n = params.kwargs.get("n", 1)
            out = types.SimpleNamespace(text="#### 7", token_ids=[1, 2], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[out] * n) for _ in requests]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    chat = scoring.build_protocol("chat", FMT)
    prompts = [chat.prompt(r["question"]) for r in rows[1][:3]]
    greedy, sampled = generation.generate_vllm(LLM(), tokenizer, prompts, 64, samples=5, temperature=0.7, seed=3)
    (greedy_requests, greedy_params), (sample_requests, sample_params) = handed
    assert (
        greedy_requests
        == sample_requests
        == [{"prompt_token_ids": ids} for ids in generation.prompt_ids(tokenizer, prompts)]
    )
    stop = {"max_tokens": 64, "stop_token_ids": [tokenizer.eos_token_id]}  # the tokenizer's end of a turn
    assert greedy_params == {"temperature": 0, **stop}
    assert sample_params == {"n": 5, "temperature": 0.7, "top_p": 1.0, "seed": 3, **stop}  # one request each
    assert len(greedy) == 3 and [len(s) for s in sampled] == [5, 5, 5]
    assert greedy[0] == generation.Generation("#### 7", 2, False)


def test_the_prefill_keeps_one_position_of_logits_and_the_models_own_sampling_defaults_stay_out(lively, rows):
    tokenizer, model = lively
    prompts = [r["prompt"] for r in rows[1][:4]]
    widths = []

    def logits_width(module, args, kwargs, output):
        if kwargs["input_ids"].shape[1] > 1:  # the prefill
            widths.append(output.logits.shape[1])

    hook = model.register_forward_hook(logits_width, with_kwargs=True)
    try:
        plain = generation.generate_samples(model, tokenizer, prompts, 4, 1.0, 10, batch_size=8, seed=3)
    finally:
        hook.remove()
    assert widths == [1, 1]  # not a vocabulary-wide row for every prompt token (GBs for a 150k vocabulary)
    model.generation_config.min_p = 0.9  # a model's own default: would prune the distribution reported as full
    model.generation_config.repetition_penalty = 1.5
    try:
        again = generation.generate_samples(model, tokenizer, prompts, 4, 1.0, 10, batch_size=8, seed=3)
        greedy = generation.generate_greedy(model, tokenizer, prompts, 10, batch_size=8)
        assert model.generation_config.min_p == 0.9  # handed back as it was
    finally:
        model.generation_config.min_p, model.generation_config.repetition_penalty = None, None
    assert [[g.text for g in s] for s in again] == [[g.text for g in s] for s in plain]
    assert greedy == generation.generate_greedy(model, tokenizer, prompts, 10, batch_size=8)


# ----------------------------------------------------------------------------------------------------------------
# What a user gets wrong, and what the reports refuse to mix


def test_pass_at_k_intervals_do_not_shrink_to_a_point():
    assert scoring.wilson(50 * 1.0, 50)[0] < 0.95  # a normal interval would say [100, 100]
    assert scoring.wilson(0, 20)[0] == 0.0  # exactly, not 7e-18


def test_prompts_that_do_not_fit_vllms_length_stop_before_it_starts(tiny, rows):
    from grpo_kit import evaluation

    tokenizer, _ = tiny
    recipe = scoring.build_protocol("recipe", FMT)
    args = types.SimpleNamespace(vllm_max_model_length=100, max_completion_length=48)
    with pytest.raises(RecipeError, match=r"The recipe protocol's longest prompt \(\d+ tokens\) and --max_completion"):
        evaluation.fits(tokenizer, [recipe], rows[1], args)
    evaluation.fits(tokenizer, [scoring.build_protocol("chat", FMT)], rows[1], args)  # a question alone fits


def test_a_temperature_without_samples_is_said_to_do_nothing(caplog):
    with caplog.at_level("WARNING", logger="grpo_demo"):
        grpo_demo.parse_settings(["--eval_temperature", "0.5"])
    assert "eval_temperature is the temperature of eval_samples, which is 0: no samples are drawn" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="grpo_demo"):
        grpo_demo.parse_settings(["--eval_temperature", "0.5", "--eval_samples", "4"])
    assert "no samples are drawn" not in caplog.text


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--eval_protocols", "gsm8k", "chat", "--eval_samples", "8"], "eval_protocols gsm8k chat and eval_samples 8"),
        (["--eval_samples", "4"], "eval_samples 4"),
        (["--eval_protocols", "recipe", "chat"], "eval_protocols recipe chat"),
    ],
)
def test_protocols_and_samples_without_the_final_evaluation_are_refused_before_anything_loads(extra, named):
    message = refused(["--smoke", "--final_eval", "false", *extra])
    assert message == (
        f"Invalid settings:\n  - {named} apply to the baseline and final evaluation, and final_eval=false makes "
        "neither: drop them, or --final_eval true (or measure the saved model after training: --eval_only "
        "--model_name_or_path <output_dir>)"
    )


def test_protocols_and_samples_stand_with_the_final_evaluation_or_eval_only(tmp_path):
    resolved(["--smoke", "--eval_protocols", "gsm8k_cot-chat", "--eval_samples", "4"])
    resolved(["--smoke", "--final_eval", "false", "--eval_protocols", "recipe"])  # the default: nothing lost
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    resolved(["--eval_only", "--model_name_or_path", str(model), "--final_eval", "false", "--eval_samples", "4"])


def test_the_table_names_each_protocols_reading_and_the_summary_keeps_the_first_prompt(tiny, rows, tmp_path, capsys):
    from grpo_kit import reports

    tokenizer, model = tiny
    chat = scoring.build_protocol("chat", FMT)
    summary, records = evaluation.evaluate(
        model, tokenizer, rows[1][:3], FMT, max_new_tokens=4, batch_size=4, model_name="tiny", protocol=chat
    )
    assert summary["first_prompt"] == tokenizer.apply_chat_template(
        [{"role": "user", "content": rows[1][0]["question"]}], tokenize=False, add_generation_prompt=True
    )
    reports.write_report(tmp_path, "baseline-chat", summary, records)
    table = capsys.readouterr().out
    assert "| accuracy, strict (\\boxed{}) |" in table and "| accuracy, boxed else last number |" in table
    assert "strict format" not in table  # not a question this protocol asks


def test_comparisons_set_side_by_side_only_what_was_measured_alike(tmp_path, caplog):
    from grpo_kit import reports

    records = [{"question": "q", "gold": "1", "completion": "1", "correct_strict": True, "correct_lenient": True}]

    def summary(**extra):
        base = {"n": 1, "accuracy_strict": 1.0, "accuracy_lenient": 1.0, "mean_completion_tokens": 1.0}
        return {**base, "truncated": 0, "model": "m", "seconds": 1, "max_new_tokens": 8, "protocol": "gsm8k", **extra}

    def sampled(temperature):
        metric = {"value": 1.0, "interval": [0.2, 1.0]}
        return {"samples": 2, "temperature": temperature, "seed": 42, "strict": {"pass@1": metric}}

    details = {"lm_eval": "0.4.13", "task": "gsm8k", "num_fewshot": 5, "apply_chat_template": False}
    reports.write_report(tmp_path, "baseline-gsm8k", summary(protocol_details=details, sampling=sampled(0.9)), records)
    reports.write_report(tmp_path, "final-gsm8k", summary(protocol_details=details, sampling=sampled(0.3)), records)
    comparison = reports.compare(tmp_path, "gsm8k")
    assert "strict/pass@1" not in comparison["change"] and "accuracy_strict" in comparison["change"]
    assert "drew other samples" in caplog.text
    other = {**details, "lm_eval": "0.4.14"}  # another lm-eval: its numbers are not set beside these
    reports.write_report(tmp_path, "final-gsm8k", summary(protocol_details=other), records)
    assert reports.compare(tmp_path, "gsm8k") is None
    assert "their gsm8k prompts differ" in caplog.text
    assert not (tmp_path / "eval" / "comparison-gsm8k.json").exists()
