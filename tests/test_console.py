"""What a run prints: the line per logged step, the settings it opens with, where it wrote, and the library
warnings it filters (each by its text, nothing else)."""

import logging
import warnings
from types import SimpleNamespace

from grpo_kit import console

CORRECT = {"rewards/correctness_reward_func/mean": 2.0}  # health.reward_roles of the recipe's rewards


def test_a_logged_step_is_one_line_of_what_a_person_watches():
    logs = {"reward": 3.375, "rewards/correctness_reward_func/mean": 1.375, "completions/mean_length": 28.2,
            "completions/clipped_ratio": 0.03125, "learning_rate": 2.9e-4, "step_time": 2.094, "loss": 0.1}  # fmt: skip
    line = console.step_line(10, 40, logs, CORRECT)
    assert line == "step 10/40  reward 3.375  correct 69 %  length 28 (3 % cut)  lr 0.00029  2.09 s/step"
    assert (
        console.step_line(1, 4, {"loss": 0.0}, CORRECT) == "step 1/4  reward -  correct - %  length -  lr -  - s/step"
    )
    reused = {"loss": 0.0, "learning_rate": 2.2e-4, "step_time": 0.47}  # steps_per_generation: no rollout this step
    assert console.step_line(18, 40, reused, CORRECT, rollout=17) == (
        "step 18/40  on the completions sampled at step 17  lr 0.00022  0.47 s/step"
    )


def test_a_run_opens_with_its_model_objective_precision_and_batch_arithmetic():
    args = SimpleNamespace(per_device_train_batch_size=16, gradient_accumulation_steps=4, world_size=2,
                           num_generations=16, bf16=True, fp16=False, max_steps=-1, num_train_epochs=1.0,
                           loss_type="dapo", scale_rewards="group", beta=0.0, importance_sampling_level="sequence",
                           learning_rate=5e-6, output_dir="outputs/Qwen-1.5B-GRPO", max_completion_length=786,
                           save_steps=100, temperature=0.9, top_p=1.0, top_k=0, min_p=None,
                           repetition_penalty=1.0)  # fmt: skip
    model = SimpleNamespace(model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct", dtype="float32", use_peft=False)
    lines = console.settings_summary(None, args, model, 7473).splitlines()
    assert lines == [
        "GRPO on GSM8K: Qwen/Qwen2.5-1.5B-Instruct -> outputs/Qwen-1.5B-GRPO",
        "  objective  loss dapo, scale_rewards group, beta 0, importance sampling per sequence, lr 5e-06",
        "  precision  weights float32, compute bf16 autocast",
        "  batch      8 prompts x 16 generations = 128 completions per step (16 per device x 4 accumulation x 2 "
        "processes), up to 786 tokens each",
        "  length     1 epoch(s) on 7473 prompts; checkpoints every 100 steps",
        "  decoding   rollouts at temperature 0.9, top_p 1, top_k 0, min_p 0, repetition_penalty 1; evaluations "
        "greedy; the model's generation_config.json for its end tokens only",
    ]
    args.steps_per_generation = 4  # TRL's default: gradient_accumulation_steps, one generation batch per step
    assert len(console.settings_summary(None, args, model, 7473).splitlines()) == 6
    args.gradient_accumulation_steps, args.steps_per_generation = 1, 16  # the GSPO preset's 16 on the demo's 1
    said = console.settings_summary(None, args, model, 7473).splitlines()
    assert said[4] == "  rollouts   one generation batch serves 16 optimizer steps (steps_per_generation)"


def test_the_closing_lines_name_only_what_the_run_wrote(tmp_path):
    (tmp_path / "curves.png").write_bytes(b"png")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "comparison.json").write_text("{}")
    (tmp_path / "run_record.json").write_text("{}")
    assert console.where_written(tmp_path, saved_model=False).splitlines() == [
        f"Written to {tmp_path}:",
        f"  curves       {tmp_path / 'curves.png'}",
        f"  evaluations  {tmp_path / 'eval' / 'comparison.json'}",
        f"  run record   {tmp_path / 'run_record.json'}",
    ]
    assert f"  model        {tmp_path}" in console.where_written(tmp_path, saved_model=True)


def test_only_the_named_library_lines_are_filtered():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        console.quiet_libraries()  # after the reset: as a run sets them
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, 1)
        for name in ("enable", "disable"):  # TRL turns checkpointing off and on around every rollout
            message = f"`gradient_checkpointing_{name}` is deprecated and will be removed in v6. Use `activation_..."
            warnings.warn(message, FutureWarning, 1)
        warnings.warn("`something_else` is deprecated", FutureWarning, 1)
    assert [str(w.message) for w in caught] == ["`something_else` is deprecated"]

    class Kept(logging.Handler):
        said: list[str] = []

        def emit(self, record):
            self.said.append(record.getMessage())

    trainer_log, kept = logging.getLogger("transformers.trainer"), Kept()
    trainer_log.addHandler(kept)
    try:
        trainer_log.warning("There were missing keys in the checkpoint model loaded: ['lm_head.weight'].")
        trainer_log.warning("There were missing keys in the checkpoint model loaded: ['model.norm.weight'].")
    finally:
        trainer_log.removeHandler(kept)
    assert kept.said == ["There were missing keys in the checkpoint model loaded: ['model.norm.weight']."]


def test_the_ask_hint_keeps_what_shapes_the_prompt_and_names_the_saved_model():
    from grpo_kit.runs import ask_command

    argv = ["grpo_demo.py", "--demo", "--seed", "3", "--reasoning_tag", "think", "--config", "c.yaml", "--max_steps=9"]
    assert ask_command("outputs/demo-c-GRPO", "What is 2 + 2?", argv) == (
        "python grpo_demo.py --demo --reasoning_tag think --config c.yaml --model_name_or_path outputs/demo-c-GRPO "
        "--ask 'What is 2 + 2?'"
    )
    assert ask_command("out", "Q?", ["grpo_demo.py", "--smoke", "true", "--tiny_model=llama3"]) == (
        "python grpo_demo.py --smoke true --tiny_model=llama3 --model_name_or_path out --ask 'Q?'"
    )


def test_the_bar_is_closed_at_the_last_step_before_the_final_evaluation_prints(monkeypatch):
    """In a terminal the final table printed while the bar stood ran into it (`4/4 [00:02]GSM8K, baseline vs...`)."""
    import tqdm.auto

    bars = []

    class Bar:
        def __init__(self, total, initial, **kwargs):
            self.n, self.closed = initial, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    callbacks = []
    trainer = SimpleNamespace(remove_callback=lambda kind: None, add_callback=callbacks.append)
    console.install(trainer, CORRECT)
    (shown,) = callbacks
    state = SimpleNamespace(is_world_process_zero=True, max_steps=4, global_step=0)
    shown.on_train_begin(None, state, None)
    for step in (1, 2, 3):
        state.global_step = step
        shown.on_step_end(None, state, None)
    assert not bars[0].closed
    state.global_step = 4
    shown.on_step_end(None, state, None)
    assert bars[0].closed and bars[0].n == 4


def test_lm_evals_warnings_of_the_trainers_own_model_are_filtered_and_its_truncation_is_not():
    class Kept(logging.Handler):
        said: list[str] = []

        def emit(self, record):
            self.said.append(record.getMessage())

    console.quiet_libraries()
    hf_log, kept = logging.getLogger("lm_eval.models.huggingface"), Kept()
    hf_log.addHandler(kept)
    try:
        hf_log.warning("`pretrained` model kwarg is not of type `str`. Many other model arguments may be ignored.")
        hf_log.warning("Passed an already-initialized model through `pretrained`, assuming single-process call")
        hf_log.warning("Left truncation applied. Original sequence length was 483, truncating to last 256 tokens.")
    finally:
        hf_log.removeHandler(kept)
    assert kept.said == ["Left truncation applied. Original sequence length was 483, truncating to last 256 tokens."]


def test_under_deepspeed_the_summary_says_no_autocast_runs(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    args = SimpleNamespace(per_device_train_batch_size=16, gradient_accumulation_steps=4, world_size=8,
                           num_generations=16, bf16=True, fp16=False, max_steps=10, num_train_epochs=1.0,
                           loss_type="dapo", scale_rewards="group", beta=0.0, importance_sampling_level="token",
                           learning_rate=5e-6, output_dir="o", max_completion_length=786, save_steps=100,
                           temperature=0.9, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0)  # fmt: skip
    model = SimpleNamespace(model_name_or_path="m", dtype="bfloat16", use_peft=False)
    precision = console.settings_summary(None, args, model, 100).splitlines()[2]
    assert precision == "  precision  weights bfloat16, compute bf16 (DeepSpeed ZeRO-3's weights, no autocast)"
