"""`ridgeline bench long-context`: prefill and decode speed by context length, and where the time goes.

For each length L (512 ... 8,000 and the model's maximum by default): one prompt of L token ids,
prefill tok/s = L / time to first token (the engine's chunked prefill), then decode tok/s at depth L
over --decode-tokens tokens; best of --repeats. Beside them:
- the attention share of a prefill step: one decoder layer's matmuls and attention timed apart in CPU
  time (measure/attn_profile.py), and the FLOP share the advisor counts (a n^2 / 2 against 2 P n);
- decode against its bandwidth floor: (weight bytes + KV bytes at depth L) / the measured read
  bandwidth (the advisor's machine profile) as tok/s, and the share of it reached;
- llama.cpp's pp and tg rates at the same lengths when given its `llama-bench -o json` output
  (entries with n_prompt / n_gen / n_depth and avg_ts).
Ratios within one run are what to read; absolute rates move with the machine's load.
"""
from __future__ import annotations

import json

from ridgeline.bench.decode import read_bytes_per_token, ridgeline_decode_timing
from ridgeline.errors import InvalidRequestError
from ridgeline.measure.attn_profile import LayerShape, profile_prefill


def parse_lengths(text: str, longest: int) -> list[int]:
    """'512,2048,max' -> sorted lengths, none past `longest` (what 'max' stands for)."""
    out = set()
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        if part == "max":
            out.add(longest)
        elif part.isdigit() and int(part) > 0:
            out.add(min(int(part), longest))
        else:
            raise InvalidRequestError(f"--lengths: {part!r} is neither a positive integer nor 'max'", "lengths")
    if not out:
        raise InvalidRequestError("--lengths names no length", "lengths")
    return sorted(out)


def llama_bench_rates(path: str) -> dict[str, dict[int, float]]:
    """llama-bench JSON -> {"pp": {n_prompt: tok/s}, "tg": {depth: tok/s}} (the best entry of each)."""
    try:
        entries = json.loads(open(path).read())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidRequestError(f"--llama-bench {path}: {e}", "llama_bench") from None
    if isinstance(entries, dict):
        entries = [entries]
    rates: dict[str, dict[int, float]] = {"pp": {}, "tg": {}}
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or "avg_ts" not in e:
            continue
        n_prompt, n_gen, depth = int(e.get("n_prompt", 0)), int(e.get("n_gen", 0)), int(e.get("n_depth", 0))
        kind, n = ("pp", n_prompt + depth) if n_gen == 0 and n_prompt else ("tg", depth) if n_gen else (None, 0)
        if kind:
            rates[kind][n] = max(rates[kind].get(n, 0.0), float(e["avg_ts"]))
    return rates


def prompt_ids(length: int, vocab: int, seed: int) -> list[int]:
    """Deterministic token ids away from the special ones (the content does not change the speed)."""
    return [(1000 + 7919 * seed + 31 * j + (j * j) % 97) % (vocab - 200) + 100 for j in range(length)]


def measure(eng, lengths: list[int], decode_tokens: int, repeats: int, profile_threads: int = 1) -> list[dict]:
    import torch

    info = eng.info
    arch = eng.arch
    from ridgeline.advisor.model_config import spec_from_arch
    spec = spec_from_arch(arch, "model")
    shape = LayerShape.of(arch)
    kv_per_token = info.kv_bytes / info.kv_capacity_tokens
    wbytes = read_bytes_per_token(info, arch)
    chunk = eng.config.scheduler.max_num_batched_tokens
    rows = []
    for L in lengths:
        # a distinct prompt per run: a repeated one would be served from the prefix cache
        runs = [ridgeline_decode_timing(eng, prompt_ids(L, arch.vocab_size, L * 64 + i), decode_tokens,
                                        f"long-{L}-{i}") for i in range(repeats)]
        prev = torch.get_num_threads()
        torch.set_num_threads(profile_threads)
        try:
            prof = profile_prefill(shape, L, chunk, info.dtype, info.kv_dtype, eng.config.cache.block_size)
        finally:
            torch.set_num_threads(prev)
        att_flops = spec.attn_flops_per_pair * L * L / 2
        lin_flops = 2 * (spec.matmul_params - spec.vocab_size * spec.hidden_size) * L
        rows.append({"length": L, "prefill_tok_per_s": max(L / r["ttft_s"] for r in runs),
                     "decode_tok_per_s": max(r["decode_tok_per_s"] for r in runs),
                     "attention_share_time": prof.attention_share, "attention_share_flops": att_flops / (
                         att_flops + lin_flops), "attention_gflops": prof.attention_gflops,
                     "matmul_gflops": prof.matmul_gflops, "decode_bytes_per_token": wbytes + kv_per_token * L})
    return rows

