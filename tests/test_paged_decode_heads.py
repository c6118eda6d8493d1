"""Decode attention's V pass serves several query heads per V load (up to four, at most 16
accumulators) and reads int8 V in place with its scale folded into the weights (int8 K too, dotted
in integers with q rounded to int16): every GQA ratio and head size against the SDPA backend over the
same blocks, with q rounded as the kernel reads it, across splits."""
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


@needs_c
@pytest.mark.parametrize("k_name,v_name", [("bf16", "bf16"), ("int8", "int8"), ("bf16", "int8"), ("f32", "f32")])
@pytest.mark.parametrize("G,D", [(1, 64), (2, 64), (4, 64), (5, 64), (8, 64), (3, 128), (5, 128), (3, 256)])
def test_grouped_value_pass_matches_sdpa(k_name, v_name, G, D):
    NB, bs, Hkv = 90, 16, 2
    spec = KVCacheSpec(KV_FORMATS[k_name], 1, Hkv, D, bs, KV_FORMATS[v_name])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(G * D)
    kv.write(torch.arange(NB * bs), torch.randn(NB * bs, Hkv, D, generator=g), torch.randn(NB * bs, Hkv, D, generator=g))
    key_lens = torch.tensor([1, 21, 300, 700])  # one key; inside one split; across splits (SPLIT 256)
    tables = (torch.randperm(NB - 1, generator=g)[:2 * 44] + 1).view(2, 44).repeat(2, 1)
    q = torch.randn(4, Hkv * G, D, generator=g)
    got = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, D ** -0.5, None, kv_format=kv.c_format,
                                     k_scale=kv.k_scale, v_scale=kv.v_scale)
    n = np.ones(4, dtype=np.int64)
    grp = AttnGroup(rows=slice(0, 4), start=key_lens.numpy() - n, n=n, block_tables=tables, key_lens=key_lens)
    qr = cpu_attention.decode_query_as_read(q, kv.c_format)  # bf16 K and V: q in bf16; int8: q in int16
    want = PagedSDPA()(qr, kv, grp, D ** -0.5, None)
    torch.testing.assert_close(got, want.reshape(got.shape), atol=2e-5, rtol=1e-4)


@needs_c
def test_int8_keys_read_in_place_for_queries_of_any_magnitude():
    """int8 K is dotted in integers with q rounded to int16 on a power-of-two scale of its own head: query
    heads of very different sizes (zero, tiny, huge, one outlier channel) each keep 15 bits of their own
    range, and the result matches SDPA over the same blocks with q rounded the same way."""
    NB, bs, Hkv, G, D = 40, 16, 2, 3, 64
    spec = KVCacheSpec(KV_FORMATS["int8"], 1, Hkv, D, bs, KV_FORMATS["int8"])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(3)
    kv.write(torch.arange(NB * bs), torch.randn(NB * bs, Hkv, D, generator=g), torch.randn(NB * bs, Hkv, D, generator=g))
    key_lens = torch.tensor([300, 77])
    tables = (torch.randperm(NB - 1, generator=g)[:2 * 19] + 1).view(2, 19)
    q = torch.randn(2, Hkv * G, D, generator=g)
    q[0, 0] = 0.0
    q[0, 1] *= 1e-20
    q[0, 2] *= 1e3
    q[1, 4, 7] = 40.0  # one channel far above the others: they round on its scale
    got = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, D ** -0.5, None, kv_format=kv.c_format,
                                     k_scale=kv.k_scale, v_scale=kv.v_scale)
    qr = cpu_attention.decode_query_as_read(q, kv.c_format)
    if cpu.lib().ridgeline_paged_decode_q_rounding(kv.c_format, D) == 2:
        assert torch.equal(qr[0, 0], q[0, 0]) and (qr[0, 1] - q[0, 1]).abs().max() <= 1e-20 * 2 ** -14
        assert not torch.equal(qr, q)
    n = np.ones(2, dtype=np.int64)
    grp = AttnGroup(rows=slice(0, 2), start=key_lens.numpy() - n, n=n, block_tables=tables, key_lens=key_lens)
    want = PagedSDPA()(qr, kv, grp, D ** -0.5, None)
    torch.testing.assert_close(got, want.reshape(got.shape), atol=2e-5, rtol=1e-4)


@needs_c
@pytest.mark.parametrize("k_name,v_name", [("bf16", "bf16"), ("int8", "int8"), ("f32", "f32")])
@pytest.mark.parametrize("tiled", [False, True])
def test_soft_capped_scores_match_sdpa(k_name, v_name, tiled):
    """Gemma 2's attention logit soft-cap in every C path (per-row decode and the tiled prefill kernel, each
    KV format) against the sdpa backend's cap * tanh(scores / cap) over the same blocks; a small cap, so it
    changes the result."""
    NB, bs, Hkv, G, D, cap = 40, 16, 2, 2, 64, 0.5
    spec = KVCacheSpec(KV_FORMATS[k_name], 1, Hkv, D, bs, KV_FORMATS[v_name])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(7)
    kv.write(torch.arange(NB * bs), torch.randn(NB * bs, Hkv, D, generator=g), torch.randn(NB * bs, Hkv, D, generator=g))
    tables = (torch.randperm(NB - 1, generator=g)[:20] + 1).view(1, 20)
    key_lens = torch.arange(280, 300)  # 20 prompt rows of one sequence, queries at positions 279..299
    q = torch.randn(20, Hkv * G, D, generator=g)
    row_seq = torch.zeros(20, dtype=torch.int64)
    got = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, D ** -0.5, None, row_seq=row_seq,
                                     kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale, tiled=tiled,
                                     softcap=cap)
    plain = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, D ** -0.5, None, row_seq=row_seq,
                                       kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale, tiled=tiled)
    grp = AttnGroup(rows=slice(0, 20), start=np.array([279]), n=np.array([20]), block_tables=tables,
                    key_lens=torch.tensor([299]))
    sdpa = PagedSDPA()
    sdpa.softcap = cap
    qr = q if tiled else cpu_attention.decode_query_as_read(q, kv.c_format)
    want = sdpa(qr, kv, grp, D ** -0.5, None).reshape(got.shape)
    tol = 2e-5 if k_name == "f32" or not tiled else 2e-2  # the tiled kernel reads bf16 / int8 K in bf16
    torch.testing.assert_close(got, want, atol=tol, rtol=1e-3)
    assert (got - plain).abs().max() > 10 * tol


def _sink_reference(q, keys, values, lens, sinks, scale, window):
    """transformers' eager GPT-OSS attention for each row: the sink as a last logit, dropped after the softmax.
    q [R, H, D]; keys, values [R, L, Hkv, D] each row's sequence in position order; lens [R] keys seen."""
    R, H, D = q.shape
    G = H // keys.shape[2]
    out = []
    for r in range(R):
        n = int(lens[r])
        first = max(0, n - window) if window else 0
        k, v = keys[r, first:n].repeat_interleave(G, dim=1), values[r, first:n].repeat_interleave(G, dim=1)
        s = torch.einsum("hd,lhd->hl", q[r], k) * scale
        p = torch.softmax(torch.cat([s, sinks[:, None]], dim=1), dim=1)[:, :-1]
        out.append(torch.einsum("hl,lhd->hd", p, v).reshape(-1))
    return torch.stack(out)


@needs_c
@pytest.mark.parametrize("rows", ["decode-split", "decode-rows", "prefill-tiled", "prefill-per-row"])
@pytest.mark.parametrize("window", [None, 40])
def test_attention_sinks_match_transformers_formula(rows, window):
    """GPT-OSS's sinks (one logit per query head in its softmax, no value) in every C path: decode rows split
    over threads (one row) or a task a row (many rows), the tiled prefill kernel and the per-row kernel for
    prefill rows, with and without a window; against the formula transformers computes, on fp32 K and V."""
    NB, bs, Hkv, G, D = 60, 16, 2, 3, 64
    spec = KVCacheSpec(KV_FORMATS["f32"], 1, Hkv, D, bs, KV_FORMATS["f32"])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(11)
    K, V = torch.randn(NB * bs, Hkv, D, generator=g), torch.randn(NB * bs, Hkv, D, generator=g)
    kv.write(torch.arange(NB * bs), K, V)
    table = (torch.randperm(NB - 1, generator=g)[:40] + 1).view(1, 40)
    slots = (table[0, :, None] * bs + torch.arange(bs)).reshape(-1)  # position -> slot of the one sequence
    sinks = torch.randn(Hkv * G, generator=g) * 3
    prefill = rows.startswith("prefill")
    key_lens = torch.arange(580, 600) if prefill else (torch.tensor([600]) if rows == "decode-split"
                                                       else torch.tensor([600, 31, 300, 1, 512, 77]))
    R = len(key_lens)
    q = torch.randn(R, Hkv * G, D, generator=g)
    row_seq = torch.zeros(R, dtype=torch.int64)
    tables = table if prefill else table.repeat(R, 1)
    got = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, D ** -0.5, window,
                                     row_seq=row_seq if prefill else None, tiled=rows == "prefill-tiled",
                                     sinks=sinks)
    want = _sink_reference(q, K[slots].expand(R, -1, -1, -1), V[slots].expand(R, -1, -1, -1), key_lens, sinks,
                           D ** -0.5, window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    plain = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, D ** -0.5, window,
                                       row_seq=row_seq if prefill else None, tiled=rows == "prefill-tiled")
    assert (got - plain).abs().max() > 1e-2  # the sinks change the result
    if prefill:  # the sdpa backend's sinks agree
        grp = AttnGroup(rows=slice(0, R), start=np.array([579]), n=np.array([R]), block_tables=tables,
                        key_lens=torch.tensor([599]))
        sdpa = PagedSDPA()
        sdpa.sinks = sinks
        torch.testing.assert_close(sdpa(q, kv, grp, D ** -0.5, window).reshape(got.shape), want, atol=2e-5,
                                   rtol=1e-4)


@needs_c
def test_sinks_of_the_wrong_shape_are_refused():
    spec = KVCacheSpec(KV_FORMATS["f32"], 1, 2, 64, 16, KV_FORMATS["f32"])
    kv = allocate_kv(spec, 4, torch.device("cpu"))[0]
    q = torch.randn(1, 4, 64)
    with pytest.raises(ValueError, match="sinks"):
        cpu_attention.paged_decode(q, kv.k, kv.v, torch.zeros(1, 1, dtype=torch.int64), torch.tensor([1]), 0.125,
                                   None, sinks=torch.zeros(3))
