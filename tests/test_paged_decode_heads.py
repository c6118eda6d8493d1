"""Decode attention's V pass serves several query heads per V load (up to four, at most 16
accumulators) and reads int8 V in place with its scale folded into the weights: every GQA ratio
and head size against the SDPA backend over the same blocks, across splits."""
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
    both_bf16 = k_name == v_name == "bf16"  # that kernel rounds q to bf16 for vdpbf16ps
    qr = q.to(torch.bfloat16).float() if both_bf16 else q
    want = PagedSDPA()(qr, kv, grp, D ** -0.5, None)
    torch.testing.assert_close(got, want.reshape(got.shape), atol=2e-5, rtol=1e-4)
