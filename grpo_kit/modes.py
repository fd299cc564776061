"""The runs that train nothing: `--eval_only` (GSM8K accuracy of a saved model) and `--ask` (one sampled answer)."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path

from grpo_kit import evaluation, generation, models, reports


def ask(question: str, model_args, training_args, answer_format) -> None:
    """Print a sampled answer of `--model_name_or_path` to `question`, in the recipe's prompt (one process:
    `checks.evaluation_processes` refuses several)."""
    tokenizer = models.load_tokenizer(model_args, training_args)
    model = models.load_for_inference(model_args, training_args)
    messages = answer_format.chat_prompt(question)
    print(generation.sample(model, tokenizer, messages, training_args.max_completion_length, training_args.seed))


def evaluate_only(test_rows, train_rows, run, training_args, model_args, answer_format) -> list[dict]:
    """GSM8K accuracy of `--model_name_or_path` into `<output_dir>/eval/<name>/` (the output folder is the model's
    own when it is a local folder and none is given: `settings.resolve`): `final` for a trained model (a folder a
    training run saved), `baseline` for a start model; then the comparison, where the two are comparable. An
    evaluation of that name made on other terms (another model, other questions or length) is kept, and this one
    is written beside it (`final-2`, ...).

    Each protocol of `--eval_protocols` is its own evaluation (`final`, `final-kshot`, ...; k-shot examples from
    `train_rows`), with pass@k and maj@k where `--eval_samples` asks. Under `accelerate launch` every process
    evaluates its share; with `--use_vllm` one vLLM engine does it all. Returns the summaries.
    """
    from accelerate import PartialState

    path, output_dir = model_args.model_name_or_path, training_args.output_dir
    trained = (Path(path) / "trainer_state.json").is_file()
    rows = list(islice(test_rows, run.eval_limit))
    tokenizer = models.load_tokenizer(model_args, training_args)
    sampling = evaluation.sampling(run, training_args)
    protocols = evaluation.protocols(run, answer_format, test_rows, train_rows, training=False)  # before the weights
    if training_args.use_vllm:
        fits(tokenizer, protocols, rows, training_args)
        engine = generation.vllm_engine(
            path,
            dtype=models.inference_dtype(model_args, training_args),
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
            gpu_memory_utilization=training_args.vllm_gpu_memory_utilization,
            max_model_length=training_args.vllm_max_model_length,
        )
    else:
        model = models.load_for_inference(model_args, training_args)
    summaries = []
    for protocol in protocols:
        terms = {
            "model": path,
            "questions_sha256": evaluation.questions_fingerprint(rows),
            "max_new_tokens": training_args.max_completion_length,
            "protocol": protocol.name,
            "protocol_details": protocol.details or None,
            "sampling": sampling or None,
        }
        name = reports.free_name(
            output_dir, reports.eval_name("final" if trained else "baseline", protocol.name), terms
        )
        settings = dict(
            max_new_tokens=training_args.max_completion_length,
            batch_size=run.eval_batch_size,
            model_name=path,
            protocol=protocol,
            **sampling,
        )
        if training_args.use_vllm:
            prompts = [protocol.prompt(row["question"]) for row in rows]
            generations, sampled = generation.generate_vllm(
                engine, tokenizer, prompts, training_args.max_completion_length, **sampling
            )
            summary, records = evaluation.evaluate(
                None, tokenizer, rows, answer_format, generations=generations, sampled=sampled, **settings
            )
        else:
            summary, records = evaluation.evaluate(
                model, tokenizer, rows, answer_format, desc=f"GSM8K {name}", **settings
            )
        summary["split"] = run.eval_split
        if trained:
            summary["start_model"] = reports.start_model_of(path)
        if PartialState().is_main_process:
            reports.write_report(output_dir, name, summary, records)
            reports.compare(output_dir, protocol.name)
        summaries.append(summary)
    return summaries


def fits(tokenizer, protocols, rows, training_args) -> None:
    """Stop before vLLM starts where a prompt and its completion would not fit `--vllm_max_model_length` (k-shot
    prompts are long): vLLM would refuse it midway."""
    limit = training_args.vllm_max_model_length
    if not limit:
        return
    for protocol in protocols:
        longest = evaluation.longest_prompt(tokenizer, [protocol.prompt(row["question"]) for row in rows])
        if longest + training_args.max_completion_length > limit:
            sys.exit(
                f"The {protocol.name} protocol's longest prompt ({longest} tokens) and --max_completion_length "
                f"{training_args.max_completion_length} exceed --vllm_max_model_length {limit}: raise it, or lower "
                "--eval_shots or --max_completion_length"
            )
