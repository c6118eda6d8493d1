"""Quantized weight formats as entries of the weight-format registry (layers/weight_formats.py).

    int8                      per-output-channel symmetric int8, fp32 scales
    int4, int4-g64, int4-g128 group-wise int4, asymmetric (fp16 scale and minimum per group, Q4_1's grid)
    int4-sym, int4-sym-g64, int4-sym-g128   symmetric (fp16 scale per group, Q4_0's grid)

Weight-only: activations stay fp32 between layers. A checkpoint tensor loads into an fp32 staging
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
from ridgeline.kernels import cpu_quant
from ridgeline.layers.weight_formats import WeightFormat, register_weight_format
from ridgeline.quant import rtn
from ridgeline.quant.options import INT4_GROUP_SIZES, format_name


class QuantizedFormat(WeightFormat):
    dtype = torch.float32  # of the staging weight checkpoint tensors load into
    shares_tied_weight = False  # a tied LM head loads the embedding's checkpoint tensor into its own staging
    kind = "?"  # kernel family: "int8" or "int4"

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
        if self.runs_kernel(layer.weight):
            layer.packed = self.pack(t)
        else:
            layer.quant = t
        layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.packed is not None:
            return layer.packed(x).to(x.dtype)
        return F.linear(x, layer.quant.dequantize().to(x.dtype))

    def stack_weight(self, layer: nn.Module) -> tuple[int, int, int] | str:
        if layer.packed is None:
            needs = "AVX-512 with AVX512-BF16" if self.kind == "int4" else "AVX-512"
            return f"{self.name} weights have no C kernel on this CPU (it needs {needs})"
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


class Int4(QuantizedFormat):
    kind = "int4"
    group = 32
    symmetric = False

    def check_shape(self, layer: nn.Module) -> None:
        K = layer.in_features
        if K % self.group:
            fits = [g for g in INT4_GROUP_SIZES if K % g == 0]
            raise InvalidRequestError(
                f"int4 group size {self.group} does not divide the {K} input columns of {layer.prefix or 'a layer'}; "
                f"group sizes that do: {', '.join(map(str, fits)) or 'none (this layer cannot be int4)'}",
                "quant_group_size")

    def quantize(self, w):
        return rtn.quantize_int4(w, self.group, self.symmetric)

    def pack(self, t):
        return cpu_quant.PackedInt4(t)


for _group in INT4_GROUP_SIZES:
    for _sym in (False, True):
        register_weight_format(format_name("int4", _group, _sym))(
            type(f"Int4{'Sym' if _sym else ''}G{_group}", (Int4,), {"group": _group, "symmetric": _sym}))
