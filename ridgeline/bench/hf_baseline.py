"""Hugging Face transformers baselines on the same folder, dtype and token-id prompts.

- one request at a time: `model.generate()` per prompt (optionally on an evenly spaced subsample,
  whose tok/s rates stand in for the whole workload);
- padded batches: left-padded `generate()` over `batch_size` prompts at a time, in workload order;
- batch-1 decode timing: a streamer timestamps every generated token.

EOS is ignored the way transformers allows it: min_new_tokens == max_new_tokens, so every request
produces exactly output_len tokens (EOS is masked out rather than sampled and passed over).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ridgeline.bench.report import RunResult


def unavailable(wanted: bool, machine: dict) -> str | None:
    """Why an asked-for baseline cannot run on this machine (`machine_info()` found no transformers), or None.
    The bench then reports Ridgeline's figures alone and ends with this line."""
    if wanted and machine.get("transformers") is None:
        return ("no HF baseline: transformers is not installed; `pip install transformers` (or the test extras, "
                "`pip install -e '.[test]'`) adds it, --baseline none skips it")
    return None


def load_model(folder: str | Path, dtype: torch.dtype):
    import transformers
    from ridgeline.gguf.source import source_gguf
    linked = source_gguf(Path(folder))
    if linked is not None:  # a GGUF model: transformers reads a folder's safetensors, written once for it
        from ridgeline.gguf.convert import ensure_converted
        folder = ensure_converted(linked, weights=True)
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
    model.load_seconds = time.perf_counter() - t0
    return model


def _pad_id(model) -> int:
    gc = model.generation_config
    for v in (gc.pad_token_id, gc.eos_token_id, model.config.pad_token_id):
        if isinstance(v, (list, tuple)):
            v = v[0] if v else None
        if v is not None:
            return int(v)
    return 0


def _gen_kwargs(model, output_len: int) -> dict:
    return dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, num_beams=1,
                pad_token_id=_pad_id(model), temperature=None, top_p=None, top_k=None)


def _generate(model, batch: list[list[int]], output_len: int, **extra) -> list[list[int]]:
    """Greedy generate on a left-padded batch; returns each row's new tokens."""
    pad = _pad_id(model)
    width = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, **_gen_kwargs(model, output_len), **extra)
    return out[:, width:].tolist()


def warm_up(model, batch_size: int = 1) -> None:
    _generate(model, [[1, 2, 3, 4, 5, 6, 7, 8]] * batch_size, 4)


def subsample(n: int, k: int | None) -> list[int]:
    """k evenly spaced indices of range(n) (all of them when k is None or >= n)."""
    if k is None or k >= n:
        return list(range(n))
    return sorted({int(i * n / k) for i in range(k)})


def one_at_a_time(model, prompts: list[list[int]], output_len: int, num_requests: int | None = None,
                  progress: bool = True) -> tuple[RunResult, dict[int, list[int]]]:
    idx = subsample(len(prompts), num_requests)
    warm_up(model)
    outputs: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    for i in tqdm(idx, desc="HF one at a time", unit="req", disable=not progress):
        outputs[i] = _generate(model, [prompts[i]], output_len)[0]
    elapsed = time.perf_counter() - t0
    res = RunResult("HF one-at-a-time", len(idx), sum(len(prompts[i]) for i in idx),
                    sum(len(o) for o in outputs.values()), elapsed, total_requests=len(prompts))
    if res.subsampled:
        res.note = (f"measured on {len(idx)} of {len(prompts)} requests (evenly spaced); tok/s extrapolated, "
                    f"est. {res.est_full_elapsed:.0f}s for all")
    return res, outputs


def padded_batches(model, prompts: list[list[int]], output_len: int, batch_size: int = 64,
                   num_requests: int | None = None, progress: bool = True) -> RunResult:
    """Left-padded batches in workload order; num_requests limits the run to the first whole batches."""
    n = len(prompts)
    if num_requests is not None and num_requests < n:
        n = max(num_requests - num_requests % batch_size, min(batch_size, n))
    batches = [prompts[i:i + batch_size] for i in range(0, n, batch_size)]
    warm_up(model, min(batch_size, 4))
    out_tokens, padded = 0, 0
    t0 = time.perf_counter()
    for b in tqdm(batches, desc=f"HF batch {batch_size}", unit="batch", disable=not progress):
        out_tokens += sum(len(o) for o in _generate(model, b, output_len))
        padded += max(map(len, b)) * len(b)
    elapsed = time.perf_counter() - t0
    name = f"HF batch-{batch_size}"
    used = sum(len(p) for p in prompts[:n])
    res = RunResult(name, n, used, out_tokens, elapsed, total_requests=len(prompts),
                    extra={"padded_prompt_tokens": padded})
    note = f"left-padded: {padded} prompt positions computed for {used} real tokens"
    if res.subsampled:
        note += f"; measured on the first {n} of {len(prompts)} requests, est. {res.est_full_elapsed:.0f}s for all"
    res.note = note
    return res


class _TokenClock:
    """A transformers streamer that only records when each put() arrives (prompt first, then tokens)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def decode_timing(model, prompt: list[int], output_len: int) -> dict:
    """Batch-1 greedy generate of output_len + 1 tokens: time to the first token, then the rate of the
    remaining output_len tokens (pure decode steps)."""
    clock = _TokenClock()
    t0 = time.perf_counter()
    tokens = _generate(model, [prompt], output_len + 1, streamer=clock)[0]
    stamps = clock.times[1:]  # drop the prompt's put()
    decode_s = stamps[-1] - stamps[0]
    return {"ttft_s": stamps[0] - t0, "decode_s": decode_s, "decode_tokens": len(stamps) - 1,
            "decode_tok_per_s": (len(stamps) - 1) / decode_s, "token_ids": tokens}
