"""Refusing, before anything loads, what could not run: the resolved settings (each check a small function of them
yielding one line per problem, naming the setting and a value that works), then, once the data is read and before
the weights load, the data, LoRA targets and disk (`before_the_weights`). Checks that TRL or transformers also make
are repeated only where they would otherwise fail late (after the model has loaded) or without naming a fix."""

import logging
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from grpo_kit import RecipeError, layout, runs
from grpo_kit.data import split_files
from grpo_kit.models import GPU_EXTRAS, cuda_available, installed_version, shapes_only, world_size, zero_stage
from grpo_kit.smoke import TINY_MODELS

logger = logging.getLogger("grpo_demo")

VLLM_RANGE = ("0.22.0", "0.31.0")  # the versions TRL 1.16 accepts (trl/import_utils.py, is_vllm_available)
FLOAT_DTYPES = ("bfloat16", "float16", "float32")
CLIPPING = {"epsilon_high": None, "epsilon": 0.2, "importance_sampling_level": "token"}  # TRL's defaults
# transformers' optimizers that bitsandbytes implements (OptimizerNames): 8-bit states, paged memory.
BNB_OPTIMIZERS = {
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "lion_8bit", "lion_32bit",
    "paged_lion_32bit", "paged_lion_8bit", "ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
}  # fmt: skip

# The values TRL 1.16 takes for settings it reads only once the trainer is built or at the first step, after the
# model loaded and the baseline evaluation ran: those its GRPOTrainer compares them with (trl/trainer/grpo_trainer.py;
# tests/test_settings.py reads them from the installed source). The vLLM ones matter only with --use_vllm.
TRL_CHOICES = {
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    "scale_rewards": ("group", "batch", "none"),  # true / false: settings.resolve makes them group / none
    "importance_sampling_level": ("token", "sequence"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}
TRL_VLLM_CHOICES = {
    "vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}

# Settings checked one at a time, {name: (ok, rule)}: "name=value: rule" where not ok(value); None (a default) is not
# checked. A chained comparison is false for NaN, and `< math.inf` for infinity too.
AT_LEAST_ONE = (lambda x: x > 0, "must be at least 1")
COUNTS = {
    **dict.fromkeys(("gradient_accumulation_steps", "save_steps", "logging_steps"), AT_LEAST_ONE),
    **dict.fromkeys(("eval_subset", "eval_batch_size", "eval_limit"), AT_LEAST_ONE),
    "validation_rows": (lambda x: x >= 0, "the train rows held out for validation, 0 or more"),
    "warm_start_rows": (lambda x: x >= 0, "the train rows of the supervised warm start, 0 (none) or more"),
}
RANGES = {
    "eval_every_steps": (lambda x: x >= 0, "0 turns in-training accuracy off, N > 0 runs it"),
    "seed": (lambda x: 0 <= x < 2**32, "must be from 0 to 2**32 - 1 (numpy's range)"),
    # What transformers, TRL or PEFT would refuse only after the model loaded (or never, training on NaN).
    "weight_decay": (lambda x: 0 <= x < math.inf, "must be a finite number, 0 or more (the recipe uses 0.1)"),
    "adam_beta1": (lambda x: 0 <= x < 1, "must be in [0, 1) (the recipe uses 0.9)"),
    "adam_beta2": (lambda x: 0 <= x < 1, "must be in [0, 1) (the recipe uses 0.99)"),
    "adam_epsilon": (lambda x: 0 < x < math.inf, "must be positive"),
    "max_grad_norm": (lambda x: 0 <= x < math.inf, "must be a finite number, 0 or more (the recipe uses 0.1)"),
    "warmup_steps": (lambda x: 0 <= x < math.inf, "must be 0 or more: a fraction below 1, or a number of steps"),
    "num_train_epochs": (lambda x: -math.inf < x < math.inf, "must be a finite number"),
    "top_p": (lambda x: 0 < x <= 1, "must be in (0, 1]"),
    "top_k": (lambda x: x >= 0, "must be 0 (off) or more"),
    "min_p": (lambda x: 0 <= x <= 1, "must be in [0, 1] (a share of the likeliest token's probability)"),
    "repetition_penalty": (lambda x: 0 < x < math.inf, "must be positive (1.0 is none)"),
    **dict.fromkeys(("steps_per_generation", "num_iterations"), AT_LEAST_ONE),
    # TRL refuses under 2 too, but divides by it first (grpo_config.py __post_init__): 0 would be a ZeroDivisionError
    "num_generations": (
        lambda x: x >= 2,
        "GRPO compares completions within a group, so it needs at least 2 (the recipe uses 16)",
    ),
    "epsilon": (lambda x: 0 < x < math.inf, "must be positive (TRL's clipping range, 0.2)"),
    "lora_dropout": (lambda x: 0 <= x < 1, "must be in [0, 1)"),
    "beta": (lambda x: 0 <= x < math.inf, "must be 0 (no KL) or more"),
    "warm_start_learning_rate": (lambda x: 0 < x < math.inf, "must be a positive number (the recipe uses 5e-5)"),
}

# Sampling divides the logits by the temperature: far below 0.01 the quotient overflows (fp32 and bf16 alike end
# near 3.4e38, so at 1e-40 every logit is inf and sampling fails on NaN probabilities), and well before that sampling
# is greedy in all but name (a logit gap of 0.1 is already e^10 apart) and the policy's gradients grow as 1 / T.
MIN_TEMPERATURE = 0.01
# AdamW moves each weight by about the learning rate a step: above 0.01 a step rewrites a weight of ~0.02 entirely,
# and a rate like 5e6 (for 5e-6) makes the first update non-finite.
MAX_LEARNING_RATE = 1e-2
# Below 1e-9 a step is under fp32's spacing at a typical weight (~2e-9 at 0.02): the weights do not move at all.
MIN_LEARNING_RATE = 1e-9


def learning_rate_and_temperatures(v: dict) -> Iterator[str]:
    """A learning rate within AdamW's sane range (a flipped exponent named); temperatures sampling can divide by."""
    if (rate := v["learning_rate"]) is not None and not 0 < rate <= MAX_LEARNING_RATE:
        exponent = math.floor(math.log10(rate)) if 0 < rate < math.inf else 0
        flipped = float(f"{rate / 10 ** (2 * exponent):.6g}")  # the exponent's sign flipped: 5e6 -> 5e-06
        typo = f"; did you mean {flipped:g}?" if exponent > 0 and flipped <= MAX_LEARNING_RATE else ""
        yield f"learning_rate={rate}: must be positive and at most {MAX_LEARNING_RATE:g} (the recipe uses 5e-6){typo}"
    elif rate is not None and rate < MIN_LEARNING_RATE:
        yield f"learning_rate={rate}: below {MIN_LEARNING_RATE:g} no weight moves, the run would train nothing"
    for name, default in (("temperature", " (the recipe uses 0.9)"), ("eval_temperature", "")):
        if (t := v.get(name)) is not None and not 0 < t < math.inf:
            yield f"{name}={t}: sampling needs a positive temperature{default}"
        elif t is not None and t < MIN_TEMPERATURE:
            yield (
                f"{name}={t}: below {MIN_TEMPERATURE} sampling is greedy in effect, and the logits divided by it "
                f"overflow (to inf near 1e-38): use {MIN_TEMPERATURE} or more{default}"
            )


def problems(v: dict, *, n_rewards: int, own: dict) -> list[str]:
    """Every problem with the settings `v` that shows before anything loads (`own`: paths a preset writes itself)."""
    found = (sizes(v), groups_and_rewards(v, n_rewards), local_paths(v, own), output_folder(v, own))
    found += (lora_and_bitsandbytes(v), generation(v), evaluation_processes(v), measuring(v))
    found += (learning_rate_and_temperatures(v), trl_values(v), changes_the_weights(v))
    return [line for lines in found for line in lines]


def reward_roles(reward_funcs: list, roles: dict) -> Iterator[str]:
    """REWARD_ROLES against REWARD_FUNCS: a line for each reward and none for another, each a role ("correct": pays
    for the right answer; "format") and the most it pays (health checks and the console's share divide by it)."""
    names = [getattr(func, "__name__", repr(func)) for func in reward_funcs]
    for name in names:
        if name not in roles:
            yield f'REWARD_ROLES has no line for {name}: add "{name}": ("correct" or "format", the most it pays)'
    for name, declared in roles.items():
        role, top = declared if isinstance(declared, tuple) and len(declared) == 2 else (None, None)
        if name not in names:
            yield f"REWARD_ROLES names {name}, which REWARD_FUNCS does not hold: remove its line, or add the reward"
        elif role not in ("correct", "format"):
            yield f'REWARD_ROLES["{name}"] = {declared!r}: a role and a maximum, ("correct" or "format", e.g. 2.0)'
        elif isinstance(top, bool) or not isinstance(top, (int, float)) or not 0 < top < math.inf:
            yield f'REWARD_ROLES["{name}"]: its maximum {top!r} must be a positive number, the most it pays'


def trl_values(v: dict) -> Iterator[str]:
    """Values TRL or transformers would refuse only after the model loaded (TRL_CHOICES); report_to by
    transformers' own check, which runs when the trainer is built."""
    choices = {**TRL_CHOICES, **(TRL_VLLM_CHOICES if v["use_vllm"] else {})}
    for name, allowed in choices.items():
        if v.get(name) is not None and v[name] not in allowed:
            listed = ", ".join(str(a) for a in allowed if isinstance(a, str))
            yield f"{name}={v[name]}: TRL {'' if name in TRL_CHOICES else 'with vLLM '}takes one of {listed}"
    from transformers.integrations import get_reporting_integration_callbacks

    given = [v["report_to"]] if isinstance(v["report_to"], str) else list(v["report_to"] or [])
    try:
        get_reporting_integration_callbacks([name for name in given if name not in ("none", "all")])
    except ValueError as err:
        yield f"report_to={' '.join(given)}: {str(err).rstrip('.')} (or none)"


def changes_the_weights(v: dict) -> Iterator[str]:
    """A run that trains but could not move a weight: its only step at learning rate 0 (warmup starts at 0),
    rewards weighted by nothing (every advantage 0) or by a NaN or infinity, LoRA adapters scaled by 0."""
    warmup, schedule = v["warmup_steps"] or 0, str(v["lr_scheduler_type"])
    no_warmup = ("constant", "reduce_lr_on_plateau")  # transformers' schedules that take no warmup
    if runs.trains(v) and v["max_steps"] == 1 and warmup > 0 and schedule.split(".")[-1].lower() not in no_warmup:
        yield (
            f"max_steps=1 with warmup_steps={warmup:g}: warmup starts at learning rate 0, so the one step would "
            "move no weight: add --warmup_steps 0"
        )
    weights = v["reward_weights"]
    if weights is not None and not all(-math.inf < w < math.inf for w in weights):
        yield f"reward_weights={weights}: each weight must be a finite number"
    elif weights is not None and not any(weights):
        yield f"reward_weights={weights}: all zero, every completion would score 0 and nothing trains"
    if v["use_peft"] and v["lora_alpha"] is not None and v["lora_alpha"] <= 0:
        yield (
            f"lora_alpha={v['lora_alpha']}: the adapters' output is scaled by lora_alpha / lora_r, so at 0 or less "
            "they would not train (the recipe uses 64)"
        )


def _outside(v: dict, rules: dict) -> list[str]:
    return [f"{n}={v[n]}: {rule}" for n, (ok, rule) in rules.items() if v.get(n) is not None and not ok(v[n])]


def sizes(v: dict) -> Iterator[str]:
    for name in ("max_completion_length", "max_prompt_tokens", "per_device_train_batch_size"):
        if v[name] is None or v[name] <= 0:
            yield f"{name}={v[name]}: must be a positive number of tokens or completions"
    yield from _outside(v, COUNTS)
    if v["eval_split"] == "validation" and v["validation_rows"] <= 0:
        yield (
            "eval_split=validation measures the train rows --validation_rows holds out: set how many "
            "(e.g. --validation_rows 500), or --eval_split test"
        )
    yield from _outside(v, RANGES)
    if v["eval_only"] and v["ask"] is not None:
        yield "eval_only and ask are two modes: choose one"
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")  # accelerate launch under FSDP
    if v.get("warm_start_rows") and runs.trains(v) and (zero_stage() or fsdp):
        yield (  # accelerate refuses a second Accelerator with a DeepSpeed plugin: the warm start's, then GRPO's
            "warm_start_rows under DeepSpeed or FSDP: the warm start and GRPO would be two trainers in one process, "
            "which accelerate refuses there; warm-start in a run of its own (python grpo_demo.py ... --warm_start_rows "
            "N --max_steps 1 --warmup_steps 0 --final_eval false), then launch GRPO from its <output_dir>/warm-start"
        )
    if not runs.trains(v) and v["resume_from_checkpoint"]:
        yield (
            "resume_from_checkpoint is for training: to evaluate or ask a checkpoint, "
            "--model_name_or_path <run>/checkpoint-N"
        )
    steps, epochs = v["max_steps"], v["num_train_epochs"]
    if runs.trains(v) and (steps == 0 or steps < -1 or (steps == -1 and epochs <= 0)):
        yield (
            f"max_steps={steps}, num_train_epochs={epochs}: this run would train nothing "
            "(max_steps N > 0, or -1 with num_train_epochs > 0)"
        )
    if v["ask"] is not None and not v["ask"].strip():
        yield 'ask is empty: give the question to answer, --ask "A train leaves at 3 pm..."'


def groups_and_rewards(v: dict, n_rewards: int) -> Iterator[str]:
    """Groups that fill the generation batch (TRL checks this too, naming generation_batch_size, which the user did
    not set, and no value that works); a weight per reward; two different tags, each one word to TRL and tokenizer."""
    n_gen, per_device = v["num_generations"], v["per_device_train_batch_size"]
    processes, steps = world_size(), v["steps_per_generation"] or v["gradient_accumulation_steps"]
    batch = v["generation_batch_size"] or (per_device or 0) * processes * steps
    if (n_gen or 0) >= 2 and (per_device or 0) > 0 and batch % n_gen:  # under 2: RANGES says so
        yield (
            f"generation batch {batch} completions (per_device_train_batch_size {per_device} x {processes} process(es)"
            f" x {steps} steps) is not divisible by num_generations={n_gen}: "
            f"use --per_device_train_batch_size {n_gen} (one prompt's completions per device step)"
        )
    if v["reward_weights"] is not None and (given := len(v["reward_weights"])) != n_rewards:
        yield f"reward_weights has {given} values for {n_rewards} rewards: give {n_rewards}"
    for n in ("reasoning_tag", "answer_tag"):
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", v[n]):
            yield f"{n}={v[n]!r}: a tag's name is a letter, then letters, digits, '_' or '-' (e.g. think, for <think>)"
    if v["reasoning_tag"] == v["answer_tag"]:
        yield f"reasoning_tag and answer_tag are both {v['answer_tag']!r}: the two blocks need different tags"


def local_paths(v: dict, own: dict) -> Iterator[str]:
    dataset, model, resume = v["dataset"], v["model_name_or_path"], v["resume_from_checkpoint"]
    if dataset and dataset not in own.get("dataset", ()) and not split_files(dataset, "train"):
        yield (
            f"dataset={dataset}: no train.jsonl there, nor the Hub's main/train-*.parquet (a GSM8K copy in either "
            "layout, or leave it unset)"
        )
    folder = Path(model).expanduser()
    # A Hub id is `org/name`: a path with more parts, or under a folder that exists here, is a local path.
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or Path(*folder.parts[:1]).is_dir()
    if not model.strip():
        yield "model_name_or_path is empty: name a local model folder or a Hub id (org/name)"
    elif looks_local and model not in own.get("model_name_or_path", ()) and not folder.is_dir():
        yield f"model_name_or_path={model}: no such folder (a local model folder or a Hub id)"
    elif folder.is_dir() and not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):
        found = layout.checkpoints(folder)
        hint = f": its newest checkpoint is {found[-1]}" if found else " (a saved model or adapter folder)"
        yield f"model_name_or_path={model}: no model in it, no config.json or adapter_config.json{hint}"
    elif folder.is_dir() and (cut := [p.name for p in sorted(folder.glob("*.safetensors")) if not runs.whole(p)]):
        yield f"model_name_or_path={model}: {', '.join(cut)} truncated or damaged (a copy or download cut short?)"
    if resume and resume not in runs.RESUME_LATEST and not Path(resume).is_dir():
        yield f"resume_from_checkpoint={resume}: no such folder (a checkpoint-N folder, or 'latest')"
    elif resume and resume not in runs.RESUME_LATEST and (missing := runs.missing_parts(resume)):
        found = [p for p in layout.checkpoints(Path(resume).parent) if not runs.missing_parts(p)]
        other = f"; the newest complete one is {found[-1]}" if found else ""
        yield f"resume_from_checkpoint={resume}: incomplete, without {', '.join(missing)}{other}"


def output_folder(v: dict, own: dict) -> Iterator[str]:
    """The output folder can be written; a training run never writes over another run's files or checkpoints (a preset
    restarts its own folder), and an evaluation is written only beside a run or a model (--ask writes nothing)."""
    output_dir, path = v["output_dir"], Path(v["output_dir"]).expanduser()
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    training_in, evaluating_in = runs.trains(v) and path.is_dir(), v["eval_only"] and path.is_dir()
    a_model = any((path / name).is_file() for name in ("config.json", "adapter_config.json"))
    if not output_dir or not str(output_dir).strip():
        yield "output_dir is empty: name a folder for checkpoints and results (--output_dir outputs/my-run)"
    elif path.exists() and not path.is_dir():
        yield f"output_dir={output_dir}: a file is there, not a folder: choose another --output_dir"
    elif not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        yield f"output_dir={output_dir}: {existing} cannot be written to: choose another --output_dir"
    elif training_in and path.resolve() == Path(v["model_name_or_path"]).expanduser().resolve():
        yield f"output_dir={output_dir} is the start model's folder: training would overwrite it; choose another"
    elif (training_in or (evaluating_in and not a_model)) and not layout.path(path, layout.RECORD).is_file():
        # Without a run record, only what a run alone makes (checkpoints, evaluations): not a model, not notes.
        others = sorted(p.name for p in path.iterdir() if not any(p.match(x) for x in layout.RUN_ONLY_ENTRIES))
        whose, why = ("a run's", "which a run would write over") if training_in else ("a run's or a model's", "")
        if others:
            yield (
                f"output_dir={output_dir} holds files that are not {whose} ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}){why and ', ' + why}: choose another --output_dir"
            )
    found = layout.checkpoints(output_dir)  # incomplete ones too: they belong to a run as well
    resume, ours = v["resume_from_checkpoint"], output_dir in own.get("output_dir", ())
    if found and runs.trains(v) and not resume and not ours:
        yield (
            f"output_dir={output_dir} already holds {found[-1].name}: resume it ({runs.resume_command()}), "
            "or start a new run with another --output_dir"
        )
    elif runs.trains(v) and resume and resume not in runs.RESUME_LATEST and not ours and path.is_dir():
        # a checkpoint of another folder continued here: only into a folder that holds no run of its own
        source = Path(resume).expanduser().resolve().parent
        held = [
            p.name for p in (*found[-1:], layout.path(path, layout.RECORD), path / "model.safetensors") if p.exists()
        ]
        continued = (layout.read_record(path) or {}).get("continues")  # this run, stopped before its first save
        again = not found and continued and Path(continued).resolve() == Path(resume).expanduser().resolve()
        if source != path.resolve() and (held or a_model) and not again:
            yield (
                f"output_dir={output_dir} holds another run ({', '.join(held) or 'a model'}), which resuming "
                f"{resume} there would write over: resume it in its own folder (--output_dir {source}), or continue "
                "it into an empty --output_dir"
            )


def lora_and_bitsandbytes(v: dict) -> Iterator[str]:
    """LoRA's rank; what bitsandbytes runs (a quantized base: QLoRA; an 8-bit or paged optimizer), where it can."""
    if v["use_peft"] and v["lora_r"] is not None and v["lora_r"] <= 0:
        yield f"lora_r={v['lora_r']}: the adapter's rank must be at least 1 (the recipe uses 16)"
    bits = [name for name in ("load_in_4bit", "load_in_8bit") if v[name]]
    if len(bits) == 2:  # ModelConfig refuses too, naming neither setting: "You can't use 8 bit and 4 bit precision"
        yield "load_in_4bit and load_in_8bit are both set: choose one (--load_in_4bit is QLoRA)"
    for name in bits if len(bits) == 1 else []:
        if not v["use_peft"]:
            yield (
                f"{name}: a quantized base model cannot be trained itself, only adapters on it: "
                f"add --use_peft (QLoRA), or drop --{name} to train the full model"
            )
        if not cuda_available():
            yield (
                f"{name} needs a CUDA GPU (bitsandbytes' quantized kernels) and this machine has none: "
                f"drop --{name} and train LoRA in full precision with --use_peft alone"
            )
        elif installed_version("bitsandbytes") is None:
            yield (
                f"{name} needs bitsandbytes, which is not installed: {GPU_EXTRAS} "
                "(or drop it and train LoRA in full precision with --use_peft alone)"
            )
        if zero_stage() == "3" and name == "load_in_8bit":
            yield "load_in_8bit does not shard under DeepSpeed ZeRO-3: use --load_in_4bit, or ZeRO-2"
        if zero_stage() == "3" and name == "load_in_4bit" and v["bnb_4bit_quant_storage"] not in FLOAT_DTYPES:
            yield (
                "load_in_4bit under DeepSpeed ZeRO-3 packs the 4-bit weights in a float dtype so they can be "
                "sharded: add --bnb_4bit_quant_storage bfloat16"
            )
        if v.get("warm_start_rows"):
            yield (
                f"warm_start_rows with {name}: the warm start fine-tunes every weight in full precision (about 16 "
                "bytes a parameter with AdamW), which a quantized base cannot: it is for small models, which need no "
                f"quantization; drop --warm_start_rows, or --{name} where full fine-tuning fits"
            )
        if v["use_vllm"]:
            # trl/generation/vllm_generation.py syncs weights by merge_adapter() / unmerge_adapter(), which for a
            # bitsandbytes base dequantizes, adds and requantizes through the CPU (peft/tuners/lora/bnb.py): every
            # step adds requantization noise to the frozen base.
            yield (
                f"{name} with use_vllm: every weight sync would merge the adapter into the quantized base and "
                "requantize it, so the frozen base drifts each step: drop --use_vllm (generate with transformers), "
                f"or drop --{name} (LoRA on the bf16 base works with vLLM)"
            )
    # A bitsandbytes optimizer (configs/unsloth_llama8b_qlora.yaml's) fails only at the first step, saying neither.
    if (optim := str(v["optim"])) in BNB_OPTIMIZERS and not cuda_available():
        yield (
            f"optim={optim} is a bitsandbytes optimizer, for CUDA GPUs, and this machine has none: "
            "--optim adamw_torch (the recipe's AdamW)"
        )
    elif optim in BNB_OPTIMIZERS and installed_version("bitsandbytes") is None:
        yield f"optim={optim} needs bitsandbytes, which is not installed: {GPU_EXTRAS} (or --optim adamw_torch)"


def generation(v: dict) -> Iterator[str]:
    """How completions are generated: with vLLM, installed and set up to run; with continuous batching, only where
    it keeps the weights. trl 1.16 casts the whole model to bf16 (fp16) in place before every continuous-batching
    generation (grpo_trainer.py, `_generate_single_turn`: `unwrapped_model.to(torch.bfloat16)`), which throws away
    fp32 weights, and the fp32 adapters PEFT makes even on a half-precision base."""
    if v["use_vllm"]:
        from packaging.version import Version

        version, (low, high) = installed_version("vllm"), VLLM_RANGE
        if version is None:
            yield (
                f"use_vllm: vllm is not installed: {GPU_EXTRAS} (CUDA only), "
                "or drop --use_vllm to generate with transformers"
            )
        elif not Version(low) <= Version(Version(version).base_version) <= Version(high):
            yield f"use_vllm: vllm {version} is installed, TRL 1.16 works with {low} to {high}: {GPU_EXTRAS}"
        elif not cuda_available():
            yield "use_vllm needs a CUDA GPU and this machine has none: drop --use_vllm"
        if v["vllm_mode"] not in ("colocate", "server"):
            yield (
                f"vllm_mode={v['vllm_mode']}: 'colocate' (vLLM inside each training process) or 'server' "
                "(a separate `trl vllm-serve`)"
            )
        if (utilization := v["vllm_gpu_memory_utilization"]) is not None and not 0 < utilization < 1:
            yield (
                f"vllm_gpu_memory_utilization={utilization}: the share of each GPU vLLM may take, between 0 and 1 "
                "(0.3 beside training leaves the rest to the model, its gradients and the optimizer)"
            )
    half = "bfloat16" if v["bf16"] else "float16" if v["fp16"] else None
    if v["use_transformers_continuous_batching"] and half and (v["use_peft"] or v["dtype"] != half):
        yield (
            f"use_transformers_continuous_batching: TRL casts the model to {half} in place before each such "
            "generation, which would drop this run's fp32 weights (or fp32 LoRA adapters): generate with vLLM "
            "(--use_vllm) or with transformers' generate (the default)"
        )


def evaluation_processes(v: dict) -> Iterator[str]:
    """What evaluation can do under several processes (it runs collectively: each process a shard)."""
    if world_size() > 1 and v["ask"] is not None:
        yield (
            "ask answers one question in one process: start it with python, not accelerate launch "
            "(under ZeRO-3 a model loaded by one process alone would wait for the others forever)"
        )
    elif (world_size() > 1 or zero_stage() == "3") and (tasks := lm_eval_tasks(v)):
        after = "" if v["eval_only"] else "after training, "
        data = f" --dataset {v['dataset']}" if v.get("dataset") else ""
        yield (
            f"eval_protocols {' '.join(tasks)}: lm-eval runs its tasks on one whole model in one process, and this "
            f"launch has {world_size()} processes{' under ZeRO-3' if zero_stage() == '3' else ''}: measure "
            f"{after}with python grpo_demo.py --eval_only --model_name_or_path {v['output_dir']} --eval_protocols "
            f"{' '.join(tasks)}{data} (python, not accelerate launch), or leave them out of this launch"
        )
    elif world_size() > 1 and v["eval_only"]:
        if v["use_vllm"]:
            yield (
                "eval_only with use_vllm runs one vLLM engine, in one process: start it with python, not accelerate "
                "launch (vLLM spreads over GPUs itself: --vllm_tensor_parallel_size N)"
            )
        if zero_stage() == "3":
            yield (
                "eval_only under DeepSpeed ZeRO-3 would shard the weights it only reads: launch it with "
                "--config_file configs/ddp.yaml (each process evaluates its share of the questions on a full copy)"
            )


def lm_eval_tasks(v: dict) -> list[str]:
    """The protocols of `eval_protocols` that lm-eval runs (grpo_kit/harness.py)."""
    from grpo_kit.harness import PROTOCOLS

    return [name for name in v.get("eval_protocols") or [] if name in PROTOCOLS]


def measuring(v: dict) -> Iterator[str]:
    """How the run is measured: the evaluation's protocols, samples and temperature; the health checks."""
    from grpo_kit import harness, scoring
    from grpo_kit.health import CHECKS

    known = (*scoring.PROTOCOLS, *harness.PROTOCOLS)
    if unknown := [name for name in v.get("eval_protocols") or [] if name not in known]:
        yield f"eval_protocols: {', '.join(unknown)}: no such protocol (the protocols: {', '.join(known)})"
    if (tasks := lm_eval_tasks(v)) and v["eval_split"] == "validation":
        yield (
            f"eval_protocols {' '.join(tasks)}: lm-eval's tasks measure GSM8K's test split, and eval_split is "
            "validation: measure the validation rows in recipe or chat, or the test split with --eval_split test"
        )
    if v.get("eval_max_gen_toks") is not None and v["eval_max_gen_toks"] < 1:
        yield f"eval_max_gen_toks={v['eval_max_gen_toks']}: lm-eval's max_gen_toks is at least 1 (default: 256)"
    if v["eval_samples"] < 0:
        yield f"eval_samples={v['eval_samples']}: 0 (greedy only) or the samples per question for pass@k"
    unmeasured = [f"eval_protocols {' '.join(p)}" for p in [v.get("eval_protocols") or []] if set(p) - {"recipe"}]
    unmeasured += [f"eval_samples {v['eval_samples']}"] if v["eval_samples"] > 0 else []
    if runs.trains(v) and not v["final_eval"] and unmeasured:
        yield (
            f"{' and '.join(unmeasured)} apply to the baseline and final evaluation, and final_eval=false makes "
            "neither: drop them, or --final_eval true (or measure the saved model after training: --eval_only "
            "--model_name_or_path <output_dir>)"
        )
    yield from held_out(v)
    if unknown := [name for name in v.get("health_checks_off") or [] if name not in (*CHECKS, "all")]:
        yield f"health_checks_off: {', '.join(unknown)}: no such check (the checks: {', '.join(CHECKS)}; or all)"


def held_out(v: dict) -> Iterator[str]:
    """`--eval_only --eval_split validation` of a model this recipe trained: the rows `--validation_rows` holds out
    are "never trained on" only where its run held out as many or more (the draw is one: fewer are among them). Its
    run record says: beside the model, or beside a checkpoint's folder."""
    folder, n = Path(v["model_name_or_path"]).expanduser(), v["validation_rows"]
    if not (v["eval_only"] and v["eval_split"] == "validation" and folder.is_dir()):
        return
    run_dir, record = layout.run_of(folder), layout.path(layout.run_of(folder), layout.RECORD)
    trained = ((layout.read_record(run_dir) or {}).get("settings") or {}).get("run", {}).get("validation_rows")
    if trained is None and layout.path(run_dir, layout.STATE).is_file():
        logger.warning(
            "eval_split=validation: %s has no run record (%s): whether it trained on the rows --validation_rows %d "
            "holds out cannot be told, and they are called held out on its word",
            folder, record, n,
        )  # fmt: skip
    if isinstance(trained, int) and trained < n:
        which = "every one of them" if trained == 0 else f"all but {trained} of them"
        yield (
            f"eval_split=validation: {folder} was trained with validation_rows={trained} (its run record, {record}), "
            f"so of the {n} train rows --validation_rows {n} holds out it trained on "
            f"{which}: measure the test split (--eval_split test)"
            + (f", or the rows its run held out (--validation_rows {trained})" if trained else "")
        )


def updates_per_generation(v: dict) -> float:
    """Optimizer steps each generation batch serves (TRL's steps_per_generation or generation_batch_size, over the
    accumulation), times num_iterations: above 1, the policy has moved since it sampled, and its ratio leaves 1."""
    accumulation, steps = v["gradient_accumulation_steps"], v["steps_per_generation"]
    if steps is None and v["generation_batch_size"]:
        steps = v["generation_batch_size"] / (v["per_device_train_batch_size"] * world_size())
    return (steps or accumulation) / accumulation * v["num_iterations"]


def warnings(v: dict) -> Iterator[str]:
    """Settings that work but are probably not what the user wants: one line each."""
    if runs.trains(v) and v.get("save_strategy") == "no":
        yield (
            "save_strategy=no: no checkpoint of the last step, so a run stopped in its final evaluation or before its "
            "model is saved cannot be resumed to them (a stop signal still saves its step)"
        )
    if v.get("eval_temperature") is not None and not v.get("eval_samples"):
        yield "eval_temperature is the temperature of eval_samples, which is 0: no samples are drawn"
    if v.get("warm_start_rows") and not runs.trains(v):
        yield "warm_start_rows trains before GRPO: --eval_only and --ask measure or ask the model as it is"
    if v["tiny_model"] != TINY_MODELS[0] and not (v["smoke"] or v["demo"]):
        yield (
            f"tiny_model={v['tiny_model']} chooses the model of --smoke and --demo only: this run trains "
            f"{v['model_name_or_path']}"
        )
    clipping = [f"{name}={v[name]}" for name, default in CLIPPING.items() if v[name] != default]
    if clipping and updates_per_generation(v) <= 1 and not v["use_vllm"]:
        yield (
            f"{', '.join(clipping)}: clipping acts only where the policy has moved since it sampled, and here each "
            "generation batch serves one update, so the ratio stays 1 and nothing is clipped: "
            f"--steps_per_generation {4 * v['gradient_accumulation_steps']} (4 updates a batch, as configs/dapo.yaml)"
        )
    if v["multi_objective_aggregation"] == "normalize_then_sum" and v["scale_rewards"] != "group":
        yield (
            f"scale_rewards={v['scale_rewards']} is not used with multi_objective_aggregation=normalize_then_sum: "
            "TRL normalises each reward in its group, then the sum over the batch"
        )
    if v["dtype"] in ("bfloat16", "float16") and not v["use_peft"] and zero_stage() is None and not v["use_cpu"]:
        yield (
            f"dtype={v['dtype']} with full fine-tuning: AdamW updates {v['dtype']} weights in place, and updates "
            f"below half their spacing round away (most of them at lr {v['learning_rate']}); leave --dtype unset "
            "for fp32 weights with bf16 compute, or use DeepSpeed (which keeps fp32 master weights)"
        )


# ---------------------------------------------- Once the data is read, before the weights load -------------------
def before_the_weights(train, run, model_args, training_args, tokenizer=None) -> None:
    """Refuse, before the weights load, a run that could not train what it says it trains."""
    enough_data(train, training_args)
    runs.same_data(train, run, training_args)

    def longest_prompt() -> int:
        return max(len(tokenizer.apply_chat_template(p, add_generation_prompt=True, return_dict=False))
                   for p in train["prompt"])  # fmt: skip

    longest = longest_prompt if tokenizer is not None else None
    model_and_disk(model_args, training_args, run.max_prompt_tokens, run.memory_plan, longest, run.warm_start_rows > 0)


def enough_data(train, training_args) -> None:
    """One optimizer step takes generation_batch_size / num_generations distinct prompts (TRL's RepeatSampler
    yields only whole batches): with fewer, the run would train nothing and report success."""
    if len(train) < (needed := training_args.generation_batch_size // training_args.num_generations):
        raise RecipeError(
            f"{len(train)} training prompts, and one step takes {needed} (generation_batch_size "
            f"{training_args.generation_batch_size} / num_generations {training_args.num_generations}): use more "
            "data, or a smaller --per_device_train_batch_size / --gradient_accumulation_steps"
        )


def model_and_disk(
    model_args, training_args, prompt_tokens: int = 256, plan_memory: bool = True, longest_prompt=None, warm=False
) -> None:
    """Stop, from the model's config alone (a few KB, no weights), a run whose LoRA targets the model lacks, whose
    longest prompt (`longest_prompt()`, tokens) and completion run past its positions (as the evaluation checks its
    own), or whose checkpoint the disk cannot hold."""
    import torch
    from transformers import AutoConfig

    name, remote = model_args.model_name_or_path, training_args.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(name, revision=model_args.model_revision, trust_remote_code=remote)
        skeleton = shapes_only(config, remote)  # nothing allocated, under ZeRO-3 too
    except (OSError, ValueError) as err:
        raise RecipeError(f"Could not read the model {name!r}'s config ({str(err).splitlines()[0][:200]})") from None
    modules = {module_name.rsplit(".", 1)[-1] for module_name, _ in skeleton.named_modules()}
    targets = model_args.lora_target_modules
    if model_args.use_peft and isinstance(targets, list) and (unknown := [t for t in targets if t not in modules]):
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)})
        raise RecipeError(f"lora_target_modules: {name} has no {unknown}; its linear layers are {linear}")
    completion, longest = training_args.max_completion_length, None
    limits = {
        "positions": getattr(config.get_text_config(), "max_position_embeddings", None),
        "vllm": training_args.vllm_max_model_length if training_args.use_vllm else None,  # a server's (sbatch)
    }
    for which, cap in limits.items():
        if not (cap and longest_prompt and prompt_tokens + completion > cap):  # the prompt cap fits: no counting
            continue
        if (longest := longest or longest_prompt()) + completion <= cap:
            continue
        shorter = f"--max_completion_length {max(cap - longest, 0)} or less"
        raise RecipeError(
            f"{name} has {cap} positions, and the longest prompt ({longest} tokens) with --max_completion_length "
            f"{completion} runs past them, where the model was never trained and its completions mean nothing: "
            f"{shorter} (or a shorter --max_prompt_tokens)"
            if which == "positions"
            else f"vllm_max_model_length={cap}: vLLM would refuse the longest prompt ({longest} tokens) with its "
            f"--max_completion_length {completion} completion: serve and set {longest + completion} or more, or "
            f"{shorter}"
        )
    if plan_memory:
        memory_fits(config, skeleton, model_args, training_args, prompt_tokens, warm)
    # A full fine-tuning checkpoint holds the fp32 weights and AdamW's two moments; an adapter's is small.
    checkpoint = 2 * 2**30 if model_args.use_peft else sum(p.numel() for p in skeleton.parameters()) * (4 + 8)
    folder = Path(training_args.output_dir)
    free = shutil.disk_usage(next(p for p in (folder, *folder.absolute().parents) if p.exists())).free
    if free < checkpoint:
        raise RecipeError(
            f"{training_args.output_dir}: {_size(free)} free, and one checkpoint of this run takes about "
            f"{_size(checkpoint)}: free some space, or choose another --output_dir"
        )
    if (kept := training_args.save_total_limit) and free < (kept + 1) * checkpoint:
        logger.warning(
            "%s: %s free for %d checkpoints of about %s each: the disk may fill before the end",
            training_args.output_dir, _size(free), kept + 1, _size(checkpoint),
        )  # fmt: skip


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


# ---------------------------------------------- The memory plan ---------------------------------------------------
EIGHT_BIT = "paged_adamw_8bit"


def model_shape(config, skeleton) -> dict:
    """What the memory plan needs of a model: its parameters (counted on the meta skeleton) and dimensions."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return dict(
        parameters=sum(getattr(p, "ds_numel", None) or p.numel() for p in skeleton.parameters()),  # ZeRO-3's own
        embedding=text.vocab_size * text.hidden_size,
        layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
        vocab=text.vocab_size,
    )


# TRL 1.16 scores completions with a fused LM head (trl/kernels/chunked_logprob.py, ChunkedLogProbFunction): logits
# exist only as tiles of TOKEN_CHUNK_SIZE tokens x the chunk of the vocabulary it is handed (grpo_trainer.py passes
# utils._CHUNKED_LOGPROB_CHUNK_SIZE), one in the forward and one recomputed in the backward, never (batch, length,
# vocabulary) at once.
LOGPROB_TILE = (4096, 32768)


def _full_parts(P: float, plan: dict, moments: int) -> tuple[dict[str, float], int, float]:
    """Full fine-tuning's parts of `memory_estimate`, the bytes of a residual activation, and (ZeRO-3) the weights
    gathered for generation."""
    zero, n = plan.get("zero"), max(1, plan.get("processes", 1))
    parts: dict[str, float] = {}
    gathered = 0.0  # ZeRO-3: the weights gathered for generation, beside the KV cache
    if zero:
        parts["weights (bf16)"] = 2 * P / (n if zero == "3" else 1)
        parts["fp32 master weights"] = 4 * P / n
        parts["gradients"] = 4 * P / n
        parts["optimizer"] = moments * P / n
        local = not (plan.get("server") or plan.get("vllm_share"))  # transformers generates here
        gathered = 2 * P - 2 * P / n if zero == "3" and local and plan.get("gather", True) else 0.0
    elif plan.get("half_weights"):  # --dtype bfloat16: weights, gradients and AdamW's moments all in bf16
        parts["weights (bf16)"] = 2 * P
        parts["gradients (bf16)"] = 2 * P
        parts["optimizer"] = moments * P / 2
    else:
        parts["weights (fp32)"] = 4 * P
        parts["gradients (fp32)"] = 4 * P
        parts["optimizer"] = moments * P
        parts["bf16 cast of the weights (autocast)"] = 2 * P
    if not zero and n > 1:
        parts["DDP gradient buckets"] = (2 if plan.get("half_weights") else 4) * P
    if plan.get("beta"):
        parts["reference model (bf16, KL)"] = 2 * P / (n if zero == "3" else 1)
    residual = 2 if zero or plan.get("half_weights") else 4
    return parts, residual, gathered


def _adapter_parts(shape: dict, plan: dict, moments: int) -> tuple[dict[str, float], float, float]:
    """LoRA's and QLoRA's parts of `memory_estimate`, (ZeRO-3) the base gathered whole, and the base copy a vLLM sync
    keeps: TRL merges the adapters into the whole model to sync vLLM, server or colocate
    (`VLLMGeneration._iter_named_params`, `gather_params` of every parameter), and generates with it gathered
    (`unwrap_model_for_generation`) where vLLM does not."""
    P, L, H, mode = shape["parameters"], shape["layers"], shape["hidden"], plan["mode"]
    n, zero3 = max(1, plan.get("processes", 1)), plan.get("zero") == "3"
    parts: dict[str, float] = {}
    per_layer = {
        "q_proj": H + shape["heads"] * shape["head_dim"], "k_proj": H + shape["kv_heads"] * shape["head_dim"],
        "v_proj": H + shape["kv_heads"] * shape["head_dim"], "o_proj": shape["heads"] * shape["head_dim"] + H,
        "gate_proj": H + shape["intermediate"], "up_proj": H + shape["intermediate"],
        "down_proj": shape["intermediate"] + H,
    }  # fmt: skip
    adapters = plan.get("lora_r", 16) * L * sum(per_layer.values())
    body, embedding = P - shape["embedding"], shape["embedding"]
    per_body = 0.5 if mode == "qlora" else 2  # bytes of a base weight: 4-bit (embeddings bf16), or bf16
    base = per_body * body + 2 * embedding * (2 if mode == "qlora" else 1)
    kind = "4-bit" if mode == "qlora" else "bf16"
    parts[f"base weights ({kind}{', sharded' if zero3 else ''})"] = base / n if zero3 else base
    parts["adapters, gradients, optimizer"] = (4 + 4 + moments + (4 if n > 1 else 0)) * adapters
    syncs = plan.get("vllm_share") or plan.get("server")
    copy = per_body * body if syncs else 0.0  # patches.keep_base_exact: the merged layers' base, for a sync's length
    gathered = base - base / n if zero3 and (syncs or plan.get("gather", True)) else 0.0
    return parts, gathered, copy


SYNC_HOLDS = "training activations, or what a vLLM sync holds (the base gathered, LoRA's base copy), the larger"


def memory_estimate(shape: dict, plan: dict) -> dict[str, float]:
    """Peak GPU memory of one process in bytes, by part, for `plan`: mode ("full", "lora", "qlora"), zero (None,
    "2", "3") and processes, optim_8bit, lora_r, beta (the KL weight: a reference model above 0), batch
    (completions per micro-batch), generation_batch (completions each generate call decodes), prompt and completion
    (tokens), vllm_share (colocate: the share of the GPU's memory vLLM reserves, 0 without it), server (a vLLM
    server generates: no KV cache here, nothing gathered to generate), gather (ZeRO-3: TRL's
    ds3_gather_for_generation) and gpu (bytes).

    Rough by design (within ~20 %): what the recipe holds, from the sources. Full fine-tuning without DeepSpeed:
    fp32 weights, fp32 gradients, AdamW's two fp32 moments (2 bytes each in 8 bits), and autocast's bf16 copy of
    the weights; under DDP (several processes) its gradient buckets, a second fp32 copy of the gradients
    (torch's DistributedDataParallel, gradient_as_bucket_view off as accelerate leaves it). DeepSpeed ZeRO: bf16
    weights (sharded under ZeRO-3, and gathered whole while generating: TRL's unwrap_model_for_generation), the fp32
    master weights, gradients and moments sharded over the processes. LoRA / QLoRA: a bf16 (4-bit) base, fp32
    adapters with their gradients and moments. beta > 0: TRL's reference model for the KL term, in bf16
    (`patches.reference_in_bf16`; LoRA's is the base with the adapters off: nothing more). Generation and training do
    not overlap: the peak is the larger of the KV cache (bf16) and the training's activations (checkpointed layer
    inputs, one layer's recompute, and the fused LM head's logit tiles: `LOGPROB_TILE`); nor do a vLLM sync (before
    a step's generation) and the training's passes, so what a sync holds counts only where it is the larger."""
    P, L, H = shape["parameters"], shape["layers"], shape["hidden"]
    mode = plan["mode"]
    tokens, completion = plan["prompt"] + plan["completion"], plan["completion"]
    moments = 2 if plan.get("optim_8bit") else 8
    if mode == "full":
        (parts, residual, gathered), copy = _full_parts(P, plan, moments), 0.0
    else:
        (parts, gathered, copy), residual = _adapter_parts(shape, plan, moments), 2
    kv_bytes = 2 + 2  # bf16 keys and values (patches.cast_once_per_generation: RoPE in bf16 while generating)
    kv = plan["generation_batch"] * tokens * L * shape["kv_heads"] * shape["head_dim"] * kv_bytes
    kv = 0 if plan.get("server") else kv  # a vLLM server generates elsewhere
    batch = plan["batch"]
    activations = batch * tokens * H * residual * L + batch * tokens * (16 * H + 3 * shape["intermediate"]) * 2
    rows, columns = min(batch * completion, LOGPROB_TILE[0]), min(shape["vocab"], LOGPROB_TILE[1])
    activations += 2 * rows * columns * 2  # the LM head's bf16 logit tiles, forward and backward
    if plan.get("vllm_share"):
        parts["vLLM (its reserved share)"] = plan["vllm_share"] * plan["gpu"]
    if (plan.get("vllm_share") or plan.get("server")) and gathered + copy:  # a sync, before a step's passes
        parts[SYNC_HOLDS] = max(activations, gathered + copy)
    elif plan.get("vllm_share"):
        parts["training activations"] = activations
    elif gathered:
        parts["KV cache and gathered weights, or training activations, the larger"] = max(kv + gathered, activations)
    else:
        parts["KV cache or training activations, the larger"] = max(kv, activations)
    return parts


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.0f} GiB" if nbytes >= 10 * 2**30 else f"{nbytes / 2**30:,.1f} GiB"


def memory_plan(model_args, training_args, gpu: float, prompt_tokens: int = 256) -> dict:
    """The plan of this run, as `memory_estimate` takes it."""
    zero = zero_stage()
    mode = "qlora" if model_args.use_peft and model_args.load_in_4bit else "lora" if model_args.use_peft else "full"
    colocate = training_args.use_vllm and training_args.vllm_mode == "colocate"
    steps = training_args.steps_per_generation or training_args.gradient_accumulation_steps
    return dict(
        mode=mode, zero=zero, processes=world_size(), lora_r=model_args.lora_r, beta=training_args.beta,
        half_weights=model_args.dtype in ("bfloat16", "float16"),
        optim_8bit="8bit" in str(training_args.optim), batch=training_args.per_device_train_batch_size,
        generation_batch=training_args.per_device_train_batch_size * steps,
        prompt=prompt_tokens, completion=training_args.max_completion_length,
        vllm_share=(training_args.vllm_gpu_memory_utilization or 0.3) if colocate else 0.0, gpu=gpu,
        server=training_args.use_vllm and training_args.vllm_mode == "server",
        gather=getattr(training_args, "ds3_gather_for_generation", True),
    )  # fmt: skip


def alternatives(shape: dict, plan: dict, refused: set = frozenset()) -> list[tuple[str, float]]:
    """Other ways to run `plan` that fit its GPU, each with its estimate (bytes); none of the modes `refused`."""
    gpus = plan["processes"] if plan.get("processes", 1) > 1 else 8  # a single process: an 8-GPU box
    no_vllm = ", without --use_vllm" if plan.get("vllm_share") or plan.get("server") else ""  # refused with QLoRA
    options = [
        ("LoRA (--use_peft)", {"mode": "lora", "zero": None}),
        (f"QLoRA (--use_peft --load_in_4bit{no_vllm})",
         {"mode": "qlora", "zero": None, "vllm_share": 0.0, "server": None}),
        (f"ZeRO-2 over {gpus} GPUs (accelerate launch --config_file configs/zero2.yaml)",
         {"zero": "2", "processes": gpus}),
        (f"ZeRO-3 over {gpus} GPUs (accelerate launch --config_file configs/zero3.yaml)",
         {"zero": "3", "processes": gpus}),
        (f"an 8-bit optimizer (--optim {EIGHT_BIT})", {"optim_8bit": True}),
        (f"shorter completions (--max_completion_length {plan['completion'] // 2})",
         {"completion": plan["completion"] // 2}),
        (f"half the micro-batch (--per_device_train_batch_size {max(1, plan['batch'] // 2)}, and twice the "
         "--gradient_accumulation_steps for the same batch)", {"batch": max(1, plan["batch"] // 2)}),
    ]  # fmt: skip
    found = []
    for label, change in options:
        changed = {**plan, **change}
        if changed == plan or change.get("mode") in refused:
            continue
        total = sum(memory_estimate(shape, changed).values())
        if total <= plan["gpu"]:
            found.append((label, total))
    return found


def gpu_memory() -> float:
    import torch

    return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def memory_fits(config, skeleton, model_args, training_args, prompt_tokens: int = 256, warm=False) -> None:
    """Stop in the first seconds, with the options that fit, a run whose estimated peak memory exceeds its GPU; `warm`:
    the run warm-starts (`--warm_start_rows`). Only options the settings accept are offered."""
    if training_args.use_cpu or not cuda_available():
        return
    shape, gpu = model_shape(config, skeleton), gpu_memory()
    plan = memory_plan(model_args, training_args, gpu, prompt_tokens)
    parts = memory_estimate(shape, plan)
    total = sum(parts.values())
    logger.info("Memory plan: ~%s of the GPU's %s (%s)", _gib(total), _gib(gpu), _parts(parts))
    if total <= gpu:
        return
    # the modes `lora_and_bitsandbytes` and `generation` refuse for this run (a test holds the two together)
    refused = {"qlora"} if warm else set()  # a warm start trains every weight: no quantized base
    if training_args.use_transformers_continuous_batching and (training_args.bf16 or training_args.fp16):
        refused |= {"lora", "qlora"}  # TRL's cast to half would drop the fp32 adapters
    options = alternatives(shape, plan, refused)
    listed = "; ".join(f"{label}: ~{_gib(need)}" for label, need in options) or "none of LoRA, QLoRA, ZeRO-2/3 fits"
    raise RecipeError(
        f"{model_args.model_name_or_path} ({shape['parameters'] / 1e9:.2f} B parameters) would need ~{_gib(total)} "
        f"per GPU here ({_parts(parts)}), and the GPU has {_gib(gpu)}: it would run out of memory. What fits, "
        f"estimated: {listed}. (The estimate is docs/memory.md's, within ~20 %: --memory_plan false loads anyway.)"
    )


def _parts(parts: dict[str, float]) -> str:
    return ", ".join(f"{name} {_gib(size)}" for name, size in parts.items())
