"""Llama 3's chat conventions on the tiny Llama model: every tokenized prompt carries one BOS (data prep, training,
evaluation, vLLM), completions end at `<|eot_id|>` and count as finished, and the pad token is a token of its own.

The tiny Llama follows Llama 3 where recipes break (grpo_kit/smoke.py): its template writes `<|begin_of_text|>` and
its tokenizer would add another to encoded text, a turn ends with `<|eot_id|>` while the tokenizer's end of sequence
is `<|end_of_text|>`, and it ships no pad token. An untrained model is made to end its turn at a chosen token
(`end_turn_at`), as a trained one does, so that stopping is tested without training.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import run_recipe
from transformers import AutoTokenizer

import grpo_demo
from grpo_kit import RecipeError, demo, evaluation, generation, models, smoke

FMT = grpo_demo.ANSWER_FORMAT
BOS, EOT, END_OF_TEXT, PAD = "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"
TURN = 3  # the generated token that ends the turn in these tests


def recipe_tokenizer(folder, use_vllm: bool = False):
    """(tokenizer, training arguments) as the recipe loads them for the model in `folder`."""
    model_args = SimpleNamespace(model_name_or_path=str(folder), model_revision=None)
    training_args = SimpleNamespace(trust_remote_code=False, use_vllm=use_vllm, generation_kwargs=None)
    return models.load_tokenizer(model_args, training_args), training_args


def bos_count(ids, tokenizer) -> int:
    return list(ids).count(tokenizer.convert_tokens_to_ids(BOS))


def attended(input_ids, attention_mask) -> list[list[int]]:
    """Each row's tokens without its padding."""
    return [
        [t for t, m in zip(row, mask, strict=True) if m] for row, mask in zip(input_ids, attention_mask, strict=True)
    ]


def end_turn_at(model, tokenizer, n: int = TURN):
    """Make `model` end its turn with `<|eot_id|>` as its n-th generated token, and write no end token before it.
    Only generation (no gradient) is touched; the hook is returned, to be removed."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    ends = tokenizer.convert_tokens_to_ids([EOT, END_OF_TEXT, "<|eom_id|>"])
    state = {"step": 0}

    def hook(module, args, kwargs, output):
        if torch.is_grad_enabled():
            return output
        state["step"] = 1 if kwargs["input_ids"].shape[1] > 1 else state["step"] + 1  # the prefill makes token 1
        logits = output.logits[:, -1]
        logits[:, ends] = -1e9
        if state["step"] == n:
            logits[:, eot] = 1e9
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


@pytest.fixture(params=["as released", "generation config without <|eot_id|>"])
def llama_dir(request, tiny_llama_dir, tmp_path):
    """The tiny Llama as built, or with a generation config that lists only `<|end_of_text|>` (as Llama 3's first
    Instruct release had it): the recipe must stop at `<|eot_id|>` either way."""
    if request.param == "as released":
        return tiny_llama_dir
    folder = shutil.copytree(tiny_llama_dir, tmp_path / "llama-without-eot")
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    config["eos_token_id"] = [config["eos_token_id"][0]]  # <|end_of_text|> alone
    path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def rows(gsm8k_dir):
    return list(grpo_demo.get_gsm8k_questions("test", str(gsm8k_dir)))[:8]


# ----------------------------------------------------------------------------------------------------------------
# The tiny Llama is Llama 3 where it matters


def test_the_tiny_llama_has_llama3s_conventions_and_traps(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (BOS, END_OF_TEXT, None)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids([END_OF_TEXT, "<|eom_id|>", EOT])
    assert eot != tokenizer.eos_token_id  # the end of a turn is not the tokenizer's end of sequence

    text = tokenizer.apply_chat_template(
        FMT.chat_prompt(" Ava has 3 apples. "), add_generation_prompt=True, tokenize=False
    )
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\nRespond in the following format:\n<reasoning>"  # the system message, trimmed
    )
    assert text.endswith("Ava has 3 apples.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert bos_count(tokenizer(text)["input_ids"], tokenizer) == 2  # the trap: special tokens added to the template's
    assert models.end_of_turn(tokenizer) == EOT


def test_the_end_of_turn_is_read_from_the_template(tiny):
    assert models.end_of_turn(tiny[0]) == "<|im_end|>"  # ChatML


@pytest.mark.parametrize("kind", smoke.TINY_MODELS)
def test_each_template_writes_a_conversation_as_its_real_models_do(kind):
    """Each turn with the header, trimming and end its real model's template gives it (Qwen2.5's ChatML keeps the
    text as it is; Llama 3.1's trims it, dates the system header and starts with a BOS); encoding text adds a BOS
    only where the real tokenizer does (Llama 3)."""
    tokenizer = smoke.build_tokenizer(smoke.corpus(FMT, smoke.make_problems(8), kind), FMT.tags, kind=kind)
    turns = [{"role": "system", "content": " S "}, {"role": "user", "content": " Q? "}]
    prompt, reply = {
        "qwen2": (
            "<|im_start|>system\n S <|im_end|>\n<|im_start|>user\n Q? <|im_end|>\n<|im_start|>assistant\n",
            " A <|im_end|>\n",
        ),
        "llama3": (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nQ?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            "A<|eot_id|>",
        ),
    }[kind]
    assert tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False) == prompt
    answered = [*turns, {"role": "assistant", "content": " A "}]
    assert tokenizer.apply_chat_template(answered, tokenize=False) == prompt + reply
    plain = tokenizer("Ava has 3 apples.", add_special_tokens=False)["input_ids"]
    bos = [tokenizer.convert_tokens_to_ids(BOS)] if kind == "llama3" else []
    assert tokenizer("Ava has 3 apples.")["input_ids"] == bos + plain


def test_without_a_generation_config_the_models_config_names_the_end_tokens(tiny_llama_dir, tmp_path, caplog):
    """A model folder with no generation_config.json: generation reads the model's config, whose eos_token_id lists
    `<|eot_id|>` here, so nothing changes; where it names only `<|end_of_text|>`, the turn's end becomes the end of
    sequence."""
    folder = shutil.copytree(tiny_llama_dir, tmp_path / "no-generation-config")
    (folder / "generation_config.json").unlink()
    with caplog.at_level("WARNING", logger="grpo_demo"):
        assert recipe_tokenizer(folder)[0].eos_token == END_OF_TEXT
    assert not caplog.text
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": config["eos_token_id"][0]}))
    with caplog.at_level("WARNING", logger="grpo_demo"):
        assert recipe_tokenizer(folder)[0].eos_token == EOT
    assert "ends a turn with <|eot_id|>, which neither its tokenizer's end of sequence" in caplog.text


# ----------------------------------------------------------------------------------------------------------------
# One BOS in every tokenized prompt


def test_data_prep_counts_each_prompt_with_the_template_and_one_bos(tiny_llama_dir, gsm8k_dir, caplog):
    tokenizer, _ = recipe_tokenizer(tiny_llama_dir)
    data = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))
    ids = generation.prompt_ids(tokenizer, data["prompt"])
    assert all(row[0] == tokenizer.bos_token_id and bos_count(row, tokenizer) == 1 for row in ids)
    lengths = sorted(len(row) for row in ids)
    with caplog.at_level("INFO", logger="grpo_demo"):
        kept = grpo_demo.drop_long_prompts(data, tokenizer, max_tokens=lengths[-1] - 1)
    assert f"Prompts: 64 rows, {lengths[0]}-{lengths[-1]} tokens" in caplog.text
    assert len(kept) == sum(n < lengths[-1] for n in lengths)  # the cap applies to the tokens the model gets


def train_one_step(model_dir, gsm8k_dir, output_dir):
    """One GRPO step of the recipe (its settings, tokenizer, rewards) on `model_dir`, which ends each turn at its
    TURN-th token; (trainer, the prompt rows handed to generation, the rows of the loss forward)."""
    from trl import GRPOTrainer

    argv = [
        "--model_name_or_path", str(model_dir), "--dataset", str(gsm8k_dir), "--output_dir", str(output_dir),
        "--report_to", "none", "--max_steps", "1", "--warmup_steps", "0", "--save_strategy", "no",
        "--log_completions", "false",
        "--num_generations", "4", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
        "--max_completion_length", "8", "--activation_checkpointing", "false",
    ]  # fmt: skip
    _, args, model_args = grpo_demo.parse_settings(argv)
    tokenizer = models.load_tokenizer(model_args, args)
    args.model_init_kwargs = models.init_kwargs(model_args)
    train = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))
    trainer = GRPOTrainer(
        model=str(model_dir),
        processing_class=tokenizer,
        reward_funcs=grpo_demo.REWARD_FUNCS,
        args=args,
        train_dataset=train,
    )
    model, prompts, sequences = trainer.model, [], []
    generate = model.generate

    def recording_generate(*a, **kwargs):
        prompts.extend(attended(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()))
        return generate(*a, **kwargs)

    def record_loss_inputs(module, args, kwargs):
        if torch.is_grad_enabled():
            sequences.extend(attended(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()))

    model.generate = recording_generate
    end_turn_at(model, tokenizer)
    model.register_forward_pre_hook(record_loss_inputs, with_kwargs=True)
    trainer.train()
    return trainer, prompts, sequences


def test_a_grpo_step_on_llama_has_one_bos_and_completions_that_end_at_the_end_of_turn(llama_dir, gsm8k_dir, tmp_path):
    trainer, prompts, sequences = train_one_step(llama_dir, gsm8k_dir, tmp_path / "run")
    tokenizer = trainer.processing_class
    bos, eot = tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids(EOT)
    # The prompts TRL generates from (and would hand to vLLM) are the evaluation's, BOS once, at the start.
    data = grpo_demo.get_gsm8k_questions("train", str(gsm8k_dir))
    assert len(prompts) == 8 and {tuple(p) for p in prompts} <= {
        tuple(p) for p in generation.prompt_ids(tokenizer, data["prompt"])
    }
    assert all(p[0] == bos and bos_count(p, tokenizer) == 1 for p in prompts)
    # The training batch: prompt and completion, BOS once, the completion ending at <|eot_id|>, nothing after it.
    assert len(sequences) == 8
    for sequence in sequences:
        assert sequence[:-TURN] in prompts and bos_count(sequence, tokenizer) == 1
        assert sequence[-1] == eot
    # TRL counted them finished, not truncated.
    logged = trainer.state.log_history[0]
    assert logged["completions/clipped_ratio"] == 0
    assert logged["completions/mean_length"] == logged["completions/mean_terminated_length"] == TURN


def test_evaluation_and_ask_have_one_bos_and_stop_at_the_end_of_turn(llama_dir, rows, tmp_path):
    from transformers import AutoModelForCausalLM

    tokenizer, _ = recipe_tokenizer(llama_dir)
    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    end_turn_at(model, tokenizer)
    handed, generated, generate = [], [], model.generate

    def recording_generate(*a, **kwargs):
        handed.extend(attended(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()))
        output = generate(*a, **kwargs)
        generated.append(output[:, kwargs["input_ids"].shape[1] :])
        return output

    model.generate = recording_generate
    summary, records = evaluation.evaluate(
        model, tokenizer, rows, FMT, max_new_tokens=16, batch_size=4, model_name=str(llama_dir)
    )
    assert sorted(handed) == sorted(generation.prompt_ids(tokenizer, [r["prompt"] for r in rows]))
    assert all(p[0] == tokenizer.bos_token_id and bos_count(p, tokenizer) == 1 for p in handed)
    assert [(r["completion_tokens"], r["truncated"]) for r in records] == [(TURN, False)] * len(rows)
    assert summary["truncated"] == 0 and EOT not in records[0]["completion"]

    handed.clear()
    generation.sample(model, tokenizer, rows[0]["prompt"], max_new_tokens=16, seed=0)  # --ask
    assert handed == generation.prompt_ids(tokenizer, [rows[0]["prompt"]])
    assert generated[-1].shape[1] == TURN and generated[-1][0, -1] == tokenizer.convert_tokens_to_ids(EOT)


def test_vllm_is_handed_the_same_ids_and_told_to_stop_at_the_end_of_turn(llama_dir, rows, monkeypatch):
    """vLLM is not installed here: a stand-in records what the recipe hands it (generation.generate_vllm)."""
    tokenizer, _ = recipe_tokenizer(llama_dir)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    handed = {}

    class LLM:
        def __init__(self, **kwargs):
            handed["engine"] = kwargs

        def generate(self, prompts, params):
            handed.update(prompts=prompts, params=params)
            done = SimpleNamespace(text="<reasoning>", token_ids=[7, 8, eot], finish_reason="stop")
            return [SimpleNamespace(outputs=[done]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=LLM, SamplingParams=lambda **kwargs: kwargs))
    prompts = [r["prompt"] for r in rows]
    generations, _ = generation.generate_vllm(generation.vllm_engine(str(llama_dir)), tokenizer, prompts, 16)
    ids = [p["prompt_token_ids"] for p in handed["prompts"]]
    assert ids == generation.prompt_ids(tokenizer, prompts)
    assert all(p[0] == tokenizer.bos_token_id and bos_count(p, tokenizer) == 1 for p in ids)
    # vLLM stops at the generation config's end tokens and its own tokenizer's; the recipe's end of sequence is added.
    assert handed["params"]["stop_token_ids"] == [tokenizer.eos_token_id]
    assert eot in [
        tokenizer.eos_token_id,
        *json.loads((llama_dir / "generation_config.json").read_text())["eos_token_id"],
    ]
    assert [(g.tokens, g.truncated) for g in generations] == [(3, False)] * len(rows)


def test_a_turn_end_no_stop_token_names_becomes_the_end_of_sequence(llama_dir, caplog):
    with caplog.at_level("WARNING", logger="grpo_demo"):
        tokenizer, training_args = recipe_tokenizer(llama_dir, use_vllm=True)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    if llama_dir.name == "llama-without-eot":
        assert tokenizer.eos_token == EOT
        assert (
            "ends a turn with <|eot_id|>, which neither its tokenizer's end of sequence (<|end_of_text|>)"
            in caplog.text
        )
        assert training_args.generation_kwargs == {"stop_token_ids": [eot]}  # vLLM reads its own tokenizer
    else:  # the generation config lists it: nothing to change
        assert tokenizer.eos_token == END_OF_TEXT and training_args.generation_kwargs is None and not caplog.text


# ----------------------------------------------------------------------------------------------------------------
# A pad token of its own


@pytest.mark.parametrize("kind", smoke.TINY_MODELS)
def test_the_pad_token_is_no_token_of_a_prompt_a_completion_or_an_end(kind, tmp_path):
    train, test = demo.make_problems(400, 100)
    tokenizer = demo.build_tokenizer(FMT, train, kind)
    smoke.build_tiny_model(tokenizer, kind=kind).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    tokenizer, _ = recipe_tokenizer(tmp_path)
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id
    assert tokenizer.pad_token == {"qwen2": "<|endoftext|>", "llama3": PAD}[kind]
    configured = GenerationConfig.from_pretrained(tmp_path).eos_token_id
    ends = {tokenizer.eos_token_id, *([configured] if isinstance(configured, int) else configured)}
    seen = {token for prompt, target, _ in demo.examples(tokenizer, FMT, train + test) for token in prompt + target}
    assert pad not in seen | ends  # no prompt, no warm-start completion, no end of generation uses it
    assert pad in tokenizer.all_special_ids


def test_a_tokenizer_without_a_reserved_pad_pads_with_its_end_of_sequence(tiny):
    import copy

    tokenizer = copy.deepcopy(tiny[0])
    tokenizer.pad_token = None
    assert models.set_pad_token(tokenizer).pad_token == tokenizer.eos_token
    assert models.set_pad_token(copy.deepcopy(tiny[0])).pad_token == "<|endoftext|>"  # a pad it has is kept


@pytest.mark.parametrize(("kind", "end"), [("qwen2", "<|im_end|>"), ("llama3", EOT)])
def test_warm_start_targets_end_where_a_turn_ends_after_prompts_with_one_bos(kind, end):
    train, _ = demo.make_problems(50, 10)
    tokenizer = demo.build_tokenizer(FMT, train, kind)
    triples = demo.examples(tokenizer, FMT, train)
    assert all(target[-1] == tokenizer.convert_tokens_to_ids(end) for _, target, _ in triples)
    assert all(bos_count(prompt, tokenizer) == (kind == "llama3") for prompt, _, _ in triples)


@pytest.mark.slow  # the recipe in a subprocess
@pytest.mark.parametrize("mode", [["--max_steps", "1", "--warmup_steps", "0"], ["--eval_only"]])
def test_a_base_model_without_a_chat_template_is_named_not_a_traceback(mode, base_model_dir, gsm8k_dir, tmp_path):
    args = ["--model_name_or_path", str(base_model_dir), "--dataset", str(gsm8k_dir), *mode, "--report_to", "none"]
    done = run_recipe([*args, "--output_dir", str(tmp_path / "run")], tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stdout
    assert (
        f"The model '{base_model_dir}' has no chat template (a base model?): the recipe prompts a chat model with a "
        "system and a user message. Use an instruct model (e.g. Qwen/Qwen2.5-1.5B-Instruct), or give this one a chat "
        "template (chat_template.jinja, or chat_template in its tokenizer_config.json)"
    ) in done.stdout


NO_SYSTEM = (  # as Gemma 1 and Mistral's first templates did
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
DROPS_SYSTEM = "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
FOLDS_SYSTEM = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # into the user's turn, as Gemma 2's does


def tokenizer_folder(tiny_dir, tmp_path, template=None, template_only=False, extra_tokens=0):
    folder = tmp_path / "model"
    shutil.copytree(tiny_dir, folder)
    if template_only:  # what transformers then builds is a tokenizer of a special token or two, and no vocabulary
        config = json.loads((folder / "tokenizer_config.json").read_text())
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
        config = {"tokenizer_class": "Qwen2Tokenizer", "chat_template": config.get("chat_template") or FOLDS_SYSTEM}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template is not None or extra_tokens:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.chat_template = template or tokenizer.chat_template
        tokenizer.add_tokens([f"<extra_{i}>" for i in range(extra_tokens)])
        tokenizer.save_pretrained(folder)
        (folder / "chat_template.jinja").write_text(tokenizer.chat_template)
    return folder


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"template": NO_SYSTEM}, "cannot render the recipe's prompt (System role not supported): the recipe's format"),
        ({"template": "{% if %}"}, "cannot render the recipe's prompt ("),  # not valid jinja
        ({"template": DROPS_SYSTEM}, "drops the system message"),
        ({"template_only": True}, "is empty (no tokenizer.json"),  # the template and tokenizer_config.json alone
        ({"extra_tokens": 40}, "would index beyond its embeddings"),  # added tokens the model has no rows for
    ],
)
def test_a_tokenizer_the_recipe_cannot_prompt_with_is_named_before_anything_runs(tiny_dir, tmp_path, change, said):
    folder = tokenizer_folder(tiny_dir, tmp_path, **change)
    args = SimpleNamespace(model_name_or_path=str(folder), model_revision="main")
    with pytest.raises(RecipeError, match=re.escape(said)):
        models.load_tokenizer(args, SimpleNamespace(trust_remote_code=False))


def test_a_template_that_folds_the_system_message_into_the_users_turn_is_taken(tiny_dir, tmp_path):
    folder = tokenizer_folder(tiny_dir, tmp_path, template=FOLDS_SYSTEM)
    args = SimpleNamespace(model_name_or_path=str(folder), model_revision="main")
    assert models.load_tokenizer(args, SimpleNamespace(trust_remote_code=False)).chat_template == FOLDS_SYSTEM
