"""int4 K stores the key at position 0 (the attention sink) minus a center of its own: every attention
path (C per-row and split-KV decode, C tiled prefill, SDPA) adds the difference of the centers back,
so attention equals float attention within int4's bound, and the sink's rounding error shrinks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ridgeline.kernels import cpu, cpu_attention
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.attention import PagedSDPA
from ridgeline.layers.forward_context import AttnGroup
from ridgeline.layers.kv_cache import allocate_kv

needs_c = pytest.mark.skipif(cpu.lib() is None, reason="no C kernels on this machine")
NB, BS, HKV, G, D, SEQS, LEN = 80, 16, 3, 3, 64, 3, 400
BOUND = 0.2  # int4's bound of tests/test_kv_quant.py


def _keys(g):
    """Keys as a rotary model has them: an offset per channel, and a position-0 key (the sink) far from
    the others and nearly the same in every sequence; queries that attend to the sink most."""
    offset, sink = torch.randn(HKV, D, generator=g) * 4, torch.randn(HKV, D, generator=g) * 12
    k = offset + torch.randn(SEQS, LEN, HKV, D, generator=g)
    k[:, 0] = sink + 0.05 * torch.randn(SEQS, HKV, D, generator=g)
    return offset, sink, k, torch.randn(SEQS, LEN, HKV, D, generator=g), _queries(sink, SEQS, g)


def _queries(sink, n, g):
    """n rows whose score of the sink key stands ~6 above the others' (about half their attention)"""
    toward = sink.repeat_interleave(G, 0)
    return toward * (48 / toward.pow(2).sum(-1, keepdim=True)) + torch.randn(n, HKV * G, D, generator=g)


def _cache(offset, sink, k, v, g):
    kv = allocate_kv(KVCacheSpec(KV_FORMATS["int4"], 1, HKV, D, BS), NB, torch.device("cpu"))[0]
    kv.set_centers(offset, sink)
    tables = (torch.randperm(NB - 1, generator=g)[:SEQS * (LEN // BS)] + 1).view(SEQS, LEN // BS)
    pos = torch.arange(LEN)
    for s in range(SEQS):  # two writes per sequence: position 0 is written once, in the first
        slots = tables[s, pos // BS] * BS + pos % BS
        kv.write(slots[:7], k[s, :7], v[s, :7], pos[:7])
        kv.write(slots[7:], k[s, 7:], v[s, 7:], pos[7:])
    return kv, tables


def _float(q, k, v, lens, window):
    out = []
    for s in range(len(q)):
        n = int(lens[s])
        lo = max(0, n - window) if window else 0
        kk, vv = k[s, lo:n].repeat_interleave(G, 1), v[s, lo:n].repeat_interleave(G, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[s], kk) * D ** -0.5, -1)
        out.append(torch.einsum("hn,nhd->hd", p, vv).reshape(-1))
    return torch.stack(out)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@needs_c
@pytest.mark.parametrize("window", [None, 150])
def test_every_attention_path_adds_the_sink_center_back(window):
    g = torch.Generator().manual_seed(0)
    offset, sink, k, v, q = _keys(g)
    kv, tables = _cache(offset, sink, k, v, g)
    lens = torch.tensor([1, 130, LEN])
    want = _float(q, k, v, lens, window)
    run = dict(kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale, k0_offset=kv.k0_offset)
    decode = cpu_attention.paged_decode(q, kv.k, kv.v, tables, lens, D ** -0.5, window, **run)
    assert _rel(decode, want) < BOUND
    one = cpu_attention.paged_decode(q[2:], kv.k, kv.v, tables[2:].contiguous(), lens[2:], D ** -0.5, window, **run)
    assert torch.equal(one, decode[2:])  # split-KV (a row alone) and a task per row: the same bits
    n = np.ones(SEQS, dtype=np.int64)
    grp = AttnGroup(rows=slice(0, SEQS), start=lens.numpy() - n, n=n, block_tables=tables, key_lens=lens)
    torch.testing.assert_close(PagedSDPA()(q, kv, grp, D ** -0.5, window), decode, atol=2e-5, rtol=1e-4)
    # prompt rows of one sequence as queries at their own positions: the tiled kernel and the per-row one
    rows = torch.arange(LEN - 40, LEN)
    qr = _queries(sink, len(rows), g)
    row_seq, key_lens = torch.full((len(rows),), 2), rows + 1
    tiled = cpu_attention.paged_decode(qr, kv.k, kv.v, tables, key_lens, D ** -0.5, window, row_seq=row_seq, **run)
    per_row = cpu_attention.paged_decode(qr, kv.k, kv.v, tables, key_lens, D ** -0.5, window, row_seq=row_seq,
                                         tiled=False, **run)
    torch.testing.assert_close(tiled, per_row, atol=2e-5, rtol=1e-4)
    want_rows = torch.cat([_float(qr[i:i + 1], k[2:3], v[2:3], key_lens[i:i + 1], window) for i in range(len(rows))])
    assert _rel(tiled, want_rows) < BOUND


def test_the_sink_center_cuts_the_sink_keys_error():
    """The same keys with one center for all (the sink's own center = the others'): the sink key's
    rounding moves the attention far more."""
    errors = []
    for own in (False, True):
        g = torch.Generator().manual_seed(1)
        offset, sink, k, v, q = _keys(g)
        kv, tables = _cache(offset, sink if own else offset, k, v, g)
        lens = torch.full((SEQS,), LEN)
        n = np.ones(SEQS, dtype=np.int64)
        grp = AttnGroup(rows=slice(0, SEQS), start=lens.numpy() - n, n=n, block_tables=tables, key_lens=lens)
        errors.append(_rel(PagedSDPA()(q, kv, grp, D ** -0.5, None), _float(q, k, v, lens, None)))
    assert errors[1] < errors[0] / 2, errors


def test_int4_holds_at_least_3_5x_the_tokens_of_bf16():
    """The sink center costs no bytes per token: 36 B per 64-wide vector, K and V."""
    bf16 = KVCacheSpec(KV_FORMATS["bf16"], 30, 3, 64, 16)
    int4 = KVCacheSpec(KV_FORMATS["int4"], 30, 3, 64, 16)
    assert int4.bytes_per_token == 30 * 3 * 2 * 36
    assert bf16.bytes_per_token / int4.bytes_per_token >= 3.5


def test_eviction_must_keep_position_0_under_an_int4_k():
    from ridgeline.config import CacheConfig
    from ridgeline.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="kv_sink_tokens must be >= 1"):
        CacheConfig(kv_cache_dtype="int4", kv_eviction="streaming", kv_sink_tokens=0)
    CacheConfig(kv_cache_dtype="int8", kv_eviction="streaming", kv_sink_tokens=0)
