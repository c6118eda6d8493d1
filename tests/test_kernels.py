"""The C matmul kernels compute x @ W^T like torch, for bf16 and fp32 weights."""
import pytest
import torch

from ridgeline.kernels import cpu_gemm, cpu_gemv
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.linear import Linear
from ridgeline.layers.weight_formats import DENSE, create_weight_format


def _linear(dtype: torch.dtype, plan: KernelPlan, bias: bool = True) -> Linear:
    lin = Linear(96, 40, create_weight_format(DENSE[dtype], plan), bias=bias)
    torch.nn.init.normal_(lin.weight)
    if bias:
        torch.nn.init.normal_(lin.bias)
    return lin


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_gemv.available(), cpu_gemv.unavailable_reason()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 5, 8])
@pytest.mark.parametrize("N,K", [(64, 576), (37, 100), (3, 7)])
def test_gemv_matches_fp32_reference(dtype, M, N, K):
    torch.manual_seed(M * N + K)
    w = torch.randn(N, K).to(dtype)
    x = torch.randn(M, K).to(dtype)
    want = x.double() @ w.double().T
    got = cpu_gemv.gemv(x, w)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    torch.testing.assert_close(got.double(), want, atol=1e-4 * K ** 0.5, rtol=1e-4)


def test_gemv_rejects_too_many_rows():
    with pytest.raises(ValueError):
        cpu_gemv.gemv(torch.randn(cpu_gemv.MAX_M + 1, 16), torch.randn(4, 16))


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp64 x @ w^T, with x rounded to bf16 first for bf16 weights (as the kernel does)."""
    return (x.to(w.dtype) if w.dtype == torch.bfloat16 else x).double() @ w.double().T


def _packed_dtypes():
    return [dt for dt in (torch.float32, torch.bfloat16) if cpu_gemm.available(dt)]


@pytest.mark.parametrize("dtype", _packed_dtypes())
@pytest.mark.parametrize("M", [1, 3, 8, 9, 17, 64, 130])
@pytest.mark.parametrize("N,K", [(64, 576), (37, 100), (3, 7), (9, 1537), (100, 1), (50, 3001)])
def test_packed_matmul_matches_reference(dtype, M, N, K):
    torch.manual_seed(M * N + K)
    w = torch.randn(N, K).to(dtype)
    x = torch.randn(M, K)
    got = cpu_gemm.PackedWeight(w)(x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    torch.testing.assert_close(got.double(), _reference(x, w), atol=1e-4 * K ** 0.5, rtol=1e-4)


@pytest.mark.parametrize("dtype", _packed_dtypes())
@pytest.mark.parametrize("K", [200, 2500])  # 2500: several k blocks and row chunks
def test_packed_rows_do_not_depend_on_batch_size(dtype, K):
    w = cpu_gemm.PackedWeight(torch.randn(100, K).to(dtype))
    x = torch.randn(300, K)
    full = w(x)
    for m in (1, 4, 9, 17):
        assert torch.equal(w(x[:m]), full[:m])
    assert torch.equal(w(x[150:151]), full[150:151])


@pytest.mark.parametrize("dtype", _packed_dtypes())
def test_packed_large_output_streams_and_stays_exact(dtype):
    """Outputs over the streaming-store threshold (LM-head sized) take the non-temporal store path."""
    torch.manual_seed(0)
    w = torch.randn(4096, 64).to(dtype)
    x = torch.randn(600, 64)  # 600 * 4096 * 4 B = 9.4 MiB of output
    torch.testing.assert_close(cpu_gemm.PackedWeight(w)(x).double(), _reference(x, w), atol=1e-3, rtol=1e-4)


def test_packed_weight_rejects_bad_input():
    with pytest.raises(ValueError):
        cpu_gemm.PackedWeight(torch.randn(4, 16).half())
    with pytest.raises(ValueError):
        cpu_gemm.PackedWeight(torch.randn(4, 16))(torch.randn(2, 15))


@pytest.mark.parametrize("dtype", _packed_dtypes())
def test_linear_repacks_its_weight_only_where_the_plan_says(dtype):
    lin = _linear(dtype, KernelPlan(packed=frozenset()))
    x = torch.randn(7, 96)
    want = _reference(x, lin.weight).float() + lin.bias
    lin.finish_loading()
    assert lin.packed is None and lin.weight is not None  # not chosen: nothing changes
    packing = _linear(dtype, KernelPlan(packed=frozenset({dtype})))
    packing.weight.data.copy_(lin.weight)
    packing.bias.data.copy_(lin.bias)
    packing.finish_loading()
    assert packing.packed is not None and packing.weight is None
    torch.testing.assert_close(packing(x), want, atol=1e-3, rtol=1e-3)


def test_linear_uses_the_skinny_kernel_where_the_plan_says(monkeypatch):
    lin = _linear(torch.float32, KernelPlan(skinny="linear"))
    x = torch.randn(3, 96)
    ref = lin(x)
    lin.format = create_weight_format("f32", KernelPlan(skinny="c"))
    calls = []
    real = cpu_gemv.gemv
    monkeypatch.setattr(cpu_gemv, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.testing.assert_close(lin(x), ref, atol=1e-4, rtol=1e-4)
    assert calls
    big = torch.randn(cpu_gemv.MAX_M + 1, 96)  # larger batches go to torch
    calls.clear()
    lin(big)
    assert not calls


def paged_sdpa(q, kc, vc, g, scale, window):
    from ridgeline.layers.attention import PagedSDPA
    from ridgeline.layers.kv_cache import LayerKV
    return PagedSDPA()(q, LayerKV(kc, vc, "bf16" if kc.dtype == torch.bfloat16 else "f32"), g, scale, window)


def _decode_group(tables: torch.Tensor, key_lens: torch.Tensor, bs: int, window: int | None):
    """One decode token per sequence (the SDPA backend derives its mask from start and n)."""
    import numpy as np
    from ridgeline.layers.forward_context import AttnGroup
    B = len(key_lens)
    n = np.ones(B, dtype=np.int64)
    return AttnGroup(rows=slice(0, B), start=key_lens.numpy() - n, n=n, block_tables=tables, key_lens=key_lens)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_paged_decode_matches_sdpa_backend(window, kv_dtype):
    from ridgeline.kernels import cpu_attention
    torch.manual_seed(0)
    NB, bs, Hkv, G, D = 12, 4, 2, 3, 16
    kc, vc = torch.randn(NB, bs, Hkv, D).to(kv_dtype), torch.randn(NB, bs, Hkv, D).to(kv_dtype)
    key_lens = torch.tensor([3, 9, 13])
    tables = torch.tensor([[5, 0, 0, 0], [1, 7, 2, 0], [3, 4, 8, 11]])
    q = torch.randn(3, Hkv * G, D)
    want = paged_sdpa(q, kc, vc, _decode_group(tables, key_lens, bs, window), 0.25, window)
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, 0.25, window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D,bs,window", [(64, 16, None), (128, 4, None), (32, 16, 21), (64, 8, 7)])
def test_paged_decode_fast_path_matches_sdpa(D, bs, window, kv_dtype):
    """head_dim a multiple of 32 takes the AVX-512 chunked path (bf16 cache: q rounded to bf16)."""
    from ridgeline.kernels import cpu_attention
    torch.manual_seed(D + bs)
    key_lens = torch.tensor([1, 17, 45, 80])
    nb = (int(key_lens.max()) + bs - 1) // bs
    NB, Hkv, G = 4 * nb + 1, 2, 3
    kc, vc = torch.randn(NB, bs, Hkv, D).to(kv_dtype), torch.randn(NB, bs, Hkv, D).to(kv_dtype)
    perm = torch.randperm(NB - 1)[: 4 * nb] + 1
    tables = perm.view(4, nb)
    q = torch.randn(4, Hkv * G, D)
    scale = D ** -0.5
    want = paged_sdpa(q.to(kv_dtype).float(), kc, vc, _decode_group(tables, key_lens, bs, window), scale, window)
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, scale, window)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("window", [None, 60])
def test_prefill_rows_through_the_decode_kernel(kv_dtype, window):
    """The per-row kernel (tiled=False): row_seq maps query rows to sequences, the same as expanding
    each row's block table, bit for bit (the tiled kernel: tests/test_paged_prefill.py)."""
    from ridgeline.kernels import cpu_attention
    torch.manual_seed(3)
    NB, bs, Hkv, G, D = 30, 16, 3, 3, 64
    kc, vc = torch.randn(NB, bs, Hkv, D).to(kv_dtype), torch.randn(NB, bs, Hkv, D).to(kv_dtype)
    tables = torch.randperm(NB - 1)[:2 * 6].view(2, 6) + 1  # 2 sequences, up to 96 positions each
    row_seq = torch.tensor([0] * 5 + [1] * 40)
    key_lens = torch.cat([torch.arange(20, 25), torch.arange(51, 91)]) + 1  # causal: position + 1
    q = torch.randn(45, Hkv * G, D)
    got = cpu_attention.paged_decode(q, kc, vc, tables, key_lens, 0.125, window, row_seq=row_seq, tiled=False)
    want = cpu_attention.paged_decode(q, kc, vc, tables[row_seq].contiguous(), key_lens, 0.125, window)
    assert torch.equal(got, want)
    one_by_one = torch.cat([cpu_attention.paged_decode(q[i:i + 1], kc, vc, tables, key_lens[i:i + 1], 0.125, window,
                                                       row_seq=row_seq[i:i + 1], tiled=False) for i in range(len(q))])
    assert torch.equal(got, one_by_one)


def test_hugepage_buffer_is_zeroed_and_writable():
    from ridgeline.utils import hugepages
    buf = hugepages.zeroed(3 << 20)
    assert buf.shape == (3 << 20,) and not buf.any()
    t = torch.from_numpy(buf).view(torch.float32)
    t[123] = 2.5
    assert float(torch.from_numpy(buf).view(torch.float32)[123]) == 2.5
