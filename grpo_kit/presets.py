"""The offline presets, chosen in one place: `--smoke` (a few steps of a tiny model) and `--demo` (GRPO that learns).

A preset is a module with `DEFAULTS` (settings that sit between the recipe's constants and the user's YAML and
command line), `MODEL_DIRS` (where it writes its tiny model of each kind, `smoke.TINY_MODELS`) and `DATA_DIR` (its
generated problems), unless the user points elsewhere, and `prepare`, which writes them in the recipe's own answer
format. `--tiny_model` chooses the kind; the model folder, output folder and run name follow it (`defaults`).
"""

from __future__ import annotations

import sys
from types import ModuleType

from grpo_kit import demo, folders, smoke

PRESETS: dict[str, ModuleType] = {"smoke": smoke, "demo": demo}


def chosen(values: dict) -> ModuleType | None:
    """The preset the settings ask for (a flag of that name set true), None for a real run."""
    names = [name for name in PRESETS if values.get(name)]
    if len(names) > 1:
        sys.exit(f"--{' and --'.join(names)} are presets of their own: choose one")
    return PRESETS[names[0]] if names else None


def defaults(preset: ModuleType, tiny_model) -> dict:
    """The preset's settings with its tiny model of kind `tiny_model`: that model's folder, and an output folder and
    run name that name the kind unless it is the default one (`outputs/demo-GRPO`, `outputs/demo-llama3-GRPO`), so
    that a run of one kind never clears the other's."""
    kinds = smoke.TINY_MODELS
    kind = tiny_model if tiny_model in kinds else kinds[0]  # another value is refused by the parser, with the choices
    name = name_of(preset) + ("" if kind == kinds[0] else f"-{kind}")
    own = {"output_dir": f"outputs/{name}-GRPO", "run_name": f"{name}-GRPO-generated"}
    return {**preset.DEFAULTS, "model_name_or_path": preset.MODEL_DIRS[kind], **own}


def writes(preset: ModuleType | None, key: str, value) -> bool:
    """Whether `value` of setting `key` (model_name_or_path, dataset, output_dir) is one the preset writes itself,
    for a tiny model of any kind."""
    if preset is None:
        return False
    return any(value == defaults(preset, kind).get(key) for kind in smoke.TINY_MODELS)


def prepare(run, training_args, model_args, answer_format) -> None:
    """Build the chosen preset's tiny model and problems before anything reads them, and clear its own output
    folder for a new training run (`folders.clear_preset_folder`: only what a run of the preset wrote). Under
    `accelerate launch` every process gets here: the first writes, the others wait, then all read.

    A preset's model is tiny: torch gets one thread for the rest of the process. A second gains little on such
    matrices, and where the cores are busy with other work, threads waiting on each other made sampling 15-40x
    slower (measured on 2 shared cores).
    """
    import torch

    preset = chosen(vars(run))
    if preset is None:
        return
    torch.set_num_threads(1)
    fresh = not (run.eval_only or run.ask or training_args.resume_from_checkpoint)  # a new training run
    with training_args.main_process_first(local=False, desc="preset assets"):
        if training_args.process_index == 0:
            if fresh and writes(preset, "output_dir", training_args.output_dir):
                folders.clear_preset_folder(training_args.output_dir, name_of(preset))
            seed = getattr(preset, "ASSETS_SEED", training_args.seed)  # the demo's start model: one for every seed
            preset.prepare(answer_format, model_args.model_name_or_path, run.dataset, seed)


def name_of(preset: ModuleType) -> str:
    return next(name for name, module in PRESETS.items() if module is preset)
