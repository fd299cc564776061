"""Merging a LoRA adapter into its base: the merged model computes what base + adapter computes, in full precision,
and every mistake gets a message naming it."""

from __future__ import annotations

import json

import pytest
import torch

import grpo_demo
from grpo_kit import RecipeError, merge, smoke


@pytest.fixture
def adapter_run(tmp_path):
    """A base model folder and a LoRA adapter on it with non-zero B matrices, saved as a --use_peft run saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    fmt = grpo_demo.ANSWER_FORMAT
    tokenizer = smoke.build_tokenizer(smoke.corpus(fmt, smoke.make_problems(32)), fmt.tags)
    smoke.build_tiny_model(tokenizer).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    model = get_peft_model(model, LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.save_pretrained(tmp_path / "run")
    tokenizer.save_pretrained(tmp_path / "run")
    return tmp_path, model.eval(), tokenizer


def test_merge_gives_the_adapted_models_outputs_in_full_precision(adapter_run):
    from transformers import AutoModelForCausalLM

    folder, adapted, tokenizer = adapter_run
    merged_dir = merge.merge_adapter(folder / "run", folder / "merged")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert merged.dtype == torch.float32  # no CUDA here: fp32, as the recipe trains on a CPU
    assert getattr(merged.config, "quantization_config", None) is None
    assert (merged_dir / "tokenizer.json").is_file() and not (merged_dir / "adapter_config.json").exists()
    inputs = tokenizer("Ava has 3 apples and gets 4 more.", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(merged(**inputs).logits, adapted(**inputs).logits, rtol=1e-4, atol=1e-5)
        base = AutoModelForCausalLM.from_pretrained(folder / "base").eval()
        assert not torch.allclose(base(**inputs).logits, merged(**inputs).logits)  # the adapter is in it


def own_template(tokenizer) -> None:
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def added_token(tokenizer) -> None:
    tokenizer.add_tokens(["<scratchpad>"])


@pytest.mark.parametrize(
    ("edit", "saved_with_run", "kept"),
    [
        (own_template, True, "run"),  # a chat template the run set (a base model has none, or another)
        (added_token, True, "run"),  # a token the run added
        (None, False, "base"),  # an adapter saved without a tokenizer: the base's is the one it trained with
    ],
    ids=["chat-template", "added-token", "no-tokenizer"],
)
def test_merge_keeps_the_runs_tokenizer(adapter_run, tmp_path, edit, saved_with_run, kept):
    """The merged folder's tokenizer is the one saved with the adapter (what the run trained and evaluated with),
    not the base model's."""
    from transformers import AutoTokenizer

    folder, _, _ = adapter_run
    run = tmp_path / "adapter"
    run.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (run / name).write_bytes((folder / "run" / name).read_bytes())
    tokenizer = AutoTokenizer.from_pretrained(folder / "base")
    if edit:
        edit(tokenizer)
    if saved_with_run:
        tokenizer.save_pretrained(run)
    expected = AutoTokenizer.from_pretrained(run if kept == "run" else folder / "base")
    merged = AutoTokenizer.from_pretrained(merge.merge_adapter(run, tmp_path / "merged"))
    assert merged.chat_template == expected.chat_template
    assert merged.get_vocab() == expected.get_vocab()
    if edit:  # the run's differs from the base's
        base = AutoTokenizer.from_pretrained(folder / "base")
        assert (base.chat_template, base.get_vocab()) != (merged.chat_template, merged.get_vocab())


def test_merge_names_what_is_wrong_instead_of_a_traceback(adapter_run, tmp_path):
    folder, _, _ = adapter_run
    with pytest.raises(RecipeError, match="a full model .* already standalone: nothing to merge"):
        merge.merge_adapter(folder / "base", folder / "out")
    with pytest.raises(RecipeError, match="no adapter_config.json there"):
        merge.merge_adapter(tmp_path / "nowhere", folder / "out")
    with pytest.raises(RecipeError, match="--output must be another folder than --adapter"):
        merge.merge_adapter(folder / "run", folder / "run")
    with pytest.raises(RecipeError, match="no-such-model': no such folder. Give the base the adapter was trained on"):
        merge.merge_adapter(folder / "run", folder / "out", base=str(tmp_path / "no-such-model"))

    quantized = folder / "base-4bit"
    quantized.mkdir()
    config = json.loads((folder / "base" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeError, match="is a quantized checkpoint: a merge needs full-precision weights"):
        merge.merge_adapter(folder / "run", folder / "out", base=str(quantized))


def test_merge_never_writes_over_a_file_or_folder_and_names_a_broken_or_foreign_adapter(adapter_run, tmp_path):
    folder, _, _ = adapter_run
    weights = (folder / "base" / "model.safetensors").read_bytes()
    (tmp_path / "notes.txt").write_text("mine")
    for output, said in [
        (folder / "base", "another folder than the base model"),  # the base's weights
        (tmp_path / "notes.txt", "a file is there"),
        (folder, "a folder with files is there"),
        ("", "--output is empty"),
    ]:
        with pytest.raises(RecipeError, match=said):
            merge.merge_adapter(folder / "run", output, base=str(folder / "base"))
    assert (folder / "base" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "notes.txt").read_text() == "mine"

    cut = tmp_path / "cut"  # an adapter folder copied halfway: its config cut short
    cut.mkdir()
    (cut / "adapter_config.json").write_text((folder / "run" / "adapter_config.json").read_text()[:40])
    with pytest.raises(RecipeError, match="adapter_config.json cannot be read"):
        merge.merge_adapter(cut, tmp_path / "out")

    other = tmp_path / "other-base"  # another size: the adapter's matrices do not fit it
    fmt = grpo_demo.ANSWER_FORMAT
    model = smoke.build_tiny_model(smoke.build_tokenizer(smoke.corpus(fmt, smoke.make_problems(8)), fmt.tags))
    config = model.config
    config.hidden_size, config.intermediate_size = config.hidden_size * 2, config.intermediate_size * 2
    type(model)(config).save_pretrained(other)
    with pytest.raises(RecipeError, match="does not fit the base"):
        merge.merge_adapter(folder / "run", tmp_path / "out2", base=str(other))
    assert not (tmp_path / "out2").exists()
