"""The tiled prefill attention kernel (kernels/paged_prefill.c) on random paged caches.

Bounds, against float64 attention over the same stored K/V:
- fp32 cache (FMA tiles): 2e-6 (fp32 rounding);
- bf16 cache (vdpbf16ps tiles): q is rounded to bf16 as the per-row kernel does (the reference uses
  that q), and each softmax weight p is rounded to bf16 before p.v: |error| <= 2^-9 max|v| (a relative
  error of at most 2^-9 on every weight of a convex combination), plus fp32 noise.
Quantized caches dequantize each tile into the fp32 tiles: the per-row kernel over the same blocks
to 2e-5. Lengths are chosen off every tile size (keys in tiles of 32, blocks of 4-32, query blocks of
48 / G positions), runs start mid-sequence (chunked prefill, prefix-cache hits), G from 1 to 8.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ridgeline.kernels import cpu, cpu_attention
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.forward_context import AttnGroup
from ridgeline.layers.kv_cache import LayerKV, allocate_kv

pytestmark = pytest.mark.skipif(cpu.lib() is None, reason="no C kernels on this machine")


def _case(seed, G, D, bs, runs, kv_dtype, Hkv=2):
    """runs: (first position, rows) per sequence -> q, caches, tables, row_seq, key_lens"""
    g = torch.Generator().manual_seed(seed)
    nb = max(-(-(p + n) // bs) for p, n in runs)
    NB = len(runs) * nb + 1
    kc = torch.randn(NB, bs, Hkv, D, generator=g).to(kv_dtype)
    vc = torch.randn(NB, bs, Hkv, D, generator=g).to(kv_dtype)
    tables = (torch.randperm(NB - 1, generator=g)[: len(runs) * nb] + 1).view(len(runs), nb)
    row_seq = torch.cat([torch.full((n,), i) for i, (_, n) in enumerate(runs)])
    key_lens = torch.cat([torch.arange(p + 1, p + n + 1) for p, n in runs])
    q = torch.randn(len(row_seq), Hkv * G, D, generator=g)
    return q, kc, vc, tables, row_seq, key_lens


def _reference(q, kc, vc, tables, row_seq, key_lens, scale, window):
    bs, Hkv, D = kc.shape[1:]
    G = q.shape[1] // Hkv
    out = []
    for r in range(len(q)):
        n = int(key_lens[r])
        lo = max(0, n - window) if window else 0
        k = kc[tables[row_seq[r]]].reshape(-1, Hkv, D)[lo:n].double().repeat_interleave(G, 1)
        v = vc[tables[row_seq[r]]].reshape(-1, Hkv, D)[lo:n].double().repeat_interleave(G, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[r].double(), k) * scale, -1)
        out.append(torch.einsum("hn,nhd->hd", p, v).reshape(-1))
    return torch.stack(out)


RUNS = [(0, 37), (45, 70), (100, 3), (0, 1)]  # whole prompts, chunks after cached blocks, a lone row


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("G", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("window", [None, 5, 40])
def test_tiled_matches_float_reference_and_the_row_kernel(kv_dtype, G, window):
    D, bs = 64, 16
    q, kc, vc, tables, row_seq, key_lens = _case(G, G, D, bs, RUNS, kv_dtype)
    scale = D ** -0.5
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, scale, window, row_seq=row_seq)
    rows = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, scale, window, row_seq=row_seq, tiled=False)
    want = _reference(q.to(kv_dtype).float(), kc, vc, tables, row_seq, key_lens, scale, window)
    bound = 2e-6 if kv_dtype == torch.float32 else 2 ** -9 * float(vc.float().abs().max()) + 1e-5
    assert float((got.double() - want).abs().max()) <= bound
    assert float((got - rows).abs().max()) <= bound


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,bs", [(32, 8), (128, 4), (16, 32), (80, 16)])
def test_tiled_head_dims_and_block_sizes(kv_dtype, D, bs):
    if kv_dtype == torch.bfloat16 and D % 32:
        D = 96
    q, kc, vc, tables, row_seq, key_lens = _case(D + bs, 3, D, bs, [(7, 60), (0, 33)], kv_dtype)
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, 0.1, 50, row_seq=row_seq)
    want = _reference(q.to(kv_dtype).float(), kc, vc, tables, row_seq, key_lens, 0.1, 50)
    bound = 2e-6 if kv_dtype == torch.float32 else 2 ** -9 * float(vc.float().abs().max()) + 1e-5
    assert float((got.double() - want).abs().max()) <= bound


def test_tiled_matches_the_sdpa_backend():
    from ridgeline.layers.attention import PagedSDPA
    runs = [(20, 30), (0, 64)]
    q, kc, vc, tables, row_seq, key_lens = _case(5, 3, 64, 16, runs, torch.float32, Hkv=3)
    start, n = np.array([p for p, _ in runs]), np.array([c for _, c in runs])
    g = AttnGroup(rows=slice(0, len(q)), start=start, n=n, block_tables=tables,
                  key_lens=torch.from_numpy(start + n), row_seq=row_seq, row_key_lens=key_lens)
    sdpa = PagedSDPA()(q, LayerKV(kc, vc, "f32"), g, 0.125, 17)
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, 0.125, 17, row_seq=row_seq)
    torch.testing.assert_close(got, sdpa, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_e4m3", "f16"])
def test_tiled_over_quantized_blocks_matches_the_row_kernel(name):
    NB, bs, Hkv, G, D = 12, 16, 2, 4, 64
    spec = KVCacheSpec(KV_FORMATS[name], 1, Hkv, D, bs, KV_FORMATS[name])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(7)
    kv.write(torch.arange(NB * bs), torch.randn(NB * bs, Hkv, D, generator=g), torch.randn(NB * bs, Hkv, D, generator=g))
    tables = (torch.randperm(NB - 1, generator=g)[:10] + 1).view(2, 5)
    row_seq = torch.tensor([0] * 50 + [1] * 9)
    key_lens = torch.cat([torch.arange(31, 81), torch.arange(2, 11)])
    q = torch.randn(len(row_seq), Hkv * G, D, generator=g)
    q = cpu_attention.decode_query_as_read(q, kv.c_format)  # int8: the row kernel's int16 q, for both
    args = (q, kv.k, kv.v, tables, key_lens, 0.125, 33)
    kw = dict(row_seq=row_seq, kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale)
    got = cpu_attention.paged_decode(*args, **kw)
    rows = cpu_attention.paged_decode(*args, **kw, tiled=False)
    torch.testing.assert_close(got, rows, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_its_block_or_threads(kv_dtype):
    """Chunked prefill cuts a prompt anywhere: a row's result is bitwise the same computed in one
    call with all its sequence's rows, in a chunk of its own, alone, on one thread or two."""
    q, kc, vc, tables, row_seq, key_lens = _case(11, 3, 64, 16, [(0, 130)], kv_dtype)

    def run(rows, threads=2):
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return cpu_attention.paged_decode(q[rows], kc, vc, tables, key_lens[rows], 0.125, 70,
                                              row_seq=row_seq[rows])
        finally:
            torch.set_num_threads(prev)

    whole = run(slice(None))
    assert torch.equal(run(slice(None), 1), whole)
    for a, b in [(0, 1), (5, 6), (17, 64), (64, 130), (100, 101), (33, 130)]:
        assert torch.equal(run(slice(a, b)), whole[a:b])


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_rows_past_the_prompt_take_the_decode_kernel(kv_dtype):
    """tile_len = prompt lengths: prompt rows are tiled; rows past the prompt (proposals verified,
    outputs recomputed after preemption) equal what the decode step computes for them, bit for bit."""
    runs = [(0, 40), (30, 5), (10, 50)]
    q, kc, vc, tables, row_seq, key_lens = _case(13, 3, 64, 16, runs, kv_dtype)
    tile_len = torch.tensor([40, 32, 35])  # all prompt; two past the prompt; a recompute across its end
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, 0.125, None, row_seq=row_seq, tile_len=tile_len)
    tiled = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, 0.125, None, row_seq=row_seq)
    decode = cpu_attention.paged_decode(q, kc, vc, tables[row_seq].contiguous(), key_lens, 0.125, None)
    past = key_lens > tile_len[row_seq]
    assert 0 < int(past.sum()) < len(q)
    assert torch.equal(got[past], decode[past])
    assert torch.equal(got[~past], tiled[~past])
