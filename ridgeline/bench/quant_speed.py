"""The three speeds of `ridgeline bench quant`, each on a loaded engine, prefix caching off:

    decode_b1   one request's decode tok/s (bench decode's timing: first token to last, prefill excluded)
    prefill     P distinct prompts of L tokens added at once, 1 output token each: prompt tokens / seconds
    decode_bN   N requests of short distinct prompts decoding together: tokens generated after every
                request has its first token, over the time since then
Best of `repeats` after a warm-up of each; distinct prompts per run, so nothing is served from a cache.
"""
from __future__ import annotations

import time

from ridgeline.bench.decode import ridgeline_decode_timing


def distinct_prompts(n: int, length: int, salt: int, vocab: int) -> list[list[int]]:
    """Deterministic token ids in [100, vocab): no two prompts share a first block."""
    return [[(1000 + 7919 * (salt * 131 + i) + 31 * j) % (vocab - 100) + 100 for j in range(length)]
            for i in range(n)]


def _run_batch(eng, prompts: list[list[int]], max_tokens: int, tag: str) -> tuple[float, float, int]:
    """(seconds until every request has its first token, seconds after that, tokens generated after it)."""
    from ridgeline.sampling_params import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    reqs = [eng.requests[r] for r in ids]
    try:
        while min(r.num_output_tokens for r in reqs) < 1:
            eng.step(emit_unfinished=False)
        t1, n1 = time.perf_counter(), sum(r.num_output_tokens for r in reqs)
        while not all(r.status.finished for r in reqs):
            eng.step(emit_unfinished=False)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, sum(r.num_output_tokens for r in reqs) - n1
    finally:
        for rid in ids:
            eng.abort_request(rid)


def measure_speeds(eng, repeats: int, output_len: int, prefill_prompts: int, prefill_len: int,
                   batch: int) -> dict:
    vocab = eng.arch.vocab_size
    prompt = distinct_prompts(1, 32, 0, vocab)[0]
    ridgeline_decode_timing(eng, prompt, 4, "bq-warm")
    decode = max(ridgeline_decode_timing(eng, distinct_prompts(1, 32, 1 + r, vocab)[0], output_len,
                                         f"bq-d{r}")["decode_tok_per_s"] for r in range(repeats))
    _run_batch(eng, distinct_prompts(2, prefill_len, 50, vocab), 1, "bq-pw")
    pre = []
    for r in range(repeats):
        prompts = distinct_prompts(prefill_prompts, prefill_len, 100 + r, vocab)
        pre.append(len(prompts) * prefill_len / _run_batch(eng, prompts, 1, f"bq-p{r}")[0])
    dec_n = []
    for r in range(repeats):
        _, secs, toks = _run_batch(eng, distinct_prompts(batch, 16, 200 + r, vocab), output_len + 1, f"bq-b{r}")
        dec_n.append(toks / secs)
    return {"decode_b1_tok_s": decode, "prefill_tok_s": max(pre), "decode_batch_tok_s": max(dec_n)}
