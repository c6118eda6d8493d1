"""KV-cache formats: quantize/dequantize round trips within each format's bound on fresh random K/V;
the C write (rotary + quantize, kernels/ops.c) stores bitwise what the torch write stores; the C
paged attention over quantized blocks matches float attention within a per-format bound and the
SDPA path over the same blocks (bf16: up to q's rounding); split-KV gives a row the same result whatever shares its call."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ridgeline.kernels import cpu, cpu_attention
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.forward_context import AttnGroup
from ridgeline.layers.kv_cache import LayerKV, allocate_kv
from ridgeline.formats import kv as kvq

QUANTIZED = ["int8", "int4", "fp8_e4m3", "fp8_e5m2"]
ALL = ["f32", "bf16", "f16"] + QUANTIZED
needs_c = pytest.mark.skipif(cpu.lib() is None, reason="no C kernels on this machine")


def _vectors(n=512, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g) * torch.rand(n, 1, generator=g).mul(4).exp()  # magnitudes over e^4
    x[0] = 0  # an all-zero vector: scale 0, back to exact zeros
    x[1, 5] = 40.0  # an outlier channel
    return x


@pytest.mark.parametrize("name", ALL)
def test_round_trip_within_the_format_bound(name):
    fmt = KV_FORMATS[name]
    x = _vectors()
    data, scale = kvq.quantize(fmt, x)
    assert data.dtype == kvq.storage_dtype(fmt) and data.shape == (512, fmt.data_units(64))
    assert (scale is None) == (not fmt.quantized)
    y = kvq.dequantize(fmt, data, scale)
    ref = kvq.hadamard(x) if fmt.rotate else x  # rotated formats come back rotated
    err = (y - ref).abs()
    amax = ref.abs().amax(-1, keepdim=True)
    if name == "int8":  # half a step of amax / 127, plus the fp16 scale's rounding
        assert (err <= amax / 254 * 1.01 + 1e-30).all()
    elif name == "int4":  # the +7 side of the most clipped step: 1 - 7/8 * 13/16 of the group's max
        gmax = ref.view(512, 2, 32).abs().amax(-1, keepdim=True)
        assert (err.view(512, 2, 32) <= gmax * 0.29 * 1.01).all()
        assert torch.allclose(kvq.hadamard(y), x, atol=float(x.abs().max()) * 0.2)  # H undoes itself
    elif name.startswith("fp8"):  # relative: 3 (e4m3) or 2 (e5m2) mantissa bits; absolute below the normals
        rel = 2.0 ** -4 if name == "fp8_e4m3" else 2.0 ** -3
        tiny = amax * (2.0 ** -9 / 448 if name == "fp8_e4m3" else 2.0 ** -16 / 256)
        assert (err <= torch.maximum(ref.abs() * rel * 1.01, tiny * 1.01)).all()
    else:
        assert torch.equal(y, x.to(kvq.FLOAT_DTYPES[name]).float())
    assert (y[0] == 0).all()


def test_int4_scale_search_never_rounds_a_group_worse_than_the_plain_grid():
    data, scale = kvq.quantize(KV_FORMATS["int4"], _vectors(seed=3))
    x = kvq.hadamard(_vectors(seed=3))  # what the groups hold: the rotated vectors
    chosen = ((kvq.dequantize(KV_FORMATS["int4"], data, scale) - x) ** 2).view(512, 2, 32).sum(-1)
    g = x.view(512, 2, 32)
    d = (g.gather(-1, g.abs().argmax(-1, keepdim=True)) * -0.125).half().float()
    plain = ((torch.round(g / torch.where(d == 0, 1, d)).clamp(-8, 7) * d - g) ** 2).sum(-1)
    assert (chosen <= plain * (1 + 1e-6)).all()
    assert chosen.sum() < 0.96 * plain.sum()  # and clipping pays on Gaussian-like groups
    assert (scale.float().abs() < (g.abs().amax(-1) / 8).half().float() * 0.999).any()


def test_scales_come_from_the_data():
    x = _vectors()
    for name in ("fp8_e4m3", "fp8_e5m2", "int8"):
        _, s = kvq.quantize(KV_FORMATS[name], x)
        assert s.dtype == torch.float16 and len(set(s[2:].flatten().tolist())) > 100  # never a constant 1.0


def test_spec_bytes_and_capacity():
    bf16 = KVCacheSpec(KV_FORMATS["bf16"], 30, 3, 64, 16)
    int8 = KVCacheSpec(KV_FORMATS["int8"], 30, 3, 64, 16)
    int4 = KVCacheSpec(KV_FORMATS["int4"], 30, 3, 64, 16)
    mixed = KVCacheSpec(KV_FORMATS["int4"], 30, 3, 64, 16, KV_FORMATS["int8"])
    assert int8.bytes_per_token == 30 * 3 * 2 * 66 and int4.bytes_per_token == 30 * 3 * 2 * 36
    assert mixed.bytes_per_token == 30 * 3 * (36 + 66) and mixed.format_names == "K int4, V int8"
    assert bf16.bytes_per_token / int8.bytes_per_token > 1.93 and bf16.bytes_per_token / int4.bytes_per_token > 3.55
    layers = allocate_kv(mixed, 5, torch.device("cpu"))
    kv = layers[1]
    assert kv.k.shape == (5, 16, 3, 32) and kv.k_scale.shape == (5, 16, 3, 2) and kv.v_scale.shape == (5, 16, 3, 1)
    assert all(t.data_ptr() % 64 == 0 for t in (kv.k, kv.v, kv.k_scale, kv.v_scale))
    assert kv.c_format == 4 | 3 << 8


def _identity_rope(P, D):
    cs = torch.zeros(P, D // 2, 2)
    cs[..., 0] = 1.0  # cos 1, sin 0: the C rotary pass is exact, so the stores can be compared bit for bit
    return cs


@needs_c
@pytest.mark.parametrize("k_name,v_name", [(n, n) for n in ALL] + [("int4", "bf16"), ("int8", "fp8_e4m3")])
def test_c_write_stores_what_the_torch_write_stores(k_name, v_name):
    T, H, Hkv, D, NB, bs = 37, 6, 2, 64, 8, 16
    spec = KVCacheSpec(KV_FORMATS[k_name], 1, Hkv, D, bs, KV_FORMATS[v_name])
    c_kv, t_kv = allocate_kv(spec, NB, torch.device("cpu"))[0], allocate_kv(spec, NB, torch.device("cpu"))[0]
    x = _vectors(T * (H + 2 * Hkv), D, seed=1).view(T, (H + 2 * Hkv) * D)
    slots = torch.randperm(NB * bs)[:T]
    positions = torch.arange(T)
    if c_kv.k_centers is not None:  # centered K: per (head, channel) constants subtracted before storing,
        g = torch.Generator().manual_seed(2)  # one for position 0 and one for the others
        shift, sink = torch.randn(Hkv, D, generator=g), torch.randn(Hkv, D, generator=g) * 4
        c_kv.set_centers(shift, sink)
        t_kv.set_centers(shift, sink)
    c_kv.write_rope(x.clone(), positions, _identity_rope(T, D), slots, H, Hkv, D)
    k, v = x[:, H * D:].view(T, 2, Hkv, D).unbind(1)
    t_kv.write(slots, k, v, positions)
    for name in ("k", "v", "k_scale", "v_scale"):
        a, b = getattr(c_kv, name), getattr(t_kv, name)
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                               b.view(torch.uint8) if b.dtype != torch.uint8 else b), name


@needs_c
def test_fp8_codes_match_torch_on_edge_values():
    """Round to nearest even at every boundary: subnormals, the normal/subnormal edge, the top."""
    for name, top in (("fp8_e4m3", 448.0), ("fp8_e5m2", 57344.0)):  # noqa: B007
        dtype = torch.float8_e4m3fn if name == "fp8_e4m3" else torch.float8_e5m2
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        codes = codes[codes.isfinite() & (codes.abs() <= top)].unique()
        mids = (codes[1:] + codes[:-1]) / 2
        vals = torch.cat([codes, mids, mids.nextafter(torch.tensor(math.inf)), mids.nextafter(torch.tensor(-math.inf))])
        pin = 448.0 if name == "fp8_e4m3" else 256.0  # amax giving a scale of exactly 1: codes stay unscaled
        vals = vals[vals.abs() <= pin]
        D = 64
        x = torch.zeros(len(vals), D)
        x[:, 0] = vals
        x[:, 1] = pin
        spec = KVCacheSpec(KV_FORMATS[name], 1, 1, D, 16)
        c_kv, t_kv = (allocate_kv(spec, len(vals) // 16 + 2, torch.device("cpu"))[0] for _ in range(2))
        slots = torch.arange(len(vals))
        qkv = torch.cat([x, x, x], dim=1)  # H = Hkv = 1
        c_kv.write_rope(qkv, slots, _identity_rope(len(vals), D), slots, 1, 1, D)
        t_kv.write(slots, x.view(-1, 1, D), x.view(-1, 1, D))
        assert torch.equal(c_kv.k, t_kv.k) and torch.equal(c_kv.k_scale, t_kv.k_scale), name


def _random_cache(k_name, v_name, NB, bs, Hkv, D, seed):
    spec = KVCacheSpec(KV_FORMATS[k_name], 1, Hkv, D, bs, KV_FORMATS[v_name])
    kv = allocate_kv(spec, NB, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(NB * bs, Hkv, D, generator=g), torch.randn(NB * bs, Hkv, D, generator=g)
    k[:, :, 3] *= 8  # an outlier channel in K, as rotary models have
    kv.write(torch.arange(NB * bs), k, v)
    return kv, k.view(NB, bs, Hkv, D), v.view(NB, bs, Hkv, D)


def _reference(q, k, v, tables, key_lens, scale, window):
    """Float attention over the original (unquantized) K/V, one row at a time."""
    bs, Hkv, D = k.shape[1:]
    G = q.shape[1] // Hkv
    out = []
    for b in range(len(q)):
        n = int(key_lens[b])
        kk = k[tables[b]].reshape(-1, Hkv, D)[:n]
        vv = v[tables[b]].reshape(-1, Hkv, D)[:n]
        if window:
            kk, vv = kk[max(0, n - window):], vv[max(0, n - window):]
        kk, vv = kk.repeat_interleave(G, 1), vv.repeat_interleave(G, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b], kk) * scale, -1)
        out.append(torch.einsum("hn,nhd->hd", p, vv).reshape(-1))
    return torch.stack(out)


BOUND = {"f32": 1e-5, "bf16": 2e-2, "f16": 2e-3, "int8": 2.5e-2, "int4": 0.2, "fp8_e4m3": 0.12, "fp8_e5m2": 0.25}


@needs_c
@pytest.mark.parametrize("k_name,v_name", [(n, n) for n in ALL] + [("int4", "int8"), ("bf16", "int8")])
@pytest.mark.parametrize("window", [None, 150])
def test_paged_attention_over_quantized_blocks(k_name, v_name, window):
    """Against float attention over the unquantized K/V: within the format's bound (max error over
    the output's scale); against the SDPA backend over the same blocks with q rounded as the kernel reads it (bf16 for
    bf16 K and V, int16 for int8 K and V): the same numbers to ~1e-5."""
    from ridgeline.layers.attention import PagedSDPA
    NB, bs, Hkv, G, D = 180, 16, 3, 3, 64
    kv, k, v = _random_cache(k_name, v_name, NB, bs, Hkv, D, seed=2)
    key_lens = torch.tensor([1, 17, 300, 700])
    g = torch.Generator().manual_seed(5)  # not the global generator: the bound must not depend on test order
    tables = (torch.randperm(NB - 1, generator=g)[:4 * 44] + 1).view(4, 44)
    q = torch.randn(4, Hkv * G, D, generator=g)
    scale = D ** -0.5
    got = cpu_attention.paged_decode(q, kv.k, kv.v, tables, key_lens, scale, window, kv_format=kv.c_format,
                                     k_scale=kv.k_scale, v_scale=kv.v_scale)
    want = _reference(q, k, v, tables, key_lens, scale, window)
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel < max(BOUND[k_name], BOUND[v_name]), rel
    n = np.ones(4, dtype=np.int64)
    g = AttnGroup(rows=slice(0, 4), start=key_lens.numpy() - n, n=n, block_tables=tables, key_lens=key_lens)
    sdpa = PagedSDPA()(cpu_attention.decode_query_as_read(q, kv.c_format), kv, g, scale, window)
    torch.testing.assert_close(got, sdpa, atol=2e-5, rtol=1e-4)  # q rounded as the kernel reads it


@needs_c
@pytest.mark.parametrize("name", ["bf16", "f32", "int8", "int4"])
def test_a_row_gets_the_same_result_whatever_shares_its_call(name):
    """Split-KV: a long row alone (its keys split across threads) equals the same row among many rows
    (one task per row), on one thread or two, bit for bit."""
    NB, bs, Hkv, G, D = 160, 16, 3, 3, 64
    kv, _, _ = _random_cache(name, name, NB, bs, Hkv, D, seed=4)
    tables = torch.randperm(NB - 1)[:8 * 19].view(8, 19) + 1
    key_lens = torch.tensor([290, 5, 64, 257, 33, 300, 1, 111])
    q = torch.randn(8, Hkv * G, D)

    def run(rows, threads):
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return cpu_attention.paged_decode(q[rows], kv.k, kv.v, tables[rows].contiguous(), key_lens[rows], 0.125,
                                              None, kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale)
        finally:
            torch.set_num_threads(prev)

    many = run(slice(None), 2)
    for i in (0, 3, 5):
        for threads in (1, 2):
            assert torch.equal(run(slice(i, i + 1), threads), many[i:i + 1])
    assert torch.equal(run(slice(None), 1), many)


def test_sdpa_path_reads_quantized_layer_kv():
    """The torch write + SDPA read pair on its own (what a GPU runs): int8 close to float."""
    from ridgeline.layers.attention import PagedSDPA
    NB, bs, Hkv, G, D = 12, 4, 2, 3, 32
    out = {}
    for name in ("f32", "int8", "int4"):
        kv, _, _ = _random_cache(name, name, NB, bs, Hkv, D, seed=5)
        key_lens = torch.tensor([3, 9, 13])
        tables = torch.tensor([[5, 0, 0, 0], [1, 7, 2, 0], [3, 4, 8, 11]])
        n = np.ones(3, dtype=np.int64)
        g = AttnGroup(rows=slice(0, 3), start=key_lens.numpy() - n, n=n, block_tables=tables, key_lens=key_lens)
        out[name] = PagedSDPA()(torch.randn(3, Hkv * G, D, generator=torch.Generator().manual_seed(0)), kv, g,
                                0.25, None)
    assert (out["int8"] - out["f32"]).abs().max() < 0.03 * out["f32"].abs().max()
    assert (out["int4"] - out["f32"]).abs().max() < 0.3 * out["f32"].abs().max()
    assert LayerKV(torch.zeros(1, 4, 2, 32), torch.zeros(1, 4, 2, 32), "f32").formats == "f32"


def test_centered_int4_keys_leave_softmax_alone_and_cut_its_error():
    """Keys with a large offset per channel (as real keys have): storing k - c moves every score of a
    query by q.c, so the attention weights are those of k up to rounding, and the rounding is smaller."""
    g = torch.Generator().manual_seed(3)
    T, Hkv, D = 256, 1, 64
    offset = torch.randn(Hkv, D, generator=g) * 6
    k = offset + torch.randn(T, Hkv, D, generator=g)
    q = torch.randn(8, D, generator=g)
    spec = KVCacheSpec(KV_FORMATS["int4"], 1, Hkv, D, 16)
    exact = torch.softmax(q @ k[:, 0].T / 8, -1)
    errors = []
    for shift in (torch.zeros(Hkv, D), k.mean(0)):
        kv = allocate_kv(spec, T // 16 + 1, torch.device("cpu"))[0]
        kv.k_shift.copy_(shift)
        kv.write(torch.arange(16, 16 + T), k, k)
        stored, _ = kv.read(torch.arange(1, T // 16 + 1), torch.float32)
        stored = kvq.hadamard(stored.reshape(T, Hkv, D))[:, 0]  # un-rotated: k - shift, rounded
        errors.append((torch.softmax(q @ stored.T / 8, -1) - exact).abs().max().item())
    assert errors[1] < errors[0] / 3, errors


@needs_c
@pytest.mark.parametrize("name", ["bf16", "int8", "int4", "fp8_e4m3"])
@pytest.mark.parametrize("G", [1, 2, 3, 8])
def test_split_kv_rows_off_every_tile_and_split(name, G):
    """One long row (split-KV: its splits are tasks over all KV heads) at lengths off the 16-position
    chunk and the 256-position split: the same bits on one thread and two, equal to the row computed
    among other rows (one task per row), and within the format's bound of float attention."""
    NB, bs, Hkv, D = 70, 16, 2, 64
    kv, k, v = _random_cache(name, name, NB, bs, Hkv, D, seed=7)
    g = torch.Generator().manual_seed(11)
    tables = (torch.randperm(NB - 1, generator=g)[:64] + 1).view(1, 64).repeat(5, 1)
    key_lens = torch.tensor([1, 255, 257, 513, 1000])
    q = torch.randn(5, Hkv * G, D, generator=g)

    def run(rows, threads):
        prev = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return cpu_attention.paged_decode(q[rows], kv.k, kv.v, tables[rows].contiguous(), key_lens[rows], 0.125,
                                              None, kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale)
        finally:
            torch.set_num_threads(prev)

    many = run(slice(None), 1)  # 5 rows on one thread: a task per row
    for i in range(5):
        one = run(slice(i, i + 1), 2)
        assert torch.equal(one, run(slice(i, i + 1), 1)) and torch.equal(one, many[i:i + 1]), (i, G)
    want = _reference(q, k, v, tables, key_lens, 0.125, None)
    # 1.5x the format's bound: the 1-key row carries one vector's rounding undiluted by any average
    assert float((many - want).abs().max() / want.abs().max()) < 1.5 * BOUND[name]
