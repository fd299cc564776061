"""The demo's model is first-class: `--demo --ask` and `--demo --eval_only` use the model the demo trained where
there is one (and say which); a preset's run of a --config file trains in a folder of its own; a protocol whose
prompts do not fit the model's positions is refused, with the reason, instead of scored."""

import logging
import shutil

import pytest
from conftest import resolved

import grpo_demo
from grpo_kit import RecipeError, evaluation, presets
from grpo_kit.scoring import build_protocol

pytestmark = pytest.mark.usefixtures("single_process")
WARM = "outputs/demo-assets/warm-qwen2"


def trained_folder(path, model_dir) -> None:
    """What a finished run leaves that says so: a saved model, and its state."""
    shutil.copytree(model_dir, path)
    (path / "trainer_state.json").write_text('{"global_step": 40}')


@pytest.mark.parametrize("asked", [["--ask", "What is 48 + 8?"], ["--eval_only"]])
def test_the_demos_questions_go_to_the_model_it_trained(asked, tmp_path, tiny_dir, caplog):
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        before = resolved(["--demo", *asked])
    assert before.model_name_or_path == WARM  # nothing trained yet: the start model, and said so
    assert "the start model (no trained one in outputs/demo-GRPO yet: --demo trains it there)" in caplog.text

    trained_folder(tmp_path / "outputs" / "demo-GRPO", tiny_dir)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grpo_demo"):
        after = resolved(["--demo", *asked])
    assert after.model_name_or_path == "outputs/demo-GRPO"
    assert "the model --demo trained, in outputs/demo-GRPO" in caplog.text
    named = resolved(["--demo", *asked, "--model_name_or_path", WARM])  # named: that one
    assert named.model_name_or_path == WARM


def test_a_presets_run_of_a_config_trains_in_a_folder_of_its_own(tmp_path):
    root = grpo_demo.__file__.rsplit("/", 1)[0]
    run = resolved(["--demo", "--config", f"{root}/configs/gspo.yaml"])
    assert (run.output_dir, run.run_name) == ("outputs/demo-gspo-GRPO", "demo-gspo-GRPO-generated")
    assert resolved(["--demo"]).output_dir == "outputs/demo-GRPO"  # the plain demo's folder is another
    assert presets.variant_folder("demo", "outputs/demo-gspo-GRPO")
    assert presets.variant_folder("demo", "outputs/demo-llama3-dr_grpo-GRPO")
    assert not presets.variant_folder("demo", "outputs/demo-GRPO") and not presets.variant_folder("demo", "runs/x")
    assert "outputs/demo-gspo-GRPO" in presets.owned("demo", vars(run))["output_dir"]  # the preset's: cleared


def test_a_protocol_past_the_models_positions_is_refused_with_the_reason(tiny):
    tokenizer, model = tiny  # 512 positions
    rows = [{"question": "Ava has 3 shells and finds 4 more. How many shells does Ava have now?", "answer": "7"}]
    protocol = build_protocol("recipe", grpo_demo.ANSWER_FORMAT)
    evaluation.fit_positions(model, tokenizer, [protocol], rows, 64)  # fits: nothing said
    with pytest.raises(RecipeError) as stop:
        evaluation.fit_positions(model, tokenizer, [protocol], rows, 500)
    message = str(stop.value)
    assert message.startswith(
        "Cannot measure in recipe (its longest prompt "
    ) and "+ 500 new): past the model's 512" in (message)
    assert "Choose another --eval_protocols" in message


def test_the_readmes_demo_question_is_one_the_demo_model_was_taught_to_read():
    """The demo's model reads the two phrasings its problems use (`gets N more`, `gave N of them away`) and nothing
    else: asked in other words (`finds 8 more`) it answers noise, so the README's example must be in one of them."""
    import re

    from conftest import ROOT

    from grpo_kit import demo

    asked = re.search(r'--demo --ask "([^"]+)"', (ROOT / "README.md").read_text(encoding="utf-8")).group(1)
    train, test = demo.make_problems(2000, 256, seed=0)
    phrasings = {re.sub(r"\d+", "N", row["question"]) for row in train + test}
    assert re.sub(r"\d+", "N", asked) in phrasings, asked
