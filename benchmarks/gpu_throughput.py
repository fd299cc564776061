"""GRPO at the reference's settings on one GPU: step time, generated tokens per second and peak GPU memory, for full
fine-tuning against LoRA, and vLLM against transformers generation where vllm is installed.

    python benchmarks/gpu_throughput.py                     # every variant this machine can run, 4 steps each
    python benchmarks/gpu_throughput.py --variants full,lora --steps 6 --json outputs/gpu_throughput.json
    python benchmarks/gpu_throughput.py --tokenizer ~/models/Qwen2.5-1.5B-Instruct   # a local tokenizer
    python benchmarks/gpu_throughput.py --dry-run           # any machine, CPU too: a tiny model, the code path only

Offline. The model has Qwen2.5-1.5B-Instruct's architecture (QWEN25_1_5B below) with random weights: weights do not
change what a step costs. The tokenizer is trained here on generated GSM8K-style text unless --tokenizer names one.
Every completion runs to the full 786 tokens (end of sequence forbidden until then), so a step costs what the
reference's worst case does: 4 prompts x 16 generations x 786 tokens, 16 completions per micro-batch, 4 micro-batches
per optimizer step. Each variant runs in its own process (a fresh GPU, its own peak-memory counter). Setting up (model
load, vLLM start-up) and the first step (kernel selection, allocator growth) are reported apart from the mean of the
other steps. Prints a markdown table and writes the numbers as JSON. Exits 1 if a variant failed (its error is in
both).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere: grpo_demo is at the repo root

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
# The reference's batch: 16 generations per prompt, 16 completions per micro-batch, 4 micro-batches per step.
REFERENCE = dict(num_generations=16, per_device_train_batch_size=16, gradient_accumulation_steps=4, completion=786)
# --dry-run: the same code path at a size a CPU runs in seconds.
DRY_RUN = dict(num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=1, completion=16)
VLLM_GPU_MEMORY_UTILIZATION = 0.3  # colocate: vLLM's share of the GPU, as in configs/qwen_lora_vllm.yaml

VARIANTS = {  # name: (LoRA, vLLM)
    "full": (False, False),
    "lora": (True, False),
    "full-vllm": (False, True),
    "lora-vllm": (True, True),
}


def build_assets(folder: Path, dry_run: bool, tokenizer_path: str | None) -> None:
    """A random model (Qwen2.5-1.5B's shape, or the smoke preset's tiny one) with a tokenizer, saved to `folder`."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    import grpo_demo
    from grpo_kit import smoke

    if tokenizer_path:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    else:
        rows = smoke.make_problems(512)
        corpus = [grpo_demo.SYSTEM_PROMPT, *(r["question"] for r in rows), *map(smoke.formatted_solution, rows)]
        tokenizer = smoke.build_tokenizer(corpus, vocab_size=4096)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    if dry_run:
        model = smoke.build_tiny_model(tokenizer)
    else:
        special = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_1_5B, **special)).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def step_timer():
    """A callback timing each optimizer step (generation, rewards, forward, backward, optimizer) and noting the GPU
    memory in use (the device's view: vLLM's too) at its end."""
    import torch
    from transformers import TrainerCallback

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds, self.device_used, self.start = [], [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.seconds.append(time.perf_counter() - self.start)
            if torch.cuda.is_available():
                free, total = torch.cuda.mem_get_info()
                self.device_used.append((total - free) / 2**30)

    return StepTimer()


def run_variant(name: str, folder: Path, steps: int, dry_run: bool) -> dict:
    """Train `steps` GRPO steps of one variant on the model in `folder`; its timings and memory."""
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import grpo_demo
    from grpo_kit import smoke

    use_lora, use_vllm = VARIANTS[name]
    shape = DRY_RUN if dry_run else REFERENCE
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with tempfile.TemporaryDirectory() as data_dir:
        smoke.write_gsm8k_folder(data_dir, n_train=256, n_test=1)
        dataset = grpo_demo.get_gsm8k_questions("train", data_dir)
    prompt_tokens = [
        len(tokenizer.apply_chat_template(p, tokenize=True, add_generation_prompt=True, return_dict=False))
        for p in dataset["prompt"]
    ]
    completion = shape["completion"]
    if use_vllm:  # vLLM's SamplingParams; ids past the tokenizer's (random weights sample any) would not detokenize
        generation_kwargs = {"min_tokens": completion, "allowed_token_ids": list(range(len(tokenizer)))}
    else:  # transformers' GenerationConfig
        generation_kwargs = {"min_new_tokens": completion}
    attention = "flash_attention_2" if cuda and importlib.util.find_spec("flash_attn") else "sdpa"
    settings = {
        **grpo_demo.GRPO_DEFAULTS,  # the recipe's values, but for the batch shape, the length and the outputs
        "num_generations": shape["num_generations"],
        "per_device_train_batch_size": shape["per_device_train_batch_size"],
        "gradient_accumulation_steps": shape["gradient_accumulation_steps"],
        "max_completion_length": completion,
        "generation_kwargs": generation_kwargs,
        "max_steps": steps,
        "report_to": "none",
        "save_strategy": "no",
        "log_completions": False,
        "bf16": cuda,
        "use_cpu": not cuda,
        "model_init_kwargs": {"dtype": "bfloat16" if cuda else "float32", "attn_implementation": attention},
        "use_vllm": use_vllm,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": VLLM_GPU_MEMORY_UTILIZATION,
        "vllm_max_model_length": max(prompt_tokens) + completion,
    }
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, **settings)
        peft_config = None
        if use_lora:
            lora = grpo_demo.LORA_DEFAULTS
            peft_config = LoraConfig(
                r=lora["lora_r"],
                lora_alpha=lora["lora_alpha"],
                lora_dropout=lora["lora_dropout"],
                target_modules=lora["lora_target_modules"],
                task_type="CAUSAL_LM",
            )
        start = time.perf_counter()
        trainer = GRPOTrainer(
            model=str(folder),
            processing_class=tokenizer,
            reward_funcs=grpo_demo.REWARD_FUNCS,
            args=args,
            train_dataset=dataset,
            peft_config=peft_config,
        )
        setup_seconds = time.perf_counter() - start  # loading the model, and starting vLLM
        timer = step_timer()
        trainer.add_callback(timer)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    completions_per_step = args.generation_batch_size
    later = timer.seconds[1:] or timer.seconds
    mean_step = sum(later) / len(later)
    tokens_per_step = sum(lengths[1:] or lengths) / len(lengths[1:] or lengths) * completions_per_step
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {
        "variant": name,
        "lora": use_lora,
        "generation": "vllm (colocate)" if use_vllm else "transformers",
        "steps": len(timer.seconds),
        "step_seconds": timer.seconds,
        "setup_s": setup_seconds,
        "first_step_s": timer.seconds[0],
        "mean_step_s": mean_step,
        "completions_per_step": completions_per_step,
        "prompts_per_step": completions_per_step // args.num_generations,
        "mean_prompt_tokens": sum(prompt_tokens) / len(prompt_tokens),
        "mean_completion_tokens": sum(lengths) / len(lengths),
        "generated_tokens_per_s": tokens_per_step / mean_step,
        "trainable_params": trainable,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "max_device_used_gib": max(timer.device_used) if timer.device_used else None,
        "attention": attention,
        "activation_checkpointing": getattr(args, "activation_checkpointing", None),
    }


def environment() -> dict:
    from grpo_kit import record

    return {"versions": record.package_versions(), "hardware": record.hardware()}


def _gib(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[dict]) -> str:
    lines = [
        "| variant | generation | trainable params | setup (s) | first step (s) | step (s) | generated tokens/s "
        "| peak GPU memory, torch (GiB) | GPU memory in use (GiB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][:120]} | | | | | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {r['generation']} | {r['trainable_params'] / 1e6:,.2f} M | {r['setup_s']:.0f} "
            f"| {r['first_step_s']:.1f} "
            f"| {r['mean_step_s']:.2f} | {r['generated_tokens_per_s']:,.0f} | {_gib(r['peak_reserved_gib'])} "
            f"| {_gib(r['max_device_used_gib'])} |"
        )
    return "\n".join(lines)


def _child(argv: list[str], timeout: int) -> tuple[int, str]:
    """Run this script again with `argv`, in its own process; (return code, the tail of its output)."""
    done = subprocess.run(
        [sys.executable, __file__, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout[-3000:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)}; default: all that can run")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per variant (the first is warm-up)")
    parser.add_argument("--tokenizer", help="a local tokenizer folder (e.g. a Qwen2.5 download); default: built here")
    parser.add_argument("--json", default="outputs/gpu_throughput.json", help="where the numbers are written")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, 16 tokens, CPU allowed: the code path")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per variant before it counts as failed")
    parser.add_argument("--_build", help=argparse.SUPPRESS)  # internal: build the model into this folder
    parser.add_argument("--_variant", help=argparse.SUPPRESS)  # internal: run one variant on --_model
    parser.add_argument("--_model", help=argparse.SUPPRESS)
    parser.add_argument("--_result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._build:
        build_assets(Path(args._build), args.dry_run, args.tokenizer)
        return
    if args._variant:
        result = run_variant(args._variant, Path(args._model), args.steps, args.dry_run)
        Path(args._result).write_text(json.dumps(result), encoding="utf-8")
        return

    has_vllm = importlib.util.find_spec("vllm") is not None
    default = ["full", "lora"] + (["full-vllm", "lora-vllm"] if has_vllm and not args.dry_run else [])
    names = args.variants.split(",") if args.variants else default
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    shared = ["--steps", str(args.steps)] + (["--dry-run"] if args.dry_run else [])
    shared += ["--tokenizer", args.tokenizer] if args.tokenizer else []

    results = []
    with tempfile.TemporaryDirectory() as work:
        model_dir, start = Path(work) / "model", time.monotonic()
        code, output = _child([*shared, "--_build", str(model_dir)], args.timeout)
        if code != 0:
            sys.exit(f"Building the model failed:\n{output}")
        print(f"Model built in {time.monotonic() - start:.0f} s: {model_dir}", flush=True)
        for name in names:
            result_file = Path(work) / f"{name}.json"
            start = time.monotonic()
            try:
                code, output = _child(
                    [*shared, "--_variant", name, "--_model", str(model_dir), "--_result", str(result_file)],
                    args.timeout,
                )
            except subprocess.TimeoutExpired:
                code, output = -1, f"timed out after {args.timeout} s"
            if code == 0 and result_file.is_file():
                results.append(json.loads(result_file.read_text(encoding="utf-8")))
            else:
                results.append({"variant": name, "error": output.strip().splitlines()[-1] if output.strip() else "?"})
                print(output, file=sys.stderr)
            print(f"{name}: {time.monotonic() - start:.0f} s", flush=True)

    shape = DRY_RUN if args.dry_run else REFERENCE
    prompts = shape["per_device_train_batch_size"] * shape["gradient_accumulation_steps"] // shape["num_generations"]
    print(
        f"\nGRPO, {'tiny model (dry run)' if args.dry_run else 'Qwen2.5-1.5B-Instruct shape, random weights'}: "
        f"{prompts} prompts x {shape['num_generations']} generations x {shape['completion']} tokens per step, "
        f"{args.steps} steps per variant (step time: mean after the first)\n"
    )
    print(table(results))
    report = {"settings": {**shape, "steps": args.steps, "dry_run": args.dry_run}, **environment(), "results": results}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nWritten to {path}")
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
