"""The decode kernel's rows of one sequence (a verification step's rows: consecutive rows with the
same row_seq, key lengths one apart) get bitwise the result each gets alone, whatever the batch, the
task shape (few rows: a task per (row, split); many: a task per row) and the threads: speculative
decoding's greedy output equals the plain engine's only because a verification row computes exactly
what a one-row decode step computes."""
from __future__ import annotations

import pytest
import torch

from ridgeline.kernels import cpu, cpu_attention
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.kv_cache import allocate_kv

needs_c = pytest.mark.skipif(cpu.lib() is None, reason="no C kernels on this machine")


def _cache(k_name, v_name, NB, bs, Hkv, D, seed):
    spec = KVCacheSpec(KV_FORMATS[k_name], 1, Hkv, D, bs, KV_FORMATS[v_name])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(seed)
    kv.write(torch.arange(NB * bs), torch.randn(NB * bs, Hkv, D, generator=g),
             torch.randn(NB * bs, Hkv, D, generator=g))
    return kv, g


def _decode(kv, q, tables, key_lens, row_seq, window):
    return cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, q.shape[-1] ** -0.5, window,
                                      row_seq=row_seq, kv_format=kv.c_format, k_scale=kv.k_scale,
                                      v_scale=kv.v_scale, tiled=False)


@needs_c
@pytest.mark.parametrize("k_name,v_name", [("bf16", "bf16"), ("int8", "int8"), ("f32", "f32"), ("bf16", "int8")])
@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_of_one_sequence_get_the_bits_they_get_alone(k_name, v_name, window, threads):
    NB, bs, Hkv, G, D = 200, 16, 3, 3, 64
    kv, g = _cache(k_name, v_name, NB, bs, Hkv, D, seed=len(k_name + v_name))
    # sequence 0: 3 rows ending at 700 (across splits); 1: one row; 2: 20 rows
    # ending at 257 (the last rows step into a new split); 3: 2 rows inside the first split
    seq_rows = [(0, 698, 3), (1, 40, 1), (2, 238, 20), (3, 10, 2)]
    tables = (torch.randperm(NB - 1, generator=g)[:4 * 45] + 1).view(4, 45)
    row_seq = torch.tensor([s for s, _, n in seq_rows for _ in range(n)])
    key_lens = torch.tensor([p + i + 1 for _, p, n in seq_rows for i in range(n)])
    q = torch.randn(len(row_seq), Hkv * G, D, generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = _decode(kv, q, tables, key_lens, row_seq, window)
        for r in range(len(row_seq)):  # each row alone: a one-row call (split tasks)
            alone = _decode(kv, q[r:r + 1], tables, key_lens[r:r + 1], row_seq[r:r + 1], window)
            assert torch.equal(together[r:r + 1], alone), f"row {r}"
        # as decode rows of separate sequences (one table each)
        apart = _decode(kv, q, tables[row_seq], key_lens, None, window)
        assert torch.equal(together, apart)
    finally:
        torch.set_num_threads(old)


@needs_c
def test_grouped_rows_match_a_reference():
    """Not only self-consistent: the rows of one sequence against SDPA over gathered keys."""
    NB, bs, Hkv, G, D = 60, 16, 2, 4, 64
    kv, g = _cache("f32", "f32", NB, bs, Hkv, D, seed=5)
    tables = (torch.randperm(NB - 1, generator=g)[:40] + 1).view(1, 40)
    n, last = 5, 520
    key_lens = torch.arange(last - n + 1, last + 1)
    q = torch.randn(n, Hkv * G, D, generator=g)
    got = _decode(kv, q, tables, key_lens, torch.zeros(n, dtype=torch.int64), None)
    slots = (tables[0].repeat_interleave(bs) * bs + torch.arange(bs).repeat(40))[:last]
    k = kv.k.reshape(-1, Hkv, D)[slots].repeat_interleave(G, dim=1).transpose(0, 1)  # [H, last, D]
    v = kv.v.reshape(-1, Hkv, D)[slots].repeat_interleave(G, dim=1).transpose(0, 1)
    mask = torch.arange(last)[None, :] < key_lens[:, None]  # [n, last]
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask[None])
    torch.testing.assert_close(got, want.transpose(0, 1).reshape(n, -1), atol=2e-5, rtol=1e-4)
