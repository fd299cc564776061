"""The offline presets, as data: `--smoke` (a few steps of a tiny model) and `--demo` (GRPO that learns), their
settings (between the recipe's constants and the user's YAML and command line), the folders they write, and
building their assets (`prepare`) in the recipe's own answer format before anything reads them. Each preset's
assets are its module's (`smoke`, `demo`): `MODEL_DIRS` (its tiny model of each kind, `smoke.TINY_MODELS`, chosen
by `--tiny_model`), `DATA_DIR` (its generated problems) and `prepare`."""

import re
from pathlib import Path

from grpo_kit import RecipeError, demo, layout, runs, smoke

# What both presets set: nothing to report to, fp32 on a CPU, one micro-step per optimizer step, a short sample.
OFFLINE = dict(report_to=["none"], bf16=False, gradient_accumulation_steps=1, num_completions_to_print=1)
OFFLINE["activation_checkpointing"] = False  # nothing to save on a model this small
SETTINGS = {
    "smoke": dict(
        OFFLINE,
        dataset=smoke.DATA_DIR,
        max_steps=4,
        num_generations=4,
        per_device_train_batch_size=8,  # two prompts x four generations per step
        max_completion_length=48,
        save_steps=2,
        eval_every_steps=2,
        eval_subset=8,
        # Its model has random weights: it never ends a completion, so every one is cut at 48 tokens, and it rarely
        # writes a tag, so most steps earn nothing, by design. The truncation and no_signal checks would say so at
        # every run, findings on the preset's own model.
        health_checks_off=["truncation", "no_signal"],
    ),
    "demo": dict(
        OFFLINE,
        dataset=demo.DATA_DIR,
        learning_rate=3e-4,  # a tiny model fresh from a warm start: 5e-6 would take thousands of steps
        max_steps=40,
        num_generations=8,
        per_device_train_batch_size=64,  # 8 prompts x 8 generations per step
        max_completion_length=80,  # the longest solution (99 + 9, counting on) is 74 tokens with its end of turn
        save_steps=20,
        eval_every_steps=5,  # accuracy on eval_subset held-out problems every 5 steps, for the curves
        eval_subset=64,
    ),
}
ASSETS = {"smoke": smoke, "demo": demo}


def chosen(values: dict) -> str | None:
    """The preset the settings ask for (a flag of that name set true), None for a real run."""
    names = [name for name in SETTINGS if values.get(name)]
    if len(names) > 1:
        raise RecipeError(f"--{' and --'.join(names)} are presets of their own: choose one")
    return names[0] if names else None


def defaults(preset: str, tiny_model: str | None = None, variant: str | None = None) -> dict:
    """The preset's settings with its tiny model of kind `tiny_model`: that model's folder, and an output folder and
    run name that name the kind unless it is the default one (`outputs/demo-GRPO`, `outputs/demo-llama3-GRPO`), and
    the `variant` (a --config file's name: `outputs/demo-gspo-GRPO`), so that a run of one kind or objective never
    clears another's."""
    kinds = smoke.TINY_MODELS
    kind = tiny_model if tiny_model in kinds else kinds[0]  # another value is refused by the parser, with the choices
    name = preset + ("" if kind == kinds[0] else f"-{kind}") + (f"-{variant}" if variant else "")
    own = {"output_dir": f"outputs/{name}-GRPO", "run_name": f"{name}-GRPO-generated"}
    return {**SETTINGS[preset], "model_name_or_path": ASSETS[preset].MODEL_DIRS[kind], **own}


def variant_folder(preset: str | None, output_dir: str) -> bool:
    """Whether `output_dir` is one `defaults` names for a preset's run of a --config (`outputs/demo-gspo-GRPO`)."""
    kinds = "|".join(smoke.TINY_MODELS[1:])
    return bool(preset and re.fullmatch(rf"outputs/{preset}(-({kinds}))?-[\w.]+-GRPO", output_dir or ""))


def trained_model(preset: str | None, values: dict) -> str | None:
    """The model the preset's own training run saved in its output folder (a finished run), None where there is none."""
    folder = Path(values.get("output_dir") or "")
    finished = layout.path(folder, layout.STATE).is_file() and layout.weight_files(folder)
    return str(folder) if preset and finished else None


def keyed(preset: str | None, values: dict) -> dict:
    """The preset's asset folders (model_name_or_path, dataset) where `values` still name them, named for the terms
    they are built on (`smoke.keyed`): the tags (the tokenizer holds them, the demo's warm start writes them) and the
    smoke preset's seed (it draws the problems and the weights; the demo's is fixed). Two presets run at once on
    other terms never build into one folder."""
    if preset is None:
        return {}
    tags, seed = (values["reasoning_tag"], values["answer_tag"]), values["seed"] if preset == "smoke" else None
    plain = defaults(preset, values.get("tiny_model"))
    terms = {"model_name_or_path": dict(tags=tags, seed=seed), "dataset": dict(seed=seed)}
    return {key: smoke.keyed(plain[key], **terms[key]) for key in terms if values.get(key) == plain[key]}


def owned(preset: str | None, values: dict | None = None) -> dict[str, list]:
    """{setting: the values of it that the preset writes itself, for a tiny model of any kind, and on the terms of
    `values` (`keyed`)} (model_name_or_path, dataset, output_dir): paths that need not exist before the preset's run."""
    settings = [defaults(preset, kind) for kind in smoke.TINY_MODELS if preset]  # none for a real run
    found = {key: [d[key] for d in settings] for key in ("model_name_or_path", "dataset", "output_dir")}
    if preset and values and variant_folder(preset, values.get("output_dir")):
        found["output_dir"].append(values["output_dir"])
    if preset and values:
        for key, path in keyed(preset, {**values, **defaults(preset, values.get("tiny_model"))}).items():
            found[key].append(path)
    return found


def prepare(run, training_args, model_args, answer_format) -> None:
    """Build the chosen preset's tiny model and problems before anything reads them, and clear its own output folder for
    a new training run (`runs.clear_preset_folder`: only what a run of the preset wrote, never what this run reads).
    Under `accelerate launch` every process gets here: the first writes, the others wait, then all read. A preset's
    model is tiny: torch gets one thread for the rest of the process. A second gains little on such matrices, and
    where the cores are busy with other work, threads waiting on each other made sampling 15-40x slower (measured on
    2 shared cores)."""
    import torch

    if (preset := chosen(vars(run))) is None:
        return
    torch.set_num_threads(1)
    fresh = not (run.eval_only or run.ask or training_args.resume_from_checkpoint)  # a new training run
    with training_args.main_process_first(local=False, desc="preset assets"):
        if training_args.process_index == 0:
            mine = training_args.output_dir in owned(preset)["output_dir"]
            if fresh and (mine or variant_folder(preset, training_args.output_dir)):
                reads = {"model_name_or_path": model_args.model_name_or_path, "dataset": run.dataset}
                runs.clear_preset_folder(training_args.output_dir, preset, reads)
            seed = getattr(ASSETS[preset], "ASSETS_SEED", training_args.seed)  # the demo's start model: one for all
            terms = {**vars(run), "seed": training_args.seed, **defaults(preset, run.tiny_model)}
            own = keyed(preset, terms)  # built only where named for this run's terms: never another run's folder
            model, data = model_args.model_name_or_path, run.dataset
            ASSETS[preset].prepare(
                answer_format,
                model if model == own["model_name_or_path"] else None,
                data if data == own["dataset"] else None,
                seed,
            )
