"""The 5- and 6-bit kept grids' packed layouts (kernels/gemm_int5.c: three k pairs a word, groups realigning every
96 k; gemm_int6.c: eight k pairs in three words): each kernel equals the dequantized weights against x rounded to
bf16, for every K the layouts allow (tails of 32 and 64 past a multiple of 96, k blocks), a row's result does not
depend on its batch, and the packed bytes stay within 1.15x the file's bits per weight."""
import pytest
import torch

from ridgeline.formats import rtn
from ridgeline.kernels import cpu_quant

pytestmark = pytest.mark.skipif(not cpu_quant.available("int5"), reason="needs AVX-512 with AVX512-BF16")


def _int5(N, K, sym, g):
    q = torch.randint(0, 32, (N, K), dtype=torch.uint8, generator=g)
    d = (torch.rand(N, K // 32, generator=g) * 0.02).half()
    return rtn.Int5Tensor(q, d, None if sym else (-(torch.rand(N, K // 32, generator=g) * 0.2)).half())


def _kgrid5(N, K, g):
    u = lambda: torch.randint(0, 64, (N, K // 32), dtype=torch.uint8, generator=g)
    h = lambda: (torch.rand(N, K // 256, generator=g) * 0.01).half()
    return rtn.KGridTensor(5, torch.randint(0, 32, (N, K), dtype=torch.uint8, generator=g), u(), u(), h(), h())


def _int6(N, K, g):
    return rtn.Int6Tensor(torch.randint(0, 64, (N, K), dtype=torch.uint8, generator=g),
                          torch.randint(-128, 128, (N, K // 16), dtype=torch.int8, generator=g),
                          (torch.rand(N, K // 256, generator=g) * 0.01).half())


def _check(t, packed, M, g):
    x = torch.randn(M, t.q.shape[1], generator=g)
    want = x.bfloat16().double() @ t.dequantize().double().T
    got = packed(x)
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err < 1e-5, err
    for r in (0, M - 1):  # a row alone gives its row of the batch, bit for bit
        assert torch.equal(packed(x[r:r + 1]), got[r:r + 1])


CASES = [("int5-sym", K) for K in (32, 64, 96, 160, 224, 2048, 2080)] + [("int5", K) for K in (32, 64, 160, 2080)] + \
        [("int5-k", K) for K in (256, 768, 2304)] + [("int6", K) for K in (256, 512, 2304)]


def _make(kind, N, K, g):
    t = {"int5-sym": lambda: _int5(N, K, True, g), "int5": lambda: _int5(N, K, False, g),
         "int5-k": lambda: _kgrid5(N, K, g), "int6": lambda: _int6(N, K, g)}[kind]()
    packer = {"int5-k": cpu_quant.PackedKGrid, "int6": cpu_quant.PackedInt6}.get(kind, cpu_quant.PackedInt5)
    return t, packer(t)


@pytest.mark.parametrize("kind,K", CASES)
def test_every_k_the_layout_allows(kind, K):
    g = torch.Generator().manual_seed(K)
    t, packed = _make(kind, 53, K, g)  # 53 columns: a partial column group
    for M in (1, 4, 7):
        _check(t, packed, M, g)


def test_k_blocks_start_on_unit_boundaries():
    """Rows of x past one block of L2 split K into blocks (a multiple of 96 k for int5): the batch still equals
    the reference and each row alone."""
    g = torch.Generator().manual_seed(7)
    for kind, K in (("int5", 2080), ("int5-k", 2304), ("int6", 2304)):
        _check(*_make(kind, 60, K, g), 200, g)


@pytest.mark.parametrize("name,file_bits", [("q5_0", 5.5), ("q5_1", 6.0), ("q5_k", 5.5), ("q6_k", 6.5625)])
def test_packed_bits_within_the_limit(name, file_bits):
    g = torch.Generator().manual_seed(1)
    N, K = 96, 2048
    _, packed = _make({"q5_0": "int5-sym", "q5_1": "int5", "q5_k": "int5-k", "q6_k": "int6"}[name], N, K, g)
    bits = packed.nbytes * 8 / (N * K)
    assert bits <= 1.15 * file_bits, (bits, file_bits)
