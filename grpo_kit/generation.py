"""Completions of chat prompts: greedy in left-padded batches (transformers), n samples per prompt from one
prefill, greedy and sampled with vLLM, and one sample for `--ask`.

Decoding for evaluation is greedy with no repetition penalty (a model's own generation config may ask for sampling
or a penalty: both are overridden), so the transformers and vLLM paths score the same completions up to numerics.
"""

from __future__ import annotations

from typing import NamedTuple

ASK_TEMPERATURE, ASK_TOP_P = 0.8, 0.95  # a sample, as a user would see it, not the greedy evaluation answer


class Generation(NamedTuple):
    text: str  # the completion, special tokens removed
    tokens: int  # generated tokens, the end-of-turn token included
    truncated: bool  # stopped at max_new_tokens without an end-of-turn token


def prompt_ids(tokenizer, prompts: list[list[dict]]) -> list[list[int]]:
    """Token ids of chat prompts, ready for the assistant's turn: the chat template writes any BOS itself."""
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def pad_id(tokenizer) -> int:
    """The id batches are padded with (models.set_pad_token gives every run's tokenizer one)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_pad(sequences: list[list[int]], pad: int):
    """(input_ids, attention_mask) with every prompt ending in the last column, where generation continues."""
    import torch

    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, width - len(seq) :] = 1
    return input_ids, attention_mask


def stop_ids(model, tokenizer) -> list[int]:
    """Every token that ends a turn: the tokenizer's and the generation config's (Qwen lists two)."""
    configured = model.generation_config.eos_token_id
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return sorted({*configured, tokenizer.eos_token_id} - {None})


def generate_greedy(
    model,
    tokenizer,
    prompts: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    desc: str = "GSM8K",
    progress: bool = True,
) -> list[Generation]:
    """Greedy completions of chat prompts, in input order, generated in left-padded batches with the KV cache.

    Prompts run longest first (similar lengths share a batch, and running out of memory happens at once, not at
    the end). The model is put in eval mode and back in the mode it was in; the tokenizer is not modified. The
    number of `generate` calls depends only on len(prompts) and batch_size (ZeRO-3 generation is collective).
    """
    import torch
    from tqdm.auto import tqdm

    encoded = prompt_ids(tokenizer, prompts)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    stops, pad = stop_ids(model, tokenizer), pad_id(tokenizer)
    results: list[Generation | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    try:
        bar = tqdm(total=len(encoded), desc=desc, unit="q", leave=False, disable=not progress)
        with torch.no_grad(), bar:  # not inference_mode: a buffer made here may meet autograd when training resumes
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                input_ids, attention_mask = left_pad([encoded[i] for i in batch], pad)
                output = model.generate(
                    input_ids=input_ids.to(model.device),
                    attention_mask=attention_mask.to(model.device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    repetition_penalty=1.0,
                    use_cache=True,  # the trainer turns config.use_cache off for training; generation wants it
                    eos_token_id=stops,
                    pad_token_id=pad,
                )
                for i, ids in zip(batch, output[:, input_ids.shape[1] :].tolist(), strict=True):
                    results[i] = finished(ids, stops, tokenizer)
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return results


def generate_samples(
    model,
    tokenizer,
    prompts: list[list[dict]],
    samples: int,
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
    seed: int,
    desc: str = "GSM8K samples",
    progress: bool = True,
) -> list[list[Generation]]:
    """`samples` sampled completions of each chat prompt (full softmax at `temperature`: no top-p or top-k), in
    input order, from one encoding of each prompt: a batch of prompts is run through the model once (the prefill),
    its KV cache repeated `samples` times, and every continuation sampled from it. `batch_size` counts completions;
    a batch holds batch_size // samples prompts (at least one).

    Seeded, without touching the random state training goes on with; the number of model calls depends only on
    len(prompts), samples and batch_size (ZeRO-3's forward and `generate` are collective).
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    encoded = prompt_ids(tokenizer, prompts)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    stops, pad = stop_ids(model, tokenizer), pad_id(tokenizer)
    per_batch = max(1, batch_size // samples)
    results: list[list[Generation] | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    devices = [model.device] if model.device.type == "cuda" else []
    try:
        bar = tqdm(total=len(encoded), desc=desc, unit="q", leave=False, disable=not progress)
        with torch.no_grad(), bar, torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for start in range(0, len(order), per_batch):
                batch = order[start : start + per_batch]
                input_ids, attention_mask = left_pad([encoded[i] for i in batch], pad)
                input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
                cache = DynamicCache(config=model.config)
                model(  # the prefill, once per prompt: every token but the last, which `generate` feeds itself
                    input_ids=input_ids[:, :-1],
                    attention_mask=attention_mask[:, :-1],
                    position_ids=(attention_mask[:, :-1].cumsum(-1) - 1).clamp(min=0),  # as `generate` counts them
                    cache=cache,
                    use_cache=True,
                )
                cache.batch_repeat_interleave(samples)
                output = model.generate(
                    input_ids=input_ids.repeat_interleave(samples, dim=0),
                    attention_mask=attention_mask.repeat_interleave(samples, dim=0),
                    cache=cache,
                    max_new_tokens=max_new_tokens,
                    do_sample=True,
                    temperature=temperature,
                    top_p=1.0,
                    top_k=0,
                    repetition_penalty=1.0,
                    use_cache=True,
                    eos_token_id=stops,
                    pad_token_id=pad,
                )
                rows = output[:, input_ids.shape[1] :].tolist()
                for j, i in enumerate(batch):
                    results[i] = [finished(ids, stops, tokenizer) for ids in rows[j * samples : (j + 1) * samples]]
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return results


def finished(ids: list[int], stops: list[int], tokenizer) -> Generation:
    """A generated sequence cut after its first end-of-turn token (what follows is padding)."""
    end = next((k for k, token in enumerate(ids) if token in stops), None)
    length = len(ids) if end is None else end + 1
    return Generation(tokenizer.decode(ids[:length], skip_special_tokens=True), length, end is None)


def vllm_engine(
    model_path: str,
    *,
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    gpu_memory_utilization: float = 0.9,
    max_model_length: int | None = None,
):
    """One vLLM engine for every evaluation of a model (GPU, vllm installed): it reserves its share of the GPU's
    memory once."""
    from pathlib import Path

    if (Path(model_path) / "adapter_config.json").is_file():
        raise ValueError(
            f"{model_path} holds a LoRA adapter, not a model: vLLM needs full weights. "
            "Merge it (python -m grpo_kit.merge), or evaluate without use_vllm"
        )
    try:
        from vllm import LLM
    except ImportError as err:
        raise ImportError(
            "use_vllm needs vLLM, which is not installed: pip install -r requirements-gpu.txt (or evaluate without it)"
        ) from err
    return LLM(
        model=str(model_path),
        tokenizer=str(model_path),
        dtype=dtype,
        revision=revision,
        trust_remote_code=trust_remote_code,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_length,
        seed=0,
    )


def generate_vllm(
    llm,
    tokenizer,
    prompts: list[list[dict]],
    max_new_tokens: int,
    *,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
) -> tuple[list[Generation], list[list[Generation]] | None]:
    """Greedy completions from a vLLM engine, on the same token ids as `generate_greedy`, and with `samples` > 0
    that many sampled ones per prompt (full softmax at `temperature`, seeded): one request with `n`, which vLLM
    prefills once for all its samples."""
    from vllm import SamplingParams

    # vLLM stops at the end of sequence of the tokenizer it reads from the folder, and at the generation config's;
    # this tokenizer's is added, which models.stop_at_end_of_turn may have set to where the template ends a turn.
    stops = {"max_tokens": max_new_tokens, "stop_token_ids": [tokenizer.eos_token_id]}
    requests = [{"prompt_token_ids": ids} for ids in prompt_ids(tokenizer, prompts)]
    greedy = llm.generate(requests, SamplingParams(temperature=0, **stops))
    sampled = None
    if samples > 0:
        params = SamplingParams(n=samples, temperature=temperature, top_p=1.0, seed=seed, **stops)
        sampled = [[_vllm_generation(c) for c in o.outputs] for o in llm.generate(requests, params)]
    return [_vllm_generation(o.outputs[0]) for o in greedy], sampled


def _vllm_generation(output) -> Generation:
    return Generation(output.text, len(output.token_ids), output.finish_reason == "length")


def sample(model, tokenizer, messages: list[dict], max_new_tokens: int, seed: int) -> str:
    """One sampled answer (ASK_TEMPERATURE, ASK_TOP_P) to a chat prompt, seeded."""
    import torch
    from transformers import set_seed

    input_ids = torch.tensor(prompt_ids(tokenizer, [messages]), device=model.device)
    set_seed(seed)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=ASK_TEMPERATURE,
            top_p=ASK_TOP_P,
            eos_token_id=stop_ids(model, tokenizer),
            pad_token_id=pad_id(tokenizer),
        )
    return tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
