"""Quantized weight formats in the registry: every name is there, and a quantized Linear loads a fused
projection shard by shard, quantizes at finish(), applies its kernel and describes itself to the C stack."""
import pytest
import torch

from ridgeline.kernels import cpu_quant
from ridgeline.layers.kernel_plan import choose_kernels
from ridgeline.layers.linear import Linear
from ridgeline.layers.weight_formats import WEIGHT_FORMATS, create_weight_format
from ridgeline.layers import int_formats as _quant_formats  # noqa: F401  registers the quantized formats
from ridgeline.formats import rtn
from ridgeline.formats.options import format_name


def _w(N, K):
    return torch.randn(N, K, generator=torch.Generator().manual_seed(0)) * 0.1


def test_every_quantized_format_is_registered():
    for name in ("int8", "int8-g32", "int4", "int4-g64", "int4-g128", "int4-sym", "int4-sym-g64", "int4-sym-g128"):
        assert name in WEIGHT_FORMATS
    assert format_name("int4", 64, True) == "int4-sym-g64" and format_name("none", None, False) is None


@pytest.mark.parametrize("name", ["int8", "int8-g32", "int4", "int4-sym-g64"])
def test_quantized_linear_loads_shards_and_applies(name):
    """A fused projection loaded shard by shard, quantized at finish(): the layer applies the kernel (or,
    without one, the torch reference), drops its float copy and reports its stored bytes."""
    plan = choose_kernels(torch.device("cpu"), torch.float32, torch.float32)
    lin = Linear(128, 96, create_weight_format(name, plan), bias=True, shard_sizes=[64, 32], prefix="qkv")
    w = _w(96, 128)
    lin.load("weight", w[:64], 0)
    lin.load("weight", w[64:], 1)
    torch.nn.init.normal_(lin.bias)
    lin.finish_loading()
    assert lin.weight is None
    t = (rtn.quantize_int8(w) if name == "int8" else rtn.quantize_int8_g32(w) if name == "int8-g32"
         else rtn.quantize_int4(w, 64 if "g64" in name else 32, "sym" in name))
    x = torch.randn(3, 128)
    kind = "int8-g32" if name == "int8-g32" else "int8" if name == "int8" else "int4"
    xr = cpu_quant.activations_as_read(kind, x) if lin.packed is not None else x  # as the kernel reads x
    want = xr.double() @ t.dequantize().double().T + lin.bias.double()
    torch.testing.assert_close(lin(x).double(), want, atol=1e-4, rtol=1e-4)
    assert lin.format.weight_bytes(lin) < 96 * 128 * (1.1 if "int8" in name else 0.7)  # 1 or 0.5 B + scales
    desc = lin.format.stack_weight(lin)
    assert isinstance(desc, str) == (lin.packed is None)
