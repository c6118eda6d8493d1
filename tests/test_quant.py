"""Quantized weight formats: round-to-nearest error bounds, the exact Q4_1 grid, the packed int8/int4
kernels against a dequantize-then-matmul reference, and rows that do not depend on their batch."""
import pytest
import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_quant
from ridgeline.formats import rtn

INT4 = [(g, s) for g in (32, 64, 128) for s in (False, True)]


def _w(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g) * torch.rand(N, 1, generator=g) * 0.2


def test_int8_round_trip_within_half_a_step():
    w = _w(70, 300)
    t = rtn.quantize_int8(w)
    assert t.q.dtype == torch.int8 and t.q.abs().max() <= 127 and t.scale.shape == (70,)
    err = (t.dequantize() - w).abs()
    assert bool((err <= t.scale[:, None] * (0.5 + 1e-5)).all())
    zero = rtn.quantize_int8(torch.zeros(2, 8))  # an all-zero row: scale 0, exact
    assert torch.equal(zero.dequantize(), torch.zeros(2, 8))


@pytest.mark.parametrize("group,sym", INT4)
def test_int4_round_trip_within_a_step(group, sym):
    w = _w(40, 256, seed=group)
    t = rtn.quantize_int4(w, group, sym)
    assert t.q.dtype == torch.uint8 and int(t.q.max()) <= 15 and t.scale.dtype == torch.float16
    assert t.scale.shape == (40, 256 // group) and (t.min is None) == sym
    d = t.scale.float().abs().repeat_interleave(group, dim=1)
    err = (t.dequantize() - w).abs()
    if sym:  # the group's largest magnitude maps to -8 exactly; its opposite end clamps at +7: a whole step
        assert bool((err <= d * (1 + 1e-3) + 1e-7).all())
    else:  # min and max are grid points; fp16 rounding of d and m adds a little
        m = t.min.float().abs().repeat_interleave(group, dim=1)
        assert bool((err <= d * (0.5 + 16 * 2**-10) + m * 2**-10 + 1e-7).all())
    assert float(err.mean()) < float(d.mean()) * 0.3  # most weights far closer than the bound


def test_int4_asymmetric_g32_reproduces_a_q4_1_grid_exactly():
    gguf = pytest.importorskip("gguf")
    from ridgeline.gguf.dequant import dequantize
    w = _w(16, 128).numpy()
    on_grid = dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1), gguf.GGMLQuantizationType.Q4_1,
                         (16, 128))
    assert torch.equal(rtn.quantize_int4(on_grid, 32, False).dequantize(), on_grid)


def test_int4_rejects_bad_group_sizes():
    with pytest.raises(InvalidRequestError, match="one of"):
        rtn.quantize_int4(torch.zeros(4, 96), 48, False)
    with pytest.raises(InvalidRequestError, match="does not divide"):
        rtn.quantize_int4(torch.zeros(4, 96), 64, False)


def test_int8_g32_round_trip_within_half_a_step_and_keeps_a_q8_0_grid():
    w = _w(24, 320)
    t = rtn.quantize_int8_g32(w)
    assert t.q.dtype == torch.int8 and t.q.abs().max() <= 127 and t.scale.shape == (24, 10)
    d = t.scale.float().repeat_interleave(32, dim=1)
    assert bool(((t.dequantize() - w).abs() <= d * (0.5 + 1e-3)).all())
    gguf = pytest.importorskip("gguf")
    from ridgeline.gguf.dequant import dequantize
    q8 = gguf.GGMLQuantizationType.Q8_0
    on_grid = dequantize(gguf.quants.quantize(w.numpy(), q8), q8, (24, 320))
    assert torch.equal(rtn.quantize_int8_g32(on_grid).dequantize(), on_grid)
    with pytest.raises(InvalidRequestError, match="multiples of 32"):
        rtn.quantize_int8_g32(torch.zeros(2, 48))


def _kinds():
    return [k for k in ("int8", "int4") if cpu_quant.available(k)] + (["int8-g32"] if cpu_quant.available("int8")
                                                                       else [])


def _packed(kind, w, group=32, sym=False):
    if kind == "int8":
        t = rtn.quantize_int8(w)
        return cpu_quant.PackedInt8(t), t.dequantize()
    if kind == "int8-g32":
        t = rtn.quantize_int8_g32(w)
        return cpu_quant.PackedInt8G32(t), t.dequantize()
    t = rtn.quantize_int4(w, group, sym)
    return cpu_quant.PackedInt4(t), t.dequantize()


def _reference(kind, x, wd):
    """fp64 x @ wd^T with x as the kernel reads it (cpu_quant.activations_as_read: rounded to bf16 for
    vdpbf16ps, int8-g32's int16 blocks with VNNI, or fp32)."""
    return cpu_quant.activations_as_read(kind, x).double() @ wd.double().T


CASES = [("int8", 32, False), ("int8-g32", 32, False)] + [("int4", g, s) for g, s in INT4]


@pytest.mark.parametrize("kind,group,sym", CASES)
@pytest.mark.parametrize("M", [1, 3, 4, 9, 70])
@pytest.mark.parametrize("N,K", [(96, 256), (37, 128), (5, 384), (200, 1536)])
def test_packed_kernel_equals_dequantize_then_matmul(kind, group, sym, M, N, K):
    if kind not in _kinds():
        pytest.skip(f"no {kind} kernel on this CPU")
    w, x = _w(N, K, seed=M + N), torch.randn(M, K)
    p, wd = _packed(kind, w, group, sym)
    got = p(x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    want = _reference(kind, x, wd)
    scale = (x.abs().double() @ wd.abs().double().T).clamp_min(1e-3)  # sum of |terms|: the rounding scale
    assert float(((got.double() - want).abs() / scale).max()) < 2e-6


@pytest.mark.parametrize("kind,group,sym", CASES)
@pytest.mark.parametrize("K", [256, 3072])  # 3072 at 300 rows: several k blocks and row chunks
def test_quantized_rows_do_not_depend_on_batch_size(kind, group, sym, K):
    if kind not in _kinds():
        pytest.skip(f"no {kind} kernel on this CPU")
    p, _ = _packed(kind, _w(150, K), group, sym)  # 150: an odd number of column groups (4)
    x = torch.randn(300, K)
    full = p(x)
    for m in (1, 2, 5, 8, 17):
        assert torch.equal(p(x[:m]), full[:m]), m
    assert torch.equal(p(x[151:152]), full[151:152])
    assert torch.equal(p(x[7:12]), full[7:12])


def test_int8_g32_reads_x_as_int16_blocks_closer_than_bf16_and_keeps_nan():
    """With VNNI the int8-g32 kernel holds x as int16 per block of 32 k (a step of 1 / 65534 of the block's
    largest value): against fp32 x it is closer than bf16 rounding, a block of zeros stays exact, and a value
    that is not finite makes every output NaN, as the float path's would."""
    if "int8-g32" not in _kinds() or cpu_quant.int8_g32_activations() != "int16":
        pytest.skip("the int8-g32 kernel reads x as int16 only with AVX512-BF16 and VNNI")
    w = _w(96, 256, seed=5)
    p, wd = _packed("int8-g32", w)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2))
    x[0, 64:96] = 0.0  # a block of zeros
    x[1, :32] *= 1000.0  # an outlier block beside ordinary ones
    exact = x.double() @ wd.double().T
    got = p(x).double()
    bf16 = x.bfloat16().double() @ wd.double().T
    assert float((got - exact).abs().max()) < 0.25 * float((bf16 - exact).abs().max())
    torch.testing.assert_close(cpu_quant.int16_blocks(x[:, 64:96])[0], torch.zeros(32))
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[2, 100] = bad
        y = p(xb)
        assert torch.isnan(y[2]).all() and torch.equal(y[:2], p(x)[:2])  # that row alone
