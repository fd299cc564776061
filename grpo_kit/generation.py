"""Completions of chat prompts: greedy in left-padded batches (transformers), n samples per prompt from one prefill,
greedy and sampled with vLLM, one sample for `--ask`. Evaluation decodes greedily with no repetition penalty, whatever a
model's generation config asks, so transformers and vLLM score the same completions up to numerics."""

from contextlib import contextmanager
from functools import partial
from pathlib import Path
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
    input_ids = torch.tensor([[pad] * (width - len(s)) + list(s) for s in sequences], dtype=torch.long)
    return input_ids, torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], dtype=torch.long)


def stop_ids(model, tokenizer) -> list[int]:
    """Every token that ends a turn: the tokenizer's and the generation config's (Qwen lists two)."""
    configured = model.generation_config.eos_token_id
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return sorted({*configured, tokenizer.eos_token_id} - {None})


@contextmanager
def own_generation_config(model, stops: list[int], pad: int):
    """The model's generation config replaced, for the duration, by one that holds only its end and pad tokens: a
    model's own defaults (min_p, no_repeat_ngram_size, a repetition penalty...) would fill every value a `generate`
    call leaves unset, and the completions would not be the greedy or full-softmax ones they are reported as."""
    from transformers import GenerationConfig

    target = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT generates with the base's
    kept = target.generation_config
    target.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=pad, bos_token_id=kept.bos_token_id)
    try:
        yield
    finally:
        target.generation_config = kept


def generate_greedy(
    model, tokenizer, prompts: list[list[dict]], max_new_tokens: int, batch_size: int, desc="GSM8K", progress=True
) -> list[Generation]:
    greedy = partial(model.generate, do_sample=False)
    return [g for (g,) in _batched(model, tokenizer, prompts, batch_size, 1, max_new_tokens, greedy, desc, progress)]


def generate_samples(
    model, tokenizer, prompts, samples, temperature, max_new_tokens, batch_size, seed, desc=None, progress=True
) -> list[list[Generation]]:
    """`samples` sampled completions of each chat prompt (full softmax at `temperature`: no top-p or top-k), in
    input order, from one encoding of each prompt: a batch of prompts is run through the model once (the prefill),
    its KV cache repeated `samples` times, and every continuation sampled from it. `batch_size` counts completions
    (batch_size // samples prompts a batch, at least one). Seeded, leaving the random state training goes on with."""
    import torch
    from transformers import DynamicCache

    def prefilled(input_ids, attention_mask, **decoding):
        cache = DynamicCache(config=model.config)
        model(  # the prefill, once per prompt: every token but the last, which `generate` feeds itself
            input_ids=input_ids[:, :-1],
            attention_mask=attention_mask[:, :-1],
            position_ids=(attention_mask[:, :-1].cumsum(-1) - 1).clamp(min=0),  # as `generate` counts them
            cache=cache,
            use_cache=True,
            logits_to_keep=1,  # the cache is what is wanted: logits for every prompt token would be GBs
        )
        cache.batch_repeat_interleave(samples)
        ids, mask = (t.repeat_interleave(samples, dim=0) for t in (input_ids, attention_mask))
        full_softmax = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        return model.generate(input_ids=ids, attention_mask=mask, cache=cache, **full_softmax, **decoding)

    per_batch = max(1, batch_size // samples)
    with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []):
        torch.manual_seed(seed)
        shown = desc or "GSM8K samples"
        return _batched(model, tokenizer, prompts, per_batch, samples, max_new_tokens, prefilled, shown, progress)


def _batched(model, tokenizer, prompts, per_batch, copies, max_new_tokens, generate, desc, progress) -> list:
    """`copies` completions of each chat prompt, in input order: `generate(input_ids=, attention_mask=, ...)` of
    left-padded batches of `per_batch` prompts, with the KV cache and no repetition penalty, longest first (similar
    lengths share a batch, and running out of memory happens at once, not at the end), in eval mode (then back);
    the model calls depend only on len(prompts) and per_batch (ZeRO-3's forward and `generate` are collective)."""
    import torch
    from tqdm.auto import tqdm

    encoded = prompt_ids(tokenizer, prompts)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    stops, pad = stop_ids(model, tokenizer), pad_id(tokenizer)
    # use_cache: the trainer turns config.use_cache off for training; generation wants it
    decoding = dict(max_new_tokens=max_new_tokens, repetition_penalty=1.0, use_cache=True, eos_token_id=stops)
    results: list[list[Generation] | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    try:
        # a bar in a terminal only (disable=None): a log file gets no carriage-return frames
        bar = tqdm(total=len(encoded), desc=desc, unit="q", leave=False, disable=None if progress else True)
        # not inference_mode: a buffer made here may meet autograd when training resumes
        with torch.no_grad(), bar, own_generation_config(model, stops, pad):
            for start in range(0, len(order), per_batch):
                batch = order[start : start + per_batch]
                input_ids, attention_mask = (t.to(model.device) for t in left_pad([encoded[i] for i in batch], pad))
                output = generate(input_ids=input_ids, attention_mask=attention_mask, pad_token_id=pad, **decoding)
                rows = output[:, input_ids.shape[1] :].tolist()
                for j, i in enumerate(batch):
                    results[i] = [finished(ids, stops, tokenizer) for ids in rows[j * copies : (j + 1) * copies]]
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return results


def finished(ids: list[int], stops: list[int], tokenizer) -> Generation:
    """A generated sequence cut after its first end-of-turn token (what follows is padding)."""
    end = next((k for k, token in enumerate(ids) if token in stops), None)
    length = len(ids) if end is None else end + 1
    return Generation(tokenizer.decode(ids[:length], skip_special_tokens=True), length, end is None)


def vllm_engine(model_path: str, max_model_length: int | None = None, **options):
    """One vLLM engine for every evaluation of a model (GPU, vllm installed): it reserves its share of the GPU's
    memory once. `options`: vLLM's `dtype`, `revision`, `trust_remote_code`, `gpu_memory_utilization`."""
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
    return LLM(model=str(model_path), tokenizer=str(model_path), max_model_len=max_model_length, seed=0, **options)


def generate_vllm(
    llm, tokenizer, prompts: list[list[dict]], max_new_tokens: int, *, samples=0, temperature=1.0, seed=0
) -> tuple[list[Generation], list[list[Generation]] | None]:
    """Greedy completions from a vLLM engine, on the same token ids as `generate_greedy`, and with `samples` > 0
    that many sampled ones per prompt (full softmax at `temperature`, seeded): one request with `n`, prefilled once."""
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
    asked = dict(do_sample=True, temperature=ASK_TEMPERATURE, top_p=ASK_TOP_P, max_new_tokens=max_new_tokens)
    ends = dict(eos_token_id=stop_ids(model, tokenizer), pad_token_id=pad_id(tokenizer))
    with torch.inference_mode():
        output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **asked, **ends)
    return tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)
