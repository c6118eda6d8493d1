"""Centers for K formats that store k minus a constant (kv_spec KVFormat.center: int4).

Keys share a large offset per (layer, KV head, channel) that rotary leaves nearly constant. Every
score q.k of one query moves by q.c when the same c is taken from all keys, which softmax ignores,
so storing k - c changes nothing but what the quantizer sees: the offset no longer sets the scale
of each group. c is the mean key over a fixed calibration text (the shipped eval calibration text,
never the held-out one), measured once at start-up before any block is kept, and then constant for
the engine's life (blocks in the prefix cache, the offload tier and anything another engine reads
must all use the same centers).
"""
from __future__ import annotations

import torch

from ridgeline.quant.kv import hadamard

CALIBRATION_TOKENS = 512
_SKIP = 4  # the first positions (attention sinks) have keys unlike the rest


def calibration_ids(tokenizer, n: int) -> list[int]:
    from ridgeline.eval.corpus import text
    return tokenizer.encode(text("calibration")[:16 * n])[:n]


def calibrate_k_centers(engine, num_tokens: int = CALIBRATION_TOKENS) -> int:
    """Measure and set every centered layer's k_shift; returns the tokens used (0: nothing to do)."""
    runner, kv = engine.runner, engine.kv
    layers = [layer for layer in runner.kv if layer.k_shift is not None]
    n = min(num_tokens, engine.max_model_len - 1, kv.num_free_blocks * kv.block_size)
    if not layers or n <= _SKIP:
        return 0
    ids = calibration_ids(engine.tokenizer, n)
    rid = "\0k-centers"
    if not kv.allocate(rid, len(ids)):
        return 0
    try:
        table = list(kv.tables[rid])
        runner.prefill_only(rid, ids, table)  # keys stored with a zero shift
        blocks = torch.tensor(table, dtype=torch.long, device=layers[0].k.device)
        for layer in layers:
            k, _ = layer.read(blocks, torch.float32)  # [n, bs, Hkv, D], rotated formats still rotated
            k = k.reshape(-1, *k.shape[2:])[_SKIP:len(ids)]
            if layer.k_fmt.rotate:
                k = hadamard(k)  # normalized: its own inverse
            layer.k_shift.copy_(k.mean(0))
    finally:
        kv.free(rid)  # uncached: these blocks hold uncentered keys
    return len(ids)
