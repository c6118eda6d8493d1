"""The masked LM head: when every row of a greedy step has a structured-output mask, the fused head +
argmax call computes only the column groups holding a token some row allows (kernels/tile_driver.c's
column filter), in every weight format the C stack runs; each logit it computes is bitwise the full
head's, and each row's token the full head's masked argmax."""
from __future__ import annotations

import functools
import random

import pytest
import torch

from ridgeline.kernels import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="no C kernels")

K = 128  # every format's k granularity divides it (int4 g128, MX blocks of 32)
GROUP = 48  # output columns per column group, every packed kernel's (QT_NC, gemm_packed.c's NC)


def _formats():
    from ridgeline.formats import fpq, rtn
    from ridgeline.kernels import cpu_fpquant, cpu_quant
    yield "i8", lambda w: cpu_quant.PackedInt8(rtn.quantize_int8(w))
    yield "i8g32", lambda w: cpu_quant.PackedInt8G32(rtn.quantize_int8_g32(w))
    yield "w8a8", lambda w: cpu_quant.PackedW8A8(rtn.quantize_int8(w))
    yield "w8a8g32", lambda w: cpu_quant.PackedW8A8G32(rtn.quantize_int8_g32(w))
    for g in (32, 64, 128):
        for sym in (False, True):
            yield f"i4{'sym' if sym else ''}g{g}", lambda w, g=g, sym=sym: cpu_quant.PackedInt4(
                rtn.quantize_int4(w, g, sym))
            yield f"w4a8{'sym' if sym else ''}g{g}", lambda w, g=g, sym=sym: cpu_quant.PackedW4A8(
                rtn.quantize_int4(w, g, sym))
    for element in ("e4m3", "e5m2"):
        yield f"fp8{element}", lambda w, e=element: cpu_fpquant.PackedFp8(fpq.quantize_fp8(w, e))
    yield "mxfp8", lambda w: cpu_fpquant.PackedFp8(fpq.quantize_mx(w, "mxfp8"))
    yield "mxfp4", lambda w: cpu_fpquant.PackedFp4(fpq.quantize_mx(w, "mxfp4"))
    yield "nvfp4", lambda w: cpu_fpquant.PackedFp4(fpq.quantize_nvfp4(w))


FORMATS = ["f32", "bf16", *(name for name, _ in _formats())]


@functools.lru_cache(maxsize=None)
def _head(fmt: str, N: int):
    """(the head's descriptor, what it points at) for a random [N, K] head in format fmt, with a bias when
    N is odd."""
    from ridgeline.kernels import cpu_stack
    from ridgeline.kernels.cpu_gemm import PackedWeight
    from ridgeline.layers.weight_formats import C_BF16_PACKED, C_F32_PACKED
    g = torch.Generator().manual_seed(N)
    W = torch.randn(N, K, generator=g)
    if fmt in ("f32", "bf16"):
        packed = PackedWeight(W if fmt == "f32" else W.bfloat16())
        fields = (C_F32_PACKED if fmt == "f32" else C_BF16_PACKED), packed.data.data_ptr(), 0
    else:
        packed = dict(_formats())[fmt](W)
        fields = packed.code, packed.data.data_ptr(), packed.scale.data_ptr()
    if not cpu_stack.runs_weight_format(fields[0]):
        pytest.skip(f"this CPU does not run {fmt}")
    bias = torch.randn(N, generator=g) if N % 2 else None
    desc = torch.tensor([*fields, 0 if bias is None else bias.data_ptr()], dtype=torch.int64)
    return desc, (packed, bias)


def _bits(allowed, V: int) -> bytes:
    words = [0] * ((V + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return b"".join(w.to_bytes(4, "little") for w in words)


def _call(desc, x, N, masks):
    """(logits, choices) of the fused call; y starts NaN, so what it leaves unwritten shows."""
    from ridgeline.kernels import cpu_stack
    from ridgeline.models.llama import _mask_rows
    y, ids = torch.full((x.shape[0], N), float("nan")), torch.empty(x.shape[0], dtype=torch.int64)
    cpu_stack.linear_argmax(desc, x, y, ids, *_mask_rows(masks, x.shape[0], N))
    return y, ids


def _reference(y: torch.Tensor, allowed: list[list[int]]) -> list[int]:
    """torch.argmax over each row's logits with every forbidden token -inf."""
    out = torch.full_like(y, float("-inf"))
    for m, a in enumerate(allowed):
        out[m, a] = y[m, a]
    return out.argmax(-1).tolist()


def _live_groups() -> int:
    from ridgeline.kernels import cpu
    return cpu.lib().ridgeline_td_last_live_groups()


@pytest.fixture
def threads(request):
    saved = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(saved)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("N", [1000, 4099])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_masked_head_computes_the_allowed_groups_bitwise(fmt, N, threads):
    desc, _ = _head(fmt, N)
    groups = -(-N // GROUP)
    rng = random.Random(f"{fmt}{N}{threads}")
    for M in (1, 3, 9):
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(M))
        picks = [0, 1, 2, groups // 2, groups - 1]  # adjacent groups (a lone row's wide tiles), the last, partial
        allowed = []
        for m in range(M):
            gs = rng.sample(picks, 2) if m % 3 else picks[:4]
            a = {min(N - 1, g * GROUP + rng.randrange(GROUP)) for g in gs}
            allowed.append(sorted(a | {N - 1} if m == 2 else a))
        masks = [_bits(a, N) for a in allowed]
        y_full, ids_full = _call(desc, x, N, [None] * M)
        assert ids_full.tolist() == y_full.argmax(-1).tolist()
        y, ids = _call(desc, x, N, masks)
        live = sorted({t // GROUP for a in allowed for t in a})
        assert _live_groups() == len(live) < groups
        cols = torch.tensor([c for g in live for c in range(g * GROUP, min(N, (g + 1) * GROUP))])
        assert torch.equal(y[:, cols], y_full[:, cols]), "the computed logits are the full head's"
        skipped = torch.ones(N, dtype=torch.bool)
        skipped[cols] = False
        assert y[:, skipped].isnan().all(), "the other groups are left unwritten"
        for m, a in enumerate(allowed):
            assert torch.equal(y[m, a], y_full[m, a])
        # the same rows beside an unmasked one: no filter, every group computed
        _, ids_unfiltered = _call(desc, torch.cat([x, x[:1]]), N, [*masks, None])
        assert _live_groups() == groups
        assert ids.tolist() == ids_unfiltered[:M].tolist() == _reference(y_full, allowed)


def test_the_filter_skips_the_groups_no_row_allows():
    from ridgeline.kernels import cpu_stack
    N = 1000
    desc, _ = _head("i8g32", N)
    words = (N + 31) // 32
    x = torch.randn(4, K)

    def call(masks, mask_of, full=False):
        y, ids = torch.empty(len(mask_of), N), torch.empty(len(mask_of), dtype=torch.int64)
        cpu_stack.linear_argmax(desc, x[:len(mask_of)], y, ids, masks, torch.tensor(mask_of, dtype=torch.int64),
                                full=full)
        return _live_groups(), ids.tolist()

    def rows(*allowed):
        return torch.frombuffer(bytearray(b"".join(_bits(a, N) for a in allowed)), dtype=torch.int32).view(-1, words)

    y_full, _ = _call(desc, x, N, [None] * 4)
    assert call(rows([5, 600]), [0])[0] == 2  # groups 0 and 12
    assert call(rows([50, 100]), [0])[0] == 2  # groups 1 and 2: one wide tile
    assert call(rows([5, 600]), [0, 0, 0])[0] == 2  # rows sharing one mask
    n, ids = call(rows([5], [600, 999]), [0, 1, 0])  # the union: groups 0, 12 and the last
    assert n == 3 and ids == _reference(y_full[:3], [[5], [600, 999], [5]])
    assert call(rows([5], [600]), [0, -1])[0] == -(-N // GROUP)  # an unmasked row needs every group
    assert call(rows([]), [0, 0]) == (0, [0, 0])  # nothing allowed: nothing computed, token 0 as torch.argmax
    assert call(rows(range(N)), [0])[0] == -(-N // GROUP)
    masked, full = call(rows([5], [600, 999]), [0, 1], full=False), call(rows([5], [600, 999]), [0, 1], full=True)
    assert full[0] == -(-N // GROUP) and masked[0] == 3 and full[1] == masked[1]  # full: every group, same ids
