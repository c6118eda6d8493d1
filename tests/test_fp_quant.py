"""The floating-point weight formats (formats/fpq.py, kernels/gemm_fp8.c, kernels/gemm_fp4.c): round-trip
error bounds on fresh random tensors, each packed kernel equals dequantize-then-matmul (fp4: with the
activations rounded to int8 per row and block as the kernel does), a row's result never depends on how
many rows share the call, and K that is not whole blocks is a clear error."""
import pytest
import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_quant
from ridgeline.formats import fpq, rtn

KINDS = ["fp8", "fp8-e5m2", "fp8-tensor", "fp8-e5m2-tensor", "mxfp8", "mxfp4", "nvfp4"]
FP4 = ("mxfp4", "nvfp4")
# relative Frobenius error of a round trip on Gaussian weights with an outlier row and column (measured
# over seeds: fp8 0.026, e5m2 0.052, per-tensor ~0.05-0.09, mxfp8 0.027, mxfp4 0.11, nvfp4 0.095)
ROUND_TRIP = {"fp8": 0.035, "fp8-e5m2": 0.07, "fp8-tensor": 0.12, "fp8-e5m2-tensor": 0.12, "mxfp8": 0.035,
              "mxfp4": 0.14, "nvfp4": 0.12}
# stored bytes per weight, scales included
BYTES = {"fp8": 1.02, "fp8-e5m2": 1.02, "fp8-tensor": 1.02, "fp8-e5m2-tensor": 1.02, "mxfp8": 1.032,
         "mxfp4": 0.532, "nvfp4": 0.563}


def _w(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    w[1] *= 8  # an outlier row
    w[:, 5] *= 6  # and column
    w[2, :40] = 1e-6  # values under fp8's normal range: subnormals
    w[3] = 0  # an all-zero row
    return w


def _x(M, K, seed=1):
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed))
    x[:, 3] *= 20
    if M > 2:
        x[2] = 0
    return x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_error_is_bounded(kind, seed):
    w = _w(64, 256, seed)
    t = fpq.quantize(w, kind)
    d = t.dequantize()
    assert d.shape == w.shape and torch.isfinite(d).all()
    assert float((d - w).norm() / w.norm()) < ROUND_TRIP[kind]
    assert torch.equal(d[3], torch.zeros(256))
    assert t.nbytes <= BYTES[kind] * w.numel()
    if kind in ("fp8", "fp8-e5m2"):  # per channel, the largest value maps to the largest element exactly
        assert torch.equal(fpq.quantize(d, kind).dequantize(), d)


def test_values_on_the_grid_come_back_exactly():
    codes = torch.arange(16, dtype=torch.uint8).repeat(4, 2)  # every E2M1 value, blocks of 32
    w = fpq.E2M1_VALUES[codes.long()] * 0.25  # a power-of-two block scale
    assert torch.equal(fpq.quantize(w, "mxfp4").dequantize(), w)
    assert torch.equal(fpq.round_e2m1(torch.tensor([0.2, 0.3, 2.4, 2.6, -5.1, 100.0, -0.1])),
                       torch.tensor([0, 1, 4, 5, 15, 7, 0], dtype=torch.uint8))


def test_block_scales_are_the_format_s():
    t = fpq.quantize(_w(8, 64), "mxfp4")
    assert t.scale.dtype == torch.uint8 and t.scale.shape == (8, 2) and int(t.scale.min()) >= 1
    nv = fpq.quantize(_w(8, 64), "nvfp4")
    assert nv.scale.shape == (8, 4) and nv.tensor_scale > 0
    assert torch.isfinite(nv.scale.view(torch.float8_e4m3fn).float()).all()


@pytest.mark.parametrize("kind,K,allowed", [("mxfp4", 48, "fp8, fp8-e5m2, int8, nvfp4"),
                                            ("mxfp8", 40, "fp8, fp8-e5m2, int8"), ("nvfp4", 40, "fp8, fp8-e5m2, int8")])
def test_k_not_in_whole_blocks_is_a_clear_error(kind, K, allowed):
    block = 16 if kind == "nvfp4" else 32
    with pytest.raises(InvalidRequestError, match=f"{kind} needs the input columns in whole blocks of {block}; "
                                                  f"the weight has {K}. Formats that take {K} columns: {allowed}"):
        fpq.quantize(torch.randn(4, K), kind)


needs_kernels = pytest.mark.skipif(not (cpu_quant.available("fp8") and cpu_quant.available("fp4")),
                                   reason="no AVX-512 (VNNI) kernels on this CPU")


def _packed(kind, w):
    from ridgeline.kernels.cpu_fpquant import PackedFp4, PackedFp8
    t = fpq.quantize(w, kind)
    return (PackedFp4 if kind in FP4 else PackedFp8)(t), t


@needs_kernels
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("M", [1, 3, 9, 70])
@pytest.mark.parametrize("N,K", [(96, 256), (37, 128), (200, 1536)])
def test_kernel_equals_dequantize_then_matmul(kind, M, N, K):
    """Bound: 2e-6 of the sum of |terms| (fp32 sums of exact products; fp4: exact integer block sums
    times one rounded scale per block)."""
    p, t = _packed(kind, _w(N, K, seed=M + N))
    x = _x(M, K)
    got = p(x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    xr = rtn.fake_quantize_rows(x, t.block) if kind in FP4 else x
    wd = t.dequantize().double()
    want = xr.double() @ wd.T
    scale = (xr.double().abs() @ wd.abs().T).clamp_min(1e-3)
    assert float(((got.double() - want).abs() / scale).max()) < 2e-6
    if M > 2:
        assert torch.equal(got[2], torch.zeros(N))


@needs_kernels
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_do_not_depend_on_how_many_share_the_call(kind, threads):
    p, _ = _packed(kind, _w(150, 1536))  # an odd number of column groups (4)
    x = _x(600, 1536)  # more rows than one block of x
    full = p(x, threads)
    for m in (1, 2, 5, 8, 9, 32, 33):
        assert torch.equal(p(x[:m], threads), full[:m]), m
    assert torch.equal(p(x[151:152], threads), full[151:152])
    assert torch.equal(p(x[7:12], 3 - threads), full[7:12])
    assert torch.equal(p(x[590:600]), full[590:600])
