"""Centers for K formats that store k minus a constant (kv_spec KVFormat.center: int4).

Keys share a large offset per (layer, KV head, channel) that rotary leaves nearly constant. Every
score q.k of one query moves by q.c when the same c is taken from all keys, which softmax ignores,
so storing k - c changes nothing but what the quantizer sees: the offset no longer sets the scale
of each group. c is the mean key over a fixed calibration text (the shipped eval calibration text,
never the held-out one), measured once at start-up before any block is kept, and then constant for
the engine's life (blocks in the prefix cache, the offload tier and anything another engine reads
must all use the same centers).

The key at position 0 is the exception: queries put much of their attention on it (an attention
sink), its key lies far from the others' mean, and past the first layers it barely depends on the
token there, so its own rounding error moved whole rows of attention. It is stored minus a center
of its own (the mean position-0 key over short calibration prompts); the attention kernels add the
difference of the two centers back to it (layers/kv_cache.py LayerKV.k_centers).
"""
from __future__ import annotations

import torch

from ridgeline.formats.kv import hadamard

CALIBRATION_TOKENS = 512
SINK_PROMPTS = 16  # one-token prompts whose position-0 keys are averaged into the sink center
_SKIP = 4  # the first positions (attention sinks) have keys unlike the rest


def calibration_ids(tokenizer, n: int) -> list[int]:
    from ridgeline.data.corpus import text
    return tokenizer.encode(text("calibration")[:16 * n])[:n]


def _keys(engine, layers, ids: list[int]) -> list[torch.Tensor] | None:
    """Every layer's stored keys of one prefilled prompt [len(ids), Hkv, D], un-rotated; None without room."""
    runner, kv = engine.runner, engine.kv
    rid = "\0k-centers"
    if not kv.allocate(rid, len(ids)):
        return None
    try:
        table, more = kv.seq_tables(rid)
        runner.prefill_only(rid, ids, table, more)  # keys stored with zero centers
        tables = [torch.tensor(t, dtype=torch.long, device=layers[0].k.device) for t in (table, *more)]
        out = []
        for layer in layers:
            k, _ = layer.read(tables[layer.kv_group], torch.float32)  # [n, bs, Hkv, D], rotated formats still rotated
            k = k.reshape(-1, *k.shape[2:])[:len(ids)]
            out.append(hadamard(k) if layer.k_fmt.rotate else k)  # normalized: its own inverse
        return out
    finally:
        kv.free(rid)  # uncached: these blocks hold uncentered keys


def calibrate_k_centers(engine, num_tokens: int = CALIBRATION_TOKENS) -> int:
    """Measure and set every centered layer's centers; returns the tokens used (0: nothing to do)."""
    kv = engine.kv
    layers = [layer for layer in engine.runner.kv if layer.k_centers is not None]
    n = min(num_tokens, engine.max_model_len - 1, kv.num_free_blocks * kv.block_size)
    if not layers or n <= _SKIP:
        return 0
    ids = calibration_ids(engine.tokenizer, n)
    keys = _keys(engine, layers, ids)
    if keys is None:
        return 0
    step = max(1, len(ids) // SINK_PROMPTS)
    sinks = [s for s in (_keys(engine, layers, [t]) for t in ids[::step][:SINK_PROMPTS]) if s is not None]
    for i, layer in enumerate(layers):
        sink = torch.stack([s[i][0] for s in sinks]).mean(0) if sinks else keys[i][0]
        layer.set_centers(keys[i][_SKIP:].mean(0), sink)
    return len(ids)
