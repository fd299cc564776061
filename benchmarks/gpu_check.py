"""GPU acceptance check: the recipe itself, a few steps in each of its training modes, on one CUDA GPU, offline.

    python benchmarks/gpu_check.py            # one H200/H100-class GPU: ~7 min, report in outputs/gpu_check.json
    python benchmarks/gpu_check.py --dry-run  # any machine, on the CPU: a tiny model, `full` and `lora`, ~30 s

Flags: --variants full,lora (default: all), --steps 3, --completion 128 (tokens, every completion runs to it),
--timeout 300 (seconds per variant), --budget 480 (seconds for everything), --json PATH, --work DIR (default
outputs/gpu_check: the built model (3 GB) and data, and per variant its generation.yaml, log.txt and output/, whose
trained weights are deleted once compared).

WHAT RUNS. Nothing is downloaded. A model of Qwen2.5-1.5B-Instruct's shape (QWEN25_1_5B: 1.54 B parameters,
151,936-id vocabulary) with random weights is built on the GPU and saved in bf16, with a byte-level BPE tokenizer
trained on the spot (627 tokens) and generated GSM8K-format problems (grpo_kit.smoke). Each variant is then
`python grpo_demo.py ...` in a process of its own, so it goes through the recipe's own code: settings and their
checks, the precision choice, the model loaded by the trainer, the evaluation before and after training on the
trainer's own model, the run record. The variants:
  full       full fine-tuning at the recipe's default precision (CUDA: fp32 weights, bf16 autocast, flash-attention
             when flash-attn imports);
  lora       --use_peft;
  qlora      --use_peft --load_in_4bit; needs bitsandbytes (skipped, not failed, without it);
  full-vllm  full fine-tuning generating with vLLM inside the training process (colocate, 0.3 of the GPU), to set
             against `full`'s transformers generate; needs vllm (skipped without it);
  full-786   the memory check: one step of `full` at the recipe's 786-token completions, its peak GPU memory (torch's
             count) beside the recipe's memory plan for it (the "Memory plan" line checks.memory_fits logs); last,
             run when the budget covers it;
  full-resume  only when asked (--variants full-resume, ~181 s): `full` run whole, saving the checkpoint of the step
             before its last, then that checkpoint resumed to the last step; the resumed model must be the whole
             run's, up to a tenth of the last step's move (on the CPU, with --dry-run: bit for bit);
  lora-vllm  only when asked (--variants lora-vllm, ~120 s): --use_peft with vLLM colocate, whose every weight sync
             merges the adapters into the base and restores it; needs vllm;
  cb-bf16    transformers' continuous batching. TRL casts the model to bf16 in place for it, so the recipe refuses
             it with fp32 weights: this one loads bf16 weights (--dtype bfloat16) and is a generation-speed
             comparison only. If it fails it is reported as "did not run", with its error, and the check goes on.
Every variant runs the reference's batch (16 generations per prompt, 16 completions per micro-batch, 4 micro-batches:
64 completions per optimizer step) at the recipe's learning rate (cosine, no warm-up), every completion forced to
--completion tokens (end of turn forbidden before it). A random model samples all 151,936 ids, which the 627-token
tokenizer mostly lacks: sampling is restricted to the tokenizer's ids (transformers: `suppress_tokens`, vLLM:
`allowed_token_ids`), so the format's tags turn up by chance, rewards differ within groups and the policy gradient
is not zero. The evaluations: the first 16 test problems, greedy, --completion tokens. With --dry-run: the smoke
preset's tiny model with the same tokenizer, --use_cpu true, 4 generations x 4 prompts per step, 64 tokens, 2 steps,
4 test problems, `full` and `lora`.

WHAT IT REPORTS, per variant (a markdown table, and the JSON report with the settings, package versions and hardware):
the step time, mean after the first step (TRL's `step_time`: generation, rewards, forward and backward; not the
optimizer step); generated tokens per second (completion tokens per step / step time); peak GPU memory as torch
counts it (run_record.json); for vLLM, its up-front reservation (0.3 x the GPU's memory) beside it, never as the
model's peak; whether flash-attention ran; the weights' and the trainable weights' dtypes and the trainable
parameters; how the weights moved, the saved ones against the start model's (LoRA: the B matrices, zero at the
start): the share that changed at all, and their mean |change| over AdamW's expected move (about the learning rate
per step, adding up like a random walk: the square root of the sum of the squared logged learning rates); both
evaluations and their seconds; the wall time; the command.

PASS (exit 0) when every variant that ran (cb-bf16 aside) exited 0, ran all its steps with a gradient in at least one,
wrote eval/baseline and eval/final summaries and saved its weights; its trained weights moved at least half of what
AdamW moves them (the mean |change| over `expected_move`, sqrt(sum of lr^2): full fine-tuning on every weight, LoRA
on the B matrices, which start at zero, at least half of them moved at all); its weights and trainable weights have the
dtypes the recipe chooses (CUDA full fine-tuning: fp32 and fp32; LoRA: a bf16 base and fp32 adapters; QLoRA: a 4-bit
base and fp32 adapters; the dry run: fp32); it ran flash-attention 2 when flash_attn imports here (when it does not,
the report says why); and at least one variant passed. The check trains with weight decay off and a constant
learning rate, so that a weight moves only by a gradient (AdamW's decay alone moves every fp32 weight: a run without
any gradient would "change 100 % of its weights") and the expected move is `expected_move` of a constant rate. The
`full-vllm` variant turns off TRL's vLLM importance-sampling correction: its sampling is restricted to the tokenizer's
627 ids, vLLM's log-probabilities are renormalised over those and TRL's over all 151,936, and the correction's ratio
(e^-700) would zero every gradient; so a vLLM variant's sync is checked on the weights themselves instead: its
recipe runs through `run_recipe_with_sync_probe`, which after every sync TRL makes compares every weight vLLM
generates with against the trainer's (bf16, LoRA merged, q/k/v and gate/up stacked as vLLM holds them): a sync before
each step after the first, each equal bit for bit, every trained weight found in vLLM, some weights moved since the
start, or it fails (`sync_problems`: a stale or broken sync). The last step's update is never synced, so the vLLM
variants need --steps 2 or more, and a step before the last with a gradient; the comparison's seconds are taken out
of the step time it ran in.
Every variant runs on one GPU (CUDA_VISIBLE_DEVICES: the first one visible).
`full-resume` (when asked) passes when both its runs exit 0, the resumed one ends at the last step,
and its weights are the whole run's within a tenth of the last step's mean move (MAX_RESUME_GAP).
Skipped variants (not installed) are listed, not failed; a variant the budget does not cover (left out, or stopped
when the budget ran out) is "not run", never "failed". Otherwise exit 1, the reasons printed and in the JSON.

TIME: ~6.8 min estimated on one H200 with every variant installed (~3.5 min without vllm and bitsandbytes), inside the
8-minute budget. Not yet measured on a GPU. The estimate is the time model that also decides whether a variant still
fits the budget (Variant.estimate); the report puts `estimated_s` beside each `wall_s`. A variant costs a fixed part
(python, imports and settings, ~150k suppressed ids of YAML among them, ~15 s; loading the model ~5 s; the first
step's warm-up ~4 s; saving and comparing 6 GB of fp32 weights ~15 s; vLLM's engine start, compilation and CUDA
graphs ~50 s) plus the tokens decoded one step at a time for
the whole batch: (steps + 2 evaluations) x completion tokens. transformers' generate of a 1.5B model is bound by
kernel launches, not by the GPU: ~25 ms per token at batch 1 (Qwen's published speed benchmark: 41 tokens/s for
Qwen2-1.5B-Instruct on an A100) and about the same for 64 sequences; counted as 30 ms with fp32 weights under
autocast, 40 ms with LoRA's extra layers, 60 ms with bitsandbytes' 4-bit dequantizing, 25 ms for continuous
batching, 8 ms for vLLM with its weight sync. Forward and backward of 64 completions of ~190 tokens is ~6e13 FLOPs:
~1.5 s a step. For 3 steps of 128 tokens: build 20 s, full 72 s, lora 59 s, qlora 82 s, full-vllm 118 s, cb-bf16
56 s: 407 s. 256-token completions would take ~517 s, over the budget: hence 128. full-786 (one step, 786 tokens)
~128 s more: it runs in the budget without vllm and bitsandbytes (334 s in all), else it is "not run".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere: grpo_demo and grpo_kit are at the repo root
RECIPE = ROOT / "grpo_demo.py"

from grpo_kit.layout import read_json  # noqa: E402

# Qwen/Qwen2.5-1.5B-Instruct's config.json, the values that set the cost of a step.
QWEN25_1_5B = dict(
    hidden_size=1536,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    intermediate_size=8960,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    hidden_act="silu",
)
TOKENIZER_VOCAB = 4096  # asked of the BPE trainer; the generated problems' text yields fewer (627)

# The batch: the reference's on a GPU (64 completions per optimizer step); a CPU-sized one for --dry-run, where 64
# tokens x 4 groups per step make a step without a reward difference in any group (so without a gradient) rare.
REAL = dict(
    num_generations=16,
    per_device_train_batch_size=16,
    gradient_accumulation_steps=4,
    steps=3,
    completion=128,
    eval_limit=16,
)
DRY_RUN = dict(
    num_generations=4,
    per_device_train_batch_size=16,
    gradient_accumulation_steps=1,
    steps=2,
    completion=64,
    eval_limit=4,
)
TRAIN_PROBLEMS = 64  # 4 prompts per step: plenty for a few steps

VLLM_GPU_MEMORY_UTILIZATION = 0.3  # colocate: vLLM's share of the GPU
# AdamW moves a weight with a gradient by about the learning rate per step, and the steps' signs vary: the net move
# is about sqrt(sum of lr^2) (`expected_move`); a run that realises less than half of it on average did not train
# (pure bf16 weights realise about a tenth: tests/test_gpu_check.py)
MIN_REALISED = 0.5
MIN_B_MOVED = 0.5  # LoRA: the share of B entries (zero at the start) that must have moved at all
# Settings of every variant that make the movement mean what it says (see PASS above)
MOVEMENT_SETTINGS = {"weight_decay": 0.0, "lr_scheduler_type": "constant"}
VLLM_MEMORY_NOTE = (
    "colocated vLLM allocates its weights and KV cache through torch, so torch's peak includes them: "
    "the training's own peak is at least the peak less vLLM's reservation"
)
BUDGET_S = 480  # the whole check, by default: 8 minutes
TIMEOUT_S = 300  # one variant, by default
BUILD_ESTIMATE_S = 20  # building and saving the model on the GPU, before any variant
DRY_RUN_ESTIMATE_S = 60  # a variant of the dry run on a CPU (the GPU estimates below do not apply)


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]  # the recipe's command-line flags that make this variant
    generation: str  # "transformers", "vllm" or "continuous batching"
    adapters: bool = False  # LoRA / QLoRA: the movement is measured on the B matrices (zero at the start)
    needs: str | None = None  # a package it needs beyond requirements.txt
    comparison_only: bool = False  # a failure is reported ("did not run"), not counted against the check
    resumes: bool = False  # stopped after the checkpoint before its last step, resumed from it: `run_resume`
    # The time model (module docstring): fixed seconds, ms per decoded token in training and in the evaluations
    # (transformers' generate), seconds of forward/backward/weight sync per step.
    fixed_s: float = 0.0
    decode_ms: float = 0.0
    eval_decode_ms: float = 0.0
    train_step_s: float = 0.0
    shape: tuple[tuple[str, int], ...] = ()  # its own steps or completion length, over the check's

    def shaped(self, shape: dict) -> dict:
        """The check's batch shape with this variant's own values over it."""
        return {**shape, **dict(self.shape)}

    def estimate(self, steps: int, completion: int) -> float:
        """Seconds this variant should take on one H200."""
        own = self.shaped({"steps": steps, "completion": completion})
        steps, completion = own["steps"], own["completion"]
        decoding = (steps * self.decode_ms + 2 * self.eval_decode_ms) * completion / 1000
        return self.fixed_s + decoding + steps * self.train_step_s * max(1.0, completion / 128)


VARIANTS = [
    Variant("full", (), "transformers", fixed_s=48, decode_ms=30, eval_decode_ms=30, train_step_s=1.5),
    Variant("lora", ("--use_peft",), "transformers", adapters=True,
            fixed_s=30, decode_ms=40, eval_decode_ms=40, train_step_s=1.2),
    Variant("qlora", ("--use_peft", "--load_in_4bit"), "transformers", adapters=True, needs="bitsandbytes",
            fixed_s=38, decode_ms=60, eval_decode_ms=60, train_step_s=2.0),
    Variant("full-vllm", ("--use_vllm", "--vllm_mode", "colocate",
                          "--vllm_gpu_memory_utilization", str(VLLM_GPU_MEMORY_UTILIZATION),
                          "--vllm_importance_sampling_correction", "false"),
            "vllm", needs="vllm", fixed_s=100, decode_ms=8, eval_decode_ms=30, train_step_s=2.5),
    Variant("cb-bf16", ("--use_transformers_continuous_batching", "true", "--dtype", "bfloat16"),
            "continuous batching", comparison_only=True, fixed_s=35, decode_ms=25, eval_decode_ms=25, train_step_s=1.5),
    # The memory check: one step of full fine-tuning at the recipe's 786-token completions, whose peak torch
    # counts is set beside the recipe's memory plan (logged by checks.memory_fits)
    Variant("full-786", (), "transformers", fixed_s=48, decode_ms=30, eval_decode_ms=30, train_step_s=1.5,
            shape=(("steps", 1), ("completion", 786))),
]  # fmt: skip
# Save and resume, when asked (`--variants full-resume`; ~181 s on the GPU, past the default budget with the others):
# `full` run whole, saving the checkpoint of the step before its last, and that checkpoint resumed to the last step,
# the two models compared (two starts, an 18 GB checkpoint saved and loaded)
ON_REQUEST = [
    Variant("full-resume", (), "transformers", resumes=True, fixed_s=160, decode_ms=40, train_step_s=2.0),
    # LoRA generating with vLLM: each sync merges the adapters into the base and restores it (patches.keep_base_exact)
    Variant("lora-vllm", ("--use_peft", "--use_vllm", "--vllm_mode", "colocate",
                          "--vllm_gpu_memory_utilization", str(VLLM_GPU_MEMORY_UTILIZATION),
                          "--vllm_importance_sampling_correction", "false"),
            "vllm", adapters=True, needs="vllm", fixed_s=100, decode_ms=8, eval_decode_ms=40, train_step_s=2.0),
]  # fmt: skip
BY_NAME = {v.name: v for v in VARIANTS + ON_REQUEST}
DRY_RUN_VARIANTS = ("full", "lora")  # the dry run's default; full-resume runs there too, when asked
DRY_RUNNABLE = (*DRY_RUN_VARIANTS, "full-resume")
# A resumed run's weights against the uninterrupted run's, over the last step's move: 0 on a CPU (bit for bit); a GPU's
# kernels may sum in another order, far below a step. A resume that lost the optimizer, scheduler, data order or RNG
# state trains another last step: a difference of the order of the step itself.
MAX_RESUME_GAP = 0.1
MEMORY_PLAN = re.compile(r"Memory plan: ~([\d,.]+) GiB")  # checks.memory_fits's log line


# ----------------------------------------------------------------------------------------------------------------
# The assets: the model, its tokenizer and the problems (built in a process of their own, so that this one never
# holds GPU memory while the variants run)


def build_assets(folder: Path, dry_run: bool, n_test: int) -> dict:
    """A random model (Qwen2.5-1.5B's shape on the GPU, or the smoke preset's tiny one) saved in bf16 with a
    tokenizer trained here into `folder`/model, generated problems into `folder`/data; what later steps need to
    know of them in `folder`/assets.json."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import grpo_demo
    from grpo_kit import smoke

    answer_format = grpo_demo.ANSWER_FORMAT
    rows = smoke.make_problems(512)
    tokenizer = smoke.build_tokenizer(smoke.corpus(answer_format, rows), answer_format.tags, vocab_size=TOKENIZER_VOCAB)
    facts = {"gpu": None, "gpu_memory_gib": None}
    if dry_run:
        model = smoke.build_tiny_model(tokenizer)
    else:
        if not torch.cuda.is_available():
            sys.exit("No CUDA GPU here: this check needs one (--dry-run checks its code path on a CPU)")
        torch.manual_seed(0)
        special = dict(
            bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        with torch.device("cuda"):  # random init on the GPU: seconds, where the CPU takes minutes
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_1_5B, **special))
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    data = smoke.write_gsm8k_folder(folder / "data", n_train=TRAIN_PROBLEMS, n_test=n_test)
    questions = [json.loads(line)["question"] for line in (data / "train.jsonl").read_text().splitlines()]
    prompt_tokens = [
        len(tokenizer.apply_chat_template(grpo_demo.chat_prompt(q), add_generation_prompt=True, return_dict=False))
        for q in questions
    ]
    facts.update(
        tokenizer_tokens=len(tokenizer),
        model_vocab=model.config.vocab_size,
        parameters=sum(p.numel() for p in model.parameters()),
        max_prompt_tokens=max(prompt_tokens),
    )
    (folder / "assets.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return facts


# ----------------------------------------------------------------------------------------------------------------
# A variant: its settings, its run


def generation_kwargs(variant: Variant, completion: int, assets: dict) -> dict:
    """Every completion runs to `completion` tokens (end of turn forbidden before), sampled from the tokenizer's
    ids only (the random model's other ids would be text the rewards never see, vLLM could not even decode them)."""
    tokens, vocab = assets["tokenizer_tokens"], assets["model_vocab"]
    if variant.generation == "vllm":  # vLLM's SamplingParams
        return {"min_tokens": completion, "allowed_token_ids": list(range(tokens))}
    kwargs = {"min_new_tokens": completion}  # transformers' GenerationConfig
    if vocab > tokens:
        kwargs["suppress_tokens"] = list(range(tokens, vocab))
    return kwargs


def recipe_command(
    variant: Variant, folder: Path, assets_dir: Path, shape: dict, dry_run: bool, overrides: dict | None = None
) -> list[str]:
    """`python grpo_demo.py ...` for `variant`: the settings on the command line (`overrides` over the check's),
    generation_kwargs (a long list on a GPU) in `folder`/generation.yaml."""
    assets = json.loads((assets_dir / "assets.json").read_text(encoding="utf-8"))
    config = {"generation_kwargs": generation_kwargs(variant, shape["completion"], assets)}
    if variant.generation == "vllm":  # the longest sequence vLLM takes: the prompt and completion, not 32k
        config["vllm_max_model_length"] = assets["max_prompt_tokens"] + shape["completion"]
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's: seconds faster for the GPU's long list
    (folder / "generation.yaml").write_text(yaml.dump(config, Dumper=dumper, default_flow_style=None, width=120))
    settings = {
        "model_name_or_path": assets_dir / "model",
        "dataset": assets_dir / "data",
        "output_dir": folder / "output",
        "run_name": f"gpu-check-{variant.name}",
        "report_to": "none",
        "max_steps": shape["steps"],
        "save_strategy": "no",
        "log_completions": "false",
        "final_eval": "true",
        "eval_every_steps": 0,
        "eval_limit": shape["eval_limit"],
        "eval_samples": 2,  # pass@k from one prefill per prompt: the KV cache repeated, sampled on the GPU
        "warmup_steps": 0,
        **MOVEMENT_SETTINGS,
        "num_generations": shape["num_generations"],
        "per_device_train_batch_size": shape["per_device_train_batch_size"],
        "gradient_accumulation_steps": shape["gradient_accumulation_steps"],
        "max_completion_length": shape["completion"],
    }
    if dry_run:
        settings.update(use_cpu="true", bf16="false")
    settings.update(overrides or {})
    flags = [str(item) for name, value in settings.items() for item in (f"--{name}", value)]
    return [sys.executable, str(RECIPE), "--config", str(folder / "generation.yaml"), *flags, *variant.flags]


def one_gpu(environ) -> str:
    """The GPU every variant runs on: the first one CUDA_VISIBLE_DEVICES lets this process see (the first of the
    machine without it), so that no variant spreads over several or measures another's memory."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0].strip() if visible and visible.strip() else "0"


def recipe_env() -> dict[str, str]:
    """The environment of every child: offline, no wandb, one GPU."""
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": one_gpu(os.environ),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }


def run_logged(command: list[str], cwd: Path, log_path: Path, timeout: float) -> tuple[int | None, float]:
    """Run `command` with its output in `log_path`: (its exit code, None if it ran out of time; seconds). It runs in
    a process group of its own, all of which is killed at the end (vLLM may start helper processes)."""
    start = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=recipe_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            code = None
        finally:  # timed out, interrupted, or done: nothing of it may hold the GPU when the next variant starts
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return code, time.monotonic() - start


def log_tail(log_path: Path, lines: int = 40) -> list[str]:
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    return [line for line in text.splitlines() if line.strip()][-lines:]


# ----------------------------------------------------------------------------------------------------------------
# What a run left: trainer_state.json, run_record.json, eval/*/summary.json, the saved weights


def steps_measured(log_history: list[dict], completions_per_step: int, checked: dict | None = None) -> dict:
    """Step times, generated tokens per second and what the optimizer was asked to do, from TRL's per-step logs.
    `checked`: {step: seconds} this check's own work took inside that step's time (the vLLM sync comparison runs
    inside TRL's `training_step`, whose time is the logged `step_time`), taken out of it."""
    steps = [
        {**entry, "step_time": entry["step_time"] - (checked or {}).get(entry.get("step"), 0.0)}
        for entry in log_history
        if "step_time" in entry
    ]
    if not steps:
        return {"steps": 0}
    later = steps[1:] or steps  # the first step pays for warm-up (kernels, allocator, vLLM's first sync)
    seconds = sum(entry["step_time"] for entry in later)
    tokens = sum(entry["completions/mean_length"] * completions_per_step for entry in later)
    return {
        "steps": len(steps),
        "step_seconds": [round(entry["step_time"], 3) for entry in steps],
        "first_step_s": round(steps[0]["step_time"], 3),
        "mean_step_s": round(seconds / len(later), 3),
        "completions_per_step": completions_per_step,
        "mean_completion_tokens": round(sum(e["completions/mean_length"] for e in steps) / len(steps), 1),
        "generated_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "learning_rates": [entry.get("learning_rate", 0.0) for entry in steps],
        "steps_with_gradient": sum(1 for entry in steps if entry.get("grad_norm", 0.0) > 0),
        "first_step_with_gradient": next(
            (e.get("step", i) for i, e in enumerate(steps, 1) if e.get("grad_norm", 0) > 0), None
        ),
        "reward_std": [round(entry.get("reward_std", 0.0), 4) for entry in steps],
    }


def weight_movement(start_dir: Path, trained_dir: Path, adapters: bool) -> dict | None:
    """How far training moved the trainable weights: the share that changed at all and the mean |change|.

    Full fine-tuning: the saved weights against the start model's (bf16, exact in fp32). LoRA / QLoRA: the B
    matrices, which start at zero (the A matrices start random, unknown here). None if nothing was saved.
    """
    import torch
    from safetensors import safe_open

    pattern = "adapter_model*.safetensors" if adapters else "model*.safetensors"
    trained_files = sorted(trained_dir.glob(pattern))
    if not trained_files:
        return None
    count = moved = 0
    total_change = 0.0
    with contextlib.ExitStack() as stack:
        start = {}  # name -> the open start file that holds it
        for path in [] if adapters else sorted(start_dir.glob("model*.safetensors")):
            handle = stack.enter_context(safe_open(path, framework="pt"))
            start.update(dict.fromkeys(handle.keys(), handle))
        for path in trained_files:
            trained = stack.enter_context(safe_open(path, framework="pt"))
            names = trained.keys()  # a safetensors file is not iterable itself
            for name in names:
                if not ("lora_B" in name if adapters else name in start):
                    continue
                change = trained.get_tensor(name).float()
                if not adapters:
                    change -= start[name].get_tensor(name).float()
                change = change.abs_()
                count += change.numel()
                moved += int(torch.count_nonzero(change))
                total_change += float(change.sum(dtype=torch.float64))
    if not count:
        return None
    return {
        "measured_on": "LoRA B matrices" if adapters else "all weights",
        "parameters": count,
        "moved_fraction": round(moved / count, 4),
        "mean_abs_change": total_change / count,
    }


def measure(variant: Variant, folder: Path, start_model: Path, completions_per_step: int) -> dict:
    """Everything the check reports of a variant that ran, from the files it left."""
    output = folder / "output"
    state = read_json(output / "trainer_state.json") or {}
    record = read_json(output / "run_record.json") or {}
    sync = read_json(folder / "vllm_sync.json") if variant.generation == "vllm" else None
    checked = {r["step"] + 1: r.get("seconds", 0.0) for r in (sync or {}).get("syncs", []) if r.get("step") is not None}
    result = steps_measured(state.get("log_history", []), completions_per_step, checked)  # a sync: the next step's
    result["vllm_sync"] = sync
    model = record.get("model") or {}
    result["model"] = model
    result["flash_attention"] = model.get("attention") == "flash_attention_2" if model else None
    result["peak_gpu_memory_gib"] = record.get("peak_gpu_memory_gib")  # torch's count; CUDA only
    result["memory_plan_gib"] = memory_planned(folder / "log.txt")
    result["evaluation"] = {
        name: {"n": summary["n"], "seconds": summary["seconds"], "sampled": "sampling" in summary} if summary else None
        for name in ("baseline", "final")
        for summary in [read_json(output / "eval" / name / "summary.json")]
    }
    health = read_json(output / "health.json")
    result["health"] = health and {
        "status": health["status"],
        "findings": [f"step {f['step']}: {f['check']}" for f in health["findings"]],
        **health["cost"],  # the watcher's time per step beside the step's
    }
    movement = weight_movement(start_model, output, variant.adapters)
    if movement:
        expected = expected_move(result.get("learning_rates", []))
        movement["expected_mean_abs_change"] = expected
        movement["realised_over_expected"] = round(movement["mean_abs_change"] / expected, 3) if expected else None
    result["movement"] = movement
    return result


def memory_planned(log: Path) -> float | None:
    """The recipe's estimate of the run's peak GPU memory (GiB), from its log; None where it made none (CPU)."""
    found = MEMORY_PLAN.search(log.read_text(encoding="utf-8", errors="replace")) if log.exists() else None
    return float(found.group(1).replace(",", "")) if found else None


def expected_move(learning_rates: list[float]) -> float:
    """AdamW's expected net move of a weight over steps at `learning_rates`: sqrt(sum of lr_t^2). Each step moves a
    weight by about its learning rate (m / sqrt(v) is about 1 in size), and successive policy gradients change sign,
    so the moves add like a random walk: lr x sqrt(T) at a constant rate, not lr x T (that bar failed correct runs of
    5 steps: benchmarks/gpu_check.py --dry-run --steps 5 realised 0.45 of it). A correct run realises about 1.0 of
    this whatever its steps, bf16 weights about 0.1 (`tests/test_gpu_check.py` simulates both)."""
    return sum(lr * lr for lr in learning_rates) ** 0.5


def expected_dtypes(variant: Variant, dry_run: bool) -> tuple[str | None, set[str]] | None:
    """(a dtype the weights must include, the trainable weights' dtypes) as the recipe chooses them; None for the
    comparison, which sets its own. The dry run trains in fp32 on the CPU."""
    if variant.comparison_only:
        return None
    if dry_run:
        return "float32", {"float32"}
    # bitsandbytes packs 4-bit weights in uint8; LoRA's base is bf16; full fine-tuning keeps fp32 weights
    base = "uint8" if "--load_in_4bit" in variant.flags else "bfloat16" if variant.adapters else "float32"
    return base, {"float32"}  # full fine-tuning: fp32 weights (bf16 autocast); LoRA and QLoRA: fp32 adapters


def flash_attention_here() -> str | None:
    """Why flash-attention 2 is not expected of the variants: None when flash_attn imports in this process."""
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed (pip install -r requirements-gpu.txt)"
    try:
        import flash_attn  # noqa: F401
    except Exception as err:  # a wheel built for another torch or CUDA: the recipe uses sdpa then
        return f"flash-attn is installed and does not import ({type(err).__name__}: {str(err)[:160]})"
    return None


def problems(variant: Variant, result: dict, steps: int, dry_run: bool = False, flash: bool = False) -> list[str]:
    """Why a variant that ran does not pass; empty when it does. `flash`: flash_attn imports, so it must have run."""
    found = []
    if result.get("steps") != steps:
        found.append(f"ran {result.get('steps', 0)} of {steps} steps (trainer_state.json)")
    elif not variant.comparison_only and result["steps_with_gradient"] == 0:
        found.append("no step had a gradient (grad_norm 0: equal rewards in every group): nothing was learned")
    if not result.get("model"):
        found.append("no run_record.json with the model's facts")
    for name, summary in result["evaluation"].items():
        if summary is None:
            found.append(f"no eval/{name}/summary.json")
        elif not summary["sampled"]:
            found.append(f"eval/{name} has no pass@k (--eval_samples 2 was asked)")
    if not result.get("health"):
        found.append("no health.json (the training-health checks did not run)")
    elif result["health"]["status"] == "stopped":
        found.append(f"stopped on a non-finite loss or gradient: {result['health']['findings']}")
    movement = result["movement"]
    if movement is None:
        found.append("no trained weights saved in the output folder")
    elif not variant.comparison_only:
        realised = movement.get("realised_over_expected") or 0.0
        if realised < MIN_REALISED:
            found.append(
                f"the {movement['measured_on']} moved {realised:.2f} of AdamW's expected move (at least "
                f"{MIN_REALISED} expected): the updates did not land"
            )
        if variant.adapters and movement["moved_fraction"] < MIN_B_MOVED:
            found.append(
                f"only {movement['moved_fraction']:.1%} of the LoRA B entries moved (at least {MIN_B_MOVED:.0%})"
            )
    model, expected = result.get("model") or {}, expected_dtypes(variant, dry_run)
    if model and expected:
        base, trainable = expected
        if base not in model.get("weights_dtype", []) or set(model.get("trainable_dtype", [])) != trainable:
            found.append(
                f"dtypes: weights {model.get('weights_dtype')}, trainable {model.get('trainable_dtype')}; expected "
                f"weights with {base}, trainable {sorted(trainable)}"
            )
    if variant.generation == "vllm" and not variant.comparison_only:
        found += sync_problems(result.get("vllm_sync"), steps, result.get("first_step_with_gradient"))
    if model and flash and not variant.comparison_only and model.get("attention") != "flash_attention_2":
        found.append(f"attention {model.get('attention')}: flash_attn imports here, so flash_attention_2 was expected")
    return found


def remove_weights(output: Path) -> None:
    """The trained weights are random and large (6 GB for full fine-tuning): gone once compared."""
    for path in output.glob("*.safetensors"):
        path.unlink()


# ----------------------------------------------------------------------------------------------------------------
# The vLLM weight sync: every sync TRL runs while training, checked on the weights vLLM generates with

# vLLM's Qwen2 and Llama models stack q/k/v and gate/up into one tensor each (their `stacked_params_mapping`: each
# shard at its offset along the first dimension, in this order); every other weight has the trainer's name
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def trainer_names(vllm_name: str) -> list[str]:
    """The trainer's weights that, stacked along the first dimension, make vLLM's weight `vllm_name`."""
    for fused, parts in STACKED.items():
        if f".{fused}." in vllm_name:
            return [vllm_name.replace(f".{fused}.", f".{part}.") for part in parts]
    return [vllm_name]


def sync_gap(generation, start_model: Path) -> dict:
    """Right after a sync: every weight of the model TRL loads into (`llm.llm_engine.model_executor.driver_worker.
    model_runner.model`, TRL's own path in colocate mode) against the trainer's, cast to bf16 with LoRA's adapters
    merged as TRL merges them (the model's own `merge_adapter`; `patches.keep_base_exact` restores the base after) and
    stacked as vLLM stacks them (`trainer_names`). A sync that works leaves them equal bit for bit; the weights that
    moved since the start (in bf16) are what tells a working sync from one that left the start's weights."""
    import torch
    from safetensors import safe_open

    engine = generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
    model = generation.accelerator.unwrap_model(generation.model)
    found = {"compared": 0, "differing": 0, "moved_since_start": 0, "other_shape": [], "not_in_vllm": []}
    with contextlib.ExitStack() as stack:
        start = {}  # name -> the open start file that holds it
        for path in sorted(start_model.glob("model*.safetensors")):
            handle = stack.enter_context(safe_open(path, framework="pt"))
            start.update(dict.fromkeys(handle.keys(), handle))
        if hasattr(model, "merge_adapter"):  # as TRL syncs LoRA; unmerged even if the merge fails partway
            stack.callback(model.unmerge_adapter)
            model.merge_adapter()
        ours = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p for n, p in model.named_parameters()}
        ours = {name: p for name, p in ours.items() if "lora_" not in name}  # TRL syncs the merged base, not these
        unseen = set(ours)
        for name, theirs in engine.named_parameters():
            parts = trainer_names(name)  # TRL's own renaming above; lm_head tied to the embedding: not the trainer's
            if not all(part in ours and part in start for part in parts):
                continue
            unseen -= set(parts)
            mine = torch.cat([ours[part].detach().to(torch.bfloat16) for part in parts])
            theirs = theirs.detach()
            if name.endswith(("embed_tokens.weight", "lm_head.weight")):
                theirs = theirs[: mine.shape[0]]  # vLLM pads its vocabulary to a multiple of 64
            if theirs.shape != mine.shape:
                found["other_shape"].append(f"{name}: vLLM {list(theirs.shape)}, trainer {list(mine.shape)}")
                continue
            begun = torch.cat([start[part].get_tensor(part) for part in parts]).to(mine.device, torch.bfloat16)
            found["compared"] += mine.numel()
            found["differing"] += int((mine != theirs.to(mine.device, torch.bfloat16)).sum())
            found["moved_since_start"] += int((mine != begun).sum())
    found["not_in_vllm"] = sorted(unseen)  # a weight trained and never compared: a sync could lose it unseen
    return found


def watch_syncs(start_model: Path, trainers: list) -> list[dict]:
    """Make every weight sync TRL runs (`VLLMGeneration.sync_weights`: before each generation round whose step
    differs from the last synced, `_generate_single_turn`) compare its result (`sync_gap`), recorded with the step of
    the last of `trainers`; returns the list the records go to. The comparison's own failure is recorded, never
    raised into the run."""
    from trl.generation.vllm_generation import VLLMGeneration

    records: list[dict] = []
    sync = VLLMGeneration.sync_weights

    def sync_then_compare(self):
        sync(self)
        record: dict = {"step": trainers[-1].state.global_step if trainers else None}
        begun = time.perf_counter()
        try:
            record.update(sync_gap(self, start_model))
        except Exception as err:  # the check's, not the run's: said in the report
            record["error"] = f"{type(err).__name__}: {err}"[:300]
        record["seconds"] = round(time.perf_counter() - begun, 3)  # inside the next step's time: taken out of it
        records.append(record)

    VLLMGeneration.sync_weights = sync_then_compare
    return records


def sync_problems(sync: dict | None, steps: int, first_gradient: int | None = 1) -> list[str]:
    """Why vLLM did not generate with the trained weights (`watch_syncs`' records); empty when it did. TRL syncs
    before the generation round of every step (steps_per_generation as the check leaves it: one round a step), so
    steps 1 to `steps` - 1 each need a sync that carried the moved weights bit for bit. The last step's update is
    never synced, so moved weights reach vLLM only where a step before it had a gradient (`first_gradient`, counted
    from 1; None: no step had one)."""
    if not sync:
        return ["no vllm_sync.json: the weights vLLM generates with were not compared with the trainer's"]
    records = sync["syncs"]
    if errors := [f"step {r['step']}: {r['error']}" for r in records if "error" in r]:
        return [f"a weight sync could not be compared ({errors[0]})"]
    if missing := sorted(set(range(1, steps)) - {r["step"] for r in records}):  # global steps: before step g + 1
        return [
            f"TRL did not sync vLLM before step(s) {[g + 1 for g in missing]}: vLLM generated them with stale weights"
        ]
    if shapes := [s for r in records for s in r.get("other_shape", [])]:
        return [f"vLLM holds a weight of another shape than the trainer's ({shapes[0]}): a broken weight sync"]
    if not any(r["compared"] for r in records):
        return ["no weight of vLLM's matched one of the trainer's by name"]
    if unseen := sorted({name for r in records for name in r.get("not_in_vllm", [])}):
        return [f"{len(unseen)} of the trainer's weights have no weight in vLLM to compare (e.g. {unseen[0]})"]
    if wrong := [r for r in records if r["differing"]]:
        r = wrong[0]
        return [
            f"after the sync before step {r['step'] + 1}, {r['differing']:,} of {r['compared']:,} weights in vLLM "
            f"differ from the trainer's ({r['moved_since_start']:,} moved since the start): vLLM generates with other "
            "weights than those trained (a stale or broken weight sync)"
        ]
    if first_gradient is None or first_gradient >= steps:
        return [
            "the weight sync is not judged: no step before the last had a gradient, and the last step's update is "
            "never synced, so no sync could carry moved weights (run more --steps)"
        ]
    if not any(r["moved_since_start"] for r in records):
        return ["no compared weight moved since the start (in bf16): a working sync cannot be told from a stale one"]
    return []


def run_recipe_with_sync_probe(report: Path, start_model: Path, argv: list[str]) -> None:
    """`python grpo_demo.py argv`, as it runs, with every weight sync TRL makes checked (`watch_syncs`), the
    records written to `report` when training ends (or stops)."""
    import runpy

    from trl import GRPOTrainer

    trainers: list = []
    records = watch_syncs(start_model, trainers)
    train = GRPOTrainer.train

    def train_watched(self, *args, **kwargs):
        trainers.append(self)
        try:
            return train(self, *args, **kwargs)
        finally:
            report.write_text(json.dumps({"syncs": records}, indent=1) + "\n", encoding="utf-8")

    GRPOTrainer.train = train_watched
    sys.argv = [str(RECIPE), *argv]
    runpy.run_path(str(RECIPE), run_name="__main__")


# ----------------------------------------------------------------------------------------------------------------
# The check


def available(variant: Variant, dry_run: bool) -> str | None:
    """Why `variant` cannot run here, None when it can."""
    if dry_run and variant.name not in DRY_RUNNABLE:
        return f"needs a CUDA GPU (the dry run covers {', '.join(DRY_RUNNABLE)})"
    if variant.needs and importlib.util.find_spec(variant.needs) is None:
        return f"{variant.needs} is not installed (pip install -r requirements-gpu.txt)"
    return None


def run_variant(variant: Variant, work: Path, shape: dict, dry_run: bool, timeout: float, limit: str) -> dict:
    """Run one variant of the recipe and measure what it left; `limit` says what set `timeout`."""
    folder, shape = work / variant.name, variant.shaped(shape)
    shutil.rmtree(folder, ignore_errors=True)  # this check's own folder: nothing stale may pass for a result
    folder.mkdir(parents=True)
    if variant.resumes:
        return run_resume(variant, folder, work / "assets", shape, dry_run, timeout, limit)
    command = recipe_command(variant, folder, work / "assets", shape, dry_run)
    if variant.generation == "vllm":  # the recipe as it runs, its vLLM weight sync compared when training ends
        probe = ["--_sync_probe", str(folder / "vllm_sync.json"), str(work / "assets" / "model"), "--"]
        command = [sys.executable, __file__, *probe, *command[2:]]
    print(f"{variant.name}: running (log: {folder / 'log.txt'})", flush=True)
    code, seconds = run_logged(command, folder, folder / "log.txt", timeout)
    result = {"command": shlex.join(command), "wall_s": round(seconds, 1), "log": str(folder / "log.txt")}
    if code != 0:
        tail = log_tail(folder / "log.txt")
        last_line = tail[-1].strip() if tail else f"exit code {code}"
        error = f"stopped after {timeout:.0f} s: {limit}" if code is None else last_line
        status = "did not run" if variant.comparison_only else "failed"
        if code is None and limit != "--timeout":  # the budget ran out: not measured, so not failed
            status = "not run"
        return {**result, "status": status, "exit_code": code, "error": error, "log_tail": tail}
    completions_per_step = shape["per_device_train_batch_size"] * shape["gradient_accumulation_steps"]
    result.update(measure(variant, folder, work / "assets" / "model", completions_per_step))
    remove_weights(folder / "output")
    if variant.generation == "vllm":
        gpu_memory = json.loads((work / "assets" / "assets.json").read_text())["gpu_memory_gib"]
        result["vllm_reserved_gib"] = round(VLLM_GPU_MEMORY_UTILIZATION * gpu_memory, 1) if gpu_memory else None
        result["memory_note"] = VLLM_MEMORY_NOTE
    found = problems(variant, result, shape["steps"], dry_run, flash=not dry_run and flash_attention_here() is None)
    result["problems"] = found
    result["status"] = "passed" if not found else "ran, with problems" if variant.comparison_only else "failed"
    return result


def run_resume(variant: Variant, folder: Path, assets: Path, shape: dict, dry_run: bool, timeout: float, limit: str):
    """`full` stopped and resumed: `steps` steps, saving the checkpoint of the step before the last (its model kept
    aside), then that checkpoint resumed in the same folder to the last step. The resumed model against the
    uninterrupted one, as a share of the last step's move (`resume_problems`)."""
    steps, output, started = shape["steps"], folder / "output", time.monotonic()
    checkpoint, uninterrupted = output / f"checkpoint-{steps - 1}", folder / "uninterrupted"
    saving = {"save_strategy": "steps", "save_steps": max(steps - 1, 1), "final_eval": "false", "eval_samples": 0}
    result: dict = {"wall_s": 0.0, "log": str(folder / "log-whole.txt")}

    def run(name: str, overrides: dict) -> dict | None:
        """The recipe once; None when it ran through, else the variant's result as it stopped."""
        command = recipe_command(variant, folder, assets, shape, dry_run, overrides)
        code, _ = run_logged(command, folder, folder / f"log-{name}.txt", timeout - (time.monotonic() - started))
        result.update({"wall_s": round(time.monotonic() - started, 1), f"command_{name}": shlex.join(command)})
        if code == 0:
            return None
        tail = log_tail(folder / f"log-{name}.txt")
        error = f"stopped after {timeout:.0f} s: {limit}" if code is None else (tail[-1] if tail else str(code))
        status = "not run" if code is None and limit != "--timeout" else "failed"
        return {**result, "status": status, "exit_code": code, "error": f"{name} run: {error}", "log_tail": tail}

    if stopped := run("whole", saving):
        return stopped
    if not checkpoint.is_dir():
        return {**result, "status": "failed", "error": f"no {checkpoint.name} saved", "problems": []}
    uninterrupted.mkdir()  # the whole run's model, kept aside from the resumed run's
    for path in output.glob("model*.safetensors*"):
        path.replace(uninterrupted / path.name)
    for newer in (p for p in output.glob("checkpoint-*") if p != checkpoint):
        shutil.rmtree(newer)
    if stopped := run("resumed", {**saving, "resume_from_checkpoint": str(checkpoint)}):
        return stopped
    last_step = weight_movement(checkpoint, uninterrupted, adapters=False)
    gap = weight_movement(uninterrupted, output, adapters=False)
    result["steps"] = (read_json(output / "trainer_state.json") or {}).get("global_step")
    # the steps the resumed run trained, as its console says them: a run that started afresh (its seed the same, its
    # weights on a CPU the same too) would say every one
    said = (folder / "log-resumed.txt").read_text(encoding="utf-8", errors="replace")
    result["resume"] = {
        "from_step": steps - 1,
        "steps_trained": [int(step) for step in re.findall(r"^step (\d+)/", said, re.MULTILINE)],
        "last_step_mean_abs_move": last_step and last_step["mean_abs_change"],
        "mean_abs_difference": gap and gap["mean_abs_change"],
        "differing_fraction": gap and gap["moved_fraction"],
    }
    for path in (uninterrupted, *output.glob("checkpoint-*")):  # 18 GB a checkpoint on the GPU: gone once compared
        shutil.rmtree(path, ignore_errors=True)
    remove_weights(output)
    result["problems"] = resume_problems(result, steps)
    result["status"] = "failed" if result["problems"] else "passed"
    return result


def resume_problems(result: dict, steps: int) -> list[str]:
    """Why a save and resume does not pass: the resumed run must end at the last step, and its weights must be the
    uninterrupted run's, up to MAX_RESUME_GAP of the last step's move."""
    resume = result.get("resume") or {}
    move, gap = resume.get("last_step_mean_abs_move"), resume.get("mean_abs_difference")
    if result.get("steps") != steps:
        return [f"the resumed run ended at step {result.get('steps')}, not {steps} (trainer_state.json)"]
    if resume.get("steps_trained") != [steps]:
        return [
            f"the resumed run trained steps {resume.get('steps_trained')}, not step {steps} alone: it started afresh"
        ]
    if move is None or gap is None:
        return ["no weights to compare (the checkpoint's or a run's model was not saved)"]
    if move == 0:
        return ["the last step moved no weight: nothing to compare a resume against"]
    if gap / move > MAX_RESUME_GAP:
        return [
            f"the resumed run's weights differ from the uninterrupted run's by {gap / move:.2f} of the last step's "
            f"move (at most {MAX_RESUME_GAP}): the resume did not continue the run (optimizer, schedule, data or RNG)"
        ]
    return []


def plan(names: list[str], shape: dict, dry_run: bool) -> list[tuple[Variant, str | None, float]]:
    """The variants asked for, in the check's order, each with why it cannot run here (None when it can) and the
    seconds it is expected to take."""
    return [
        (v, available(v, dry_run), DRY_RUN_ESTIMATE_S if dry_run else v.estimate(shape["steps"], shape["completion"]))
        for v in VARIANTS + ON_REQUEST
        if v.name in names
    ]


def chosen(args) -> tuple[dict, list[str]]:
    """The batch shape and the variants' names the command line asks for."""
    shape = dict(DRY_RUN if args.dry_run else REAL)
    for key in ("steps", "completion"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    default = DRY_RUN_VARIANTS if args.dry_run else [v.name for v in VARIANTS]
    names = args.variants.split(",") if args.variants else list(default)
    unknown = sorted(set(names) - BY_NAME.keys())
    if unknown:
        sys.exit(f"--variants: unknown {unknown}; choose from {', '.join(BY_NAME)}")
    vllm = [n for n in names if BY_NAME[n].generation == "vllm" and available(BY_NAME[n], args.dry_run) is None]
    if shape["steps"] < 2 and vllm:
        sys.exit(f"--steps {shape['steps']}: {', '.join(vllm)} need at least 2 (TRL syncs vLLM before a step, so the "
                 "weight sync is checked from step 2 on)")  # fmt: skip
    return shape, names


def check(args) -> dict:
    """Build the assets, run the variants while the budget lasts: the report, less its environment."""
    deadline = time.monotonic() + args.budget
    shape, names = chosen(args)
    work = Path(args.work).resolve()
    settings = {**shape, "dry_run": args.dry_run, "budget_s": args.budget, "timeout_s": args.timeout}
    settings.update(vllm_gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION, work=str(work))
    report = {"check": "GRPO recipe, " + ("tiny model on the CPU (dry run)" if args.dry_run else "one GPU")}
    report.update(settings=settings, variants={})
    report["flash_attention"] = (
        "not expected on the CPU" if args.dry_run else flash_attention_here() or "imports: required"
    )

    planned = plan(names, shape, args.dry_run)
    runnable = [(v.name, estimate) for v, unavailable, estimate in planned if not unavailable]
    total = sum(estimate for _, estimate in runnable) + (0 if args.dry_run else BUILD_ESTIMATE_S)
    print(
        f"Plan: {', '.join(f'{name} ~{estimate:.0f} s' for name, estimate in runnable)}; ~{total:.0f} s in all, "
        f"of a {args.budget:.0f} s budget",
        flush=True,
    )

    # 1. the model, tokenizer and problems, in a process of their own
    shutil.rmtree(work / "assets", ignore_errors=True)
    (work / "assets").mkdir(parents=True)
    build = [sys.executable, __file__, "--_build", str(work / "assets"), "--_n_test", str(max(shape["eval_limit"], 16))]
    build += ["--dry-run"] if args.dry_run else []
    print("Building the model, tokenizer and problems...", flush=True)
    code, seconds = run_logged(build, work, work / "assets" / "build.log", args.budget)
    if code != 0:
        tail = log_tail(work / "assets" / "build.log")
        report["build"] = {"wall_s": round(seconds, 1), "error": tail[-1] if tail else "?", "log_tail": tail}
        report["failures"] = [f"building the model failed: {report['build']['error']}"]
        return report
    report["build"] = {"wall_s": round(seconds, 1), **read_json(work / "assets" / "assets.json")}
    print(f"Built in {seconds:.0f} s: {work / 'assets'}", flush=True)

    # 2. the variants, each in its own process, while the budget lasts
    spent = estimated = 0.0  # of the variants that ran through so far: their wall time against their estimates
    for variant, unavailable, estimate in planned:
        expected = estimate * (spent / estimated if estimated else 1.0)  # estimates scaled by how they fared
        left = deadline - time.monotonic()
        entry = {"generation": variant.generation, "flags": list(variant.flags), "estimated_s": round(estimate)}
        if unavailable:
            result = {"status": "skipped", "reason": unavailable}
        elif expected > left:
            reason = f"the budget's {left:.0f} s left would not cover ~{expected:.0f} s"
            result = {"status": "not run", "reason": reason}
        else:
            limit = "--timeout" if args.timeout <= left else f"the budget ran out (estimated ~{expected:.0f} s)"
            result = run_variant(variant, work, shape, args.dry_run, min(args.timeout, left), limit)
            if result["status"] in ("passed", "ran, with problems"):  # a quick failure says nothing of time
                spent, estimated = spent + result["wall_s"], estimated + estimate
            print(f"{variant.name}: {result['status']} in {result['wall_s']:.0f} s", flush=True)
            if result["status"] in ("failed", "did not run", "not run"):
                print("\n".join(result.get("log_tail", [])[-15:]) or result.get("error", ""), file=sys.stderr)
        report["variants"][variant.name] = {**entry, **result}

    compare_generation(report["variants"])
    report["failures"] = failures(report["variants"])
    return report


def compare_generation(results: dict) -> None:
    """vLLM and continuous batching against `full` (transformers' generate): how many times faster a step is."""
    full = results.get("full", {}).get("mean_step_s")
    for name in ("full-vllm", "cb-bf16"):
        other = results.get(name, {}).get("mean_step_s")
        if full and other:
            results[name]["step_speedup_vs_full"] = round(full / other, 2)


def failures(results: dict) -> list[str]:
    """Why the check fails; empty when it passes."""
    found = []
    for name, result in results.items():
        if result["status"] == "failed":
            found += [f"{name}: {p}" for p in result.get("problems") or [result["error"]]]
    checked = [name for name, r in results.items() if r["status"] == "passed" and not BY_NAME[name].comparison_only]
    if not found and not checked:
        found.append("no variant ran: nothing was checked")
    return found


# ----------------------------------------------------------------------------------------------------------------
# The table


def _num(value, fmt: str = ",.1f") -> str:
    return "-" if value is None else format(value, fmt)


def _row(name: str, r: dict) -> str:
    if r["status"] in ("skipped", "failed", "did not run", "not run") and "steps" not in r:
        reason = (r.get("reason") or r.get("error") or "")[:150].replace("|", "/")
        return f"| {name} | {r['status']}: {reason} |" + " |" * 13
    model, movement, evaluation = r.get("model") or {}, r.get("movement") or {}, r.get("evaluation") or {}
    memory = r.get("peak_gpu_memory_gib")
    dtypes = f"{'+'.join(model.get('weights_dtype', []))} / {'+'.join(model.get('trainable_dtype', []))}"
    trainable = model.get("trainable_parameters")
    evals = " / ".join(_num((evaluation.get(n) or {}).get("seconds")) for n in ("baseline", "final"))
    cells = [
        name,
        r["status"],
        r["generation"],
        dtypes,
        model.get("attention", "-"),
        "-" if trainable is None else f"{trainable / 1e6:,.2f} M",
        _num(r.get("mean_step_s"), ".2f"),
        _num(r.get("generated_tokens_per_s"), ",.0f"),
        "-" if not memory else f"{memory['allocated']:.1f} / {memory['reserved']:.1f}",
        _num(r.get("memory_plan_gib")),
        _num(r.get("vllm_reserved_gib")),
        "-" if not movement else f"{movement['moved_fraction']:.1%}",
        _num(movement.get("realised_over_expected"), ".2f"),
        evals,
        _num(r.get("wall_s"), ".0f"),
    ]
    return "| " + " | ".join(cells) + " |"


def table(results: dict) -> str:
    header = [
        "variant", "status", "generation", "weights / trainable dtype", "attention", "trainable", "step (s)",
        "generated tokens/s", "peak GPU GiB, torch (allocated / reserved)", "recipe's plan (GiB)",
        "vLLM reserves (GiB)", "weights moved",
        "mean move / expected", "eval s (before / after)", "wall (s)",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + [_row(name, r) for name, r in results.items()])


def environment() -> dict:
    from grpo_kit import runs

    return {"versions": runs.package_versions(), "hardware": runs.hardware()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dry, real = DRY_RUN, REAL
    parser.add_argument("--dry-run", action="store_true", help="the tiny model on the CPU: the code path only")
    parser.add_argument(
        "--variants",
        help=f"comma-separated, of {', '.join(BY_NAME)}; default: all but full-resume, lora-vllm (dry run: full,lora)",
    )
    parser.add_argument(
        "--steps", type=int, help=f"optimizer steps per variant, the first one warm-up (default {real['steps']}, "
        f"dry run {dry['steps']})"
    )  # fmt: skip
    parser.add_argument(
        "--completion", type=int, help=f"tokens per completion, every one generated (default {real['completion']}, "
        f"dry run {dry['completion']})"
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds one variant may take")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all: what would not fit is skipped")
    parser.add_argument("--json", default="outputs/gpu_check.json", help="where the report is written")
    parser.add_argument("--work", default="outputs/gpu_check", help="the assets; per variant its settings, log, output")
    parser.add_argument("--_build", help=argparse.SUPPRESS)  # internal: build the assets into this folder
    parser.add_argument("--_n_test", type=int, default=16, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    if sys.argv[1:2] == ["--_sync_probe"]:  # internal: a vLLM variant's recipe run (`run_recipe_with_sync_probe`)
        report, start_model, _, *argv = sys.argv[2:]
        return run_recipe_with_sync_probe(Path(report), Path(start_model), argv)
    args = parse_args()

    if args._build:
        build_assets(Path(args._build), args.dry_run, args._n_test)
        return

    started = time.monotonic()
    checked = check(args)
    report = {"passed": not checked["failures"], "wall_s": round(time.monotonic() - started, 1), **checked}
    report["environment"] = environment()
    shape = report["settings"]
    prompts = shape["per_device_train_batch_size"] * shape["gradient_accumulation_steps"] // shape["num_generations"]
    print(
        f"\nGRPO, {'tiny model (dry run, CPU)' if args.dry_run else 'Qwen2.5-1.5B-Instruct shape, random weights'}: "
        f"{prompts} prompts x {shape['num_generations']} generations x {shape['completion']} tokens per step, "
        f"{shape['steps']} steps per variant (step time: mean after the first), {report['wall_s']:.0f} s in all\n"
    )
    print(table(report["variants"]))
    print(f"flash-attention: {report['flash_attention']}")
    for name, result in report["variants"].items():
        if resume := result.get("resume"):
            move, gap = resume["last_step_mean_abs_move"], resume["mean_abs_difference"]
            print(f"{name}: resumed from step {resume['from_step']}, its weights {gap} from the uninterrupted run's "
                  f"(the last step moved them {move})")  # fmt: skip
        if result.get("memory_note"):
            print(f"{name}: {result['memory_note']} ({result['vllm_reserved_gib']} GiB)")
        if result["status"] == "ran, with problems":
            print(f"{name} (a comparison, not counted): {'; '.join(result['problems'])}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    verdict = "PASSED" if report["passed"] else "FAILED:\n" + "\n".join(f"  - {f}" for f in report["failures"])
    print(f"\n{verdict}\nReport: {path}")
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
