"""Quantized weight formats as entries of the weight-format registry (layers/weight_formats.py).

    int8                      per-output-channel symmetric int8, fp32 scales
    int8-g32                  int8 with an fp16 scale per 32 input columns (GGUF Q8_0's grid)
    int4, int4-g64, int4-g128 group-wise int4, asymmetric (fp16 scale and minimum per group, Q4_1's grid)
    int4-sym, int4-sym-g64, int4-sym-g128   symmetric (fp16 scale per group, Q4_0's grid)
    (int5, int5-sym)          5-bit in groups of 32 (Q5_1's and Q5_0's grids): GGUF blocks kept only (gguf/kept.py)
    (iq4-nl, iq4-xs)          IQ4_NL's and IQ4_XS's non-linear 4-bit grids: GGUF blocks kept only
    (int4-k, int5-k)          Q4_K's and Q5_K's grids (6-bit scales and minimums per 32 by fp16 per 256): GGUF kept only
    (int3, int2)              Q3_K's and Q2_K's grids (per 16 k a byte of scale, per 256 an fp16): GGUF blocks kept only
    (int6)                    Q6_K's grid (6-bit, an int8 scale per 16 by an fp16 scale per 256): GGUF blocks kept only
    w8a8                      int8's weights; each linear's input quantized to int8 per block of 32 of a row
                              inside the call
    w8a8-g32                  int8-g32's weights (Q8_0's grid), the input as w8a8's (w4a8's LM head)
    w4a8, w4a8-sym, ...       int4's weights; the input quantized to int8 per group of G of a row

Activations stay fp32 between layers; the a8 formats quantize a layer's input as part of its matmul
(kernels/gemm_a8.c), whatever the number of rows, so the activation format belongs to the weight
format and never changes with the batch. A checkpoint tensor loads into an fp32 staging
weight (a shard of a fused projection at a time); finish() quantizes it round-to-nearest, packs it
for the C kernel (kernels/cpu_quant.py) and drops the float copy, so the C decoder stack and the
module path call the same kernel on the same packed data. Without the kernel (no AVX-512) apply()
dequantizes and multiplies in torch, and the decoder stack names the layer at start-up.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_quant, triton_quant
from ridgeline.layers.weight_formats import WeightFormat, register_weight_format
from ridgeline.formats import rtn
from ridgeline.formats.options import INT4_GROUP_SIZES, format_name


class QuantizedFormat(WeightFormat):
    dtype = torch.float32  # of the staging weight checkpoint tensors load into
    shares_tied_weight = False  # a tied LM head loads the embedding's checkpoint tensor into its own staging
    kind = "?"  # kernel family: one of kernels/cpu_quant.KINDS

    def check_shape(self, layer: nn.Module) -> None:
        pass

    def quantize(self, w: torch.Tensor):
        raise NotImplementedError

    def pack(self, t) -> cpu_quant.PackedQuant:
        raise NotImplementedError

    def create(self, layer: nn.Module) -> None:
        self.check_shape(layer)
        layer.weight = nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=self.dtype),
                                    requires_grad=False)  # [N, K] float until finish()
        layer.packed = None  # cpu_quant.PackedInt8 / PackedInt4 where the kernel runs
        layer.quant = None  # rtn.Int8Tensor / Int4Tensor elsewhere

    def runs_kernel(self, w: torch.Tensor) -> bool:
        return w.device.type == "cpu" and self.kind in self.plan.quant

    def finish(self, layer: nn.Module) -> None:
        """Quantize the loaded float weight, pack it for the kernel and drop the float copy."""
        if layer.weight is None:
            return
        t = self.quantize(layer.weight.detach())
        self.place(layer, t, layer.weight)
        layer.weight = None

    def place(self, layer: nn.Module, t, w: torch.Tensor) -> None:
        """Keep quantized tensor t (of weight w's device) as the layer computes with it: packed for the
        C kernel on a CPU that has it, for the Triton kernel on CUDA, else as it is (torch dequantizes)."""
        layer.packed = layer.quant = None
        if self.runs_kernel(w):
            layer.packed = self.pack(t)
        elif triton_quant.available(w):
            layer.packed = triton_quant.pack(t)
        else:
            layer.quant = t

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if isinstance(layer.packed, triton_quant.TritonWeight):  # weight-only kernel: inputs rounded here
            return layer.packed(self.activations(x)).to(x.dtype)
        if layer.packed is not None:
            return layer.packed(x).to(x.dtype)
        return F.linear(self.activations(x), layer.quant.dequantize().to(x.dtype))

    def activations(self, x: torch.Tensor) -> torch.Tensor:
        """x as the kernel sees it, for the torch path (weight-only: unchanged)."""
        return x

    def stack_weight(self, layer: nn.Module) -> tuple[int, int, int] | str:
        if isinstance(layer.packed, triton_quant.TritonWeight):
            return f"{self.name} weights are on {layer.packed.code.device.type} (the Triton kernel's)"
        if layer.packed is None:
            return f"{self.name} weights have no C kernel on this CPU (it needs {cpu_quant.NEEDS[self.kind]})"
        return layer.packed.code, layer.packed.data.data_ptr(), layer.packed.scale.data_ptr()

    def weight_bytes(self, layer: nn.Module) -> int:
        if layer.packed is not None:
            return layer.packed.nbytes
        if layer.quant is None:  # not finished yet: the float staging weight
            return layer.weight.numel() * layer.weight.element_size()
        return layer.quant.nbytes


@register_weight_format("int8")
class Int8(QuantizedFormat):
    kind = "int8"

    def quantize(self, w):
        return rtn.quantize_int8(w)

    def pack(self, t):
        return cpu_quant.PackedInt8(t)


@register_weight_format("int8-g32")
class Int8G32(Int8):
    def check_shape(self, layer: nn.Module) -> None:
        if layer.in_features % 32:
            raise InvalidRequestError(f"{self.name} needs input columns in multiples of 32; "
                                      f"{layer.prefix or 'a layer'} has {layer.in_features}", "quantization")

    def quantize(self, w):
        return rtn.quantize_int8_g32(w)

    def pack(self, t):
        return cpu_quant.PackedInt8G32(t)


class Int4(QuantizedFormat):
    kind = "int4"
    group = 32
    symmetric = False

    def check_shape(self, layer: nn.Module) -> None:
        K = layer.in_features
        if K % self.group:
            fits = [g for g in INT4_GROUP_SIZES if K % g == 0]
            raise InvalidRequestError(
                f"{self.kind} group size {self.group} does not divide the {K} input columns of "
                f"{layer.prefix or 'a layer'}; "
                f"group sizes that do: {', '.join(map(str, fits)) or 'none (this layer cannot be int4)'}",
                "quant_group_size")

    def quantize(self, w):
        return rtn.quantize_int4(w, self.group, self.symmetric)

    def pack(self, t):
        return cpu_quant.PackedInt4(t)


class KeptGrid(QuantizedFormat):
    """A GGUF block grid kept as the file stores it (gguf/kept.py): no round-to-nearest quantizer of its own; its
    kernel's packing (`packer`, a cpu_quant class) needs input columns in multiples of `multiple`."""
    multiple = 256
    packer = None

    def check_shape(self, layer: nn.Module) -> None:
        if layer.in_features % self.multiple:
            raise InvalidRequestError(f"{self.name} needs input columns in multiples of {self.multiple}; "
                                      f"{layer.prefix or 'a layer'} has {layer.in_features}", "quantization")

    def pack(self, t):
        return self.packer(t)


class Int5(KeptGrid):
    """5-bit weights in groups of 32 (GGUF Q5_0 / Q5_1 / Q5_K blocks)."""
    kind, group, symmetric, multiple, packer = "int5", 32, False, 32, cpu_quant.PackedInt5


class Int6(KeptGrid):
    """Q6_K's grid."""
    kind, group, symmetric, packer = "int6", 16, True, cpu_quant.PackedInt6


class IQ4(KeptGrid):
    """IQ4_NL's grid (blocks of 32); IQ4_XS's with multiple 256."""
    kind, multiple, packer = "iq4", 32, cpu_quant.PackedIQ4


class Int4K(KeptGrid):
    """Q4_K's grid, on the int4 kernel's nibbles."""
    kind, group, symmetric, packer = "int4", 32, False, cpu_quant.PackedKGrid


class Int5K(KeptGrid):
    """Q5_K's grid, on the int5 kernel's nibbles and high bits."""
    kind, group, symmetric, packer = "int5", 32, False, cpu_quant.PackedKGrid


class KQ(KeptGrid):
    """Q3_K's grid; Q2_K's with bits 2."""
    kind, bits, packer = "kq", 3, cpu_quant.PackedKQ


@register_weight_format("w8a8")
class W8A8(Int8):
    kind = "w8a8"

    def check_shape(self, layer: nn.Module) -> None:
        if layer.in_features % 4:
            raise InvalidRequestError(f"w8a8 needs input columns in multiples of 4; {layer.prefix or 'a layer'} "
                                      f"has {layer.in_features}", "quantization")

    def pack(self, t):
        return cpu_quant.PackedW8A8(t)

    def activations(self, x):
        return rtn.fake_quantize_rows(x, rtn.A8_BLOCK)


@register_weight_format("w8a8-g32")
class W8A8G32(Int8G32, W8A8):
    """int8-g32's grid and shape check, w8a8's kind and activations."""

    def pack(self, t):
        return cpu_quant.PackedW8A8G32(t)


class W4A8(Int4):
    kind = "w4a8"

    def pack(self, t):
        return cpu_quant.PackedW4A8(t)

    def activations(self, x):
        return rtn.fake_quantize_rows(x, self.group)


for _group in INT4_GROUP_SIZES:
    for _sym in (False, True):
        for _base, _quant in ((Int4, "int4"), (W4A8, "w4a8")):
            _cls = type(f"{_base.__name__}{'Sym' if _sym else ''}G{_group}", (_base,),
                        {"group": _group, "symmetric": _sym})
            register_weight_format(format_name(_quant, _group, _sym))(_cls)
