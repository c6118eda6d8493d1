"""Floating-point weight formats as entries of the weight-format registry (formats/fpq.py defines the numbers):

    fp8, fp8-e5m2                     E4M3 / E5M2, one fp32 scale per output channel; weight-only
    fp8-tensor, fp8-e5m2-tensor       the same with one scale for the whole tensor
    mxfp8                             E4M3 in blocks of 32 along K with an E8M0 scale; weight-only
    mxfp4                             E2M1 in blocks of 32 with an E8M0 scale; activations int8 per row and block of 32
    mxfp4-kept                        mxfp4 from an MXFP4 checkpoint's own blocks (GPT-OSS's experts), never decoded
    nvfp4                             E2M1 in blocks of 16 with an E4M3 scale and a fp32 tensor scale; activations
                                      int8 per row and block of 16

fp8 is emulated (converted to fp32 in the kernel, kernels/gemm_fp8.c); fp4 runs natively with integer
dot products, so mxfp4 and nvfp4 quantize each linear's input inside their C call, at every batch size
(the activation format belongs to the weight format, as for w4a8). Weights load into an fp32 staging
copy, quantized and packed in finish() like the int formats (layers/int_formats.py). The fp8 formats also
take an fp8 checkpoint's own values (weights/fp8_checkpoint.py): a float8 `weight` with its per-tensor or
per-channel `weight_scale`, kept exactly, never re-quantized.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ridgeline.errors import ModelLoadError
from ridgeline.kernels import cpu_fpquant
from ridgeline.layers.weight_formats import keep_shard, kept_shards, load_rows, register_weight_format
from ridgeline.formats import fpq, rtn
from ridgeline.weights.mxfp4_checkpoint import MxBlocks
from ridgeline.layers.int_formats import QuantizedFormat


class Fp8(QuantizedFormat):
    kind = "fp8"
    element = "e4m3"
    per_tensor = False
    extra_tensors = ("weight_scale",)  # a checkpoint's scales (loaded beside a float8 `weight`)

    def create(self, layer: nn.Module) -> None:
        super().create(layer)
        layer.ckpt_rows = 0  # rows loaded as checkpoint fp8 values (not floats to quantize)
        layer.ckpt_scale = None  # [N] fp32 once a checkpoint scale arrives

    def keeps(self, dtype: torch.dtype) -> bool:
        """Whether a checkpoint weight of this dtype loads as it is (the same fp8 element)."""
        return dtype == fpq.FP8_DTYPES[self.element]

    def load(self, layer: nn.Module, param: str, tensor: torch.Tensor, shard: int | None) -> None:
        rows = layer.shard_rows(shard) or (0, layer.out_features)
        if param == "weight_scale":
            if layer.ckpt_scale is None:
                layer.ckpt_scale = torch.full((layer.out_features,), math.nan)
            load_rows(layer.ckpt_scale, tensor.float().reshape(-1), rows, f"weight_scale of {layer.prefix}")
            return
        if param == "weight" and tensor.dtype in fpq.FP8_DTYPES.values():
            if not self.keeps(tensor.dtype):
                raise ValueError(f"{tensor.dtype} weight for the {self.name} format")
            layer.ckpt_rows += rows[1]
            tensor = tensor.float()  # exact: every fp8 value is an fp32 one
        super().load(layer, param, tensor, shard)

    def quantize(self, w):
        return fpq.quantize_fp8(w, self.element, self.per_tensor)

    def pack(self, t):
        return cpu_fpquant.PackedFp8(t)

    def finish(self, layer: nn.Module) -> None:
        if layer.weight is None or not layer.ckpt_rows:
            return super().finish(layer)
        scale = layer.ckpt_scale
        if layer.ckpt_rows != layer.out_features or scale is None or bool(torch.isnan(scale).any()):
            raise ModelLoadError(f"{layer.prefix}: an fp8 checkpoint needs every row of the weight in fp8 with its "
                                 "weight_scale (a fused projection takes all its parts in fp8)")
        t = fpq.Fp8Tensor(layer.weight.detach().to(fpq.FP8_DTYPES[self.element]), scale.contiguous())
        self.place(layer, t, layer.weight)
        layer.weight = layer.ckpt_scale = None


class Block(QuantizedFormat):
    """mxfp8, mxfp4, nvfp4: the format name is the fpq kind"""

    def check_shape(self, layer: nn.Module) -> None:
        fpq.check_block(self.name, layer.in_features, layer.prefix or "a layer")

    def quantize(self, w):
        return fpq.quantize(w, self.name)


@register_weight_format("mxfp8")
class MxFp8(Block):
    kind = "fp8"

    def pack(self, t):
        return cpu_fpquant.PackedFp8(t)


class Fp4(Block):
    kind = "fp4"
    block = fpq.MX_BLOCK

    def pack(self, t):
        return cpu_fpquant.PackedFp4(t)

    def activations(self, x):
        return rtn.fake_quantize_rows(x, self.block)


@register_weight_format("mxfp4")
class MxFp4(Fp4):
    pass


@register_weight_format("mxfp4-kept")
class KeptMxFp4(MxFp4):
    """An MXFP4 checkpoint's blocks (weights/mxfp4_checkpoint.py MxBlocks), kept as stored: each shard's blocks
    aside until finish() packs them for the kernel; never a float staging copy."""

    def takes(self, tensor) -> bool:
        return isinstance(tensor, MxBlocks)

    def create(self, layer: nn.Module) -> None:
        self.check_shape(layer)
        layer.weight = nn.Parameter(torch.empty(0), requires_grad=False)  # placeholder: the blocks are kept aside
        layer.blocks = {}  # shard (None: the whole weight) -> MxBlocks
        layer.packed = layer.quant = None

    def load(self, layer: nn.Module, param: str, tensor, shard: int | None) -> None:
        if not self.takes(tensor):
            raise ValueError(f"{param} of {layer.prefix}: format {self.name} loads an MXFP4 checkpoint's blocks, "
                             f"got {type(tensor).__name__}")
        keep_shard(layer, param, tensor, shard)

    def finish(self, layer: nn.Module) -> None:
        if layer.weight is None:
            return
        shards = kept_shards(layer)
        missing = [s for s in shards if s not in layer.blocks]
        if missing:
            raise ModelLoadError(f"{layer.prefix}: the MXFP4 checkpoint has no blocks for shard(s) {missing}")
        parts = [layer.blocks[s].block_tensor() for s in shards]
        t = fpq.BlockTensor("mxfp4", torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))
        self.place(layer, t, layer.weight)
        layer.weight, layer.blocks = None, None

    def label(self, layer: nn.Module) -> str:
        return "mxfp4 (checkpoint blocks)"


@register_weight_format("nvfp4")
class NvFp4(Fp4):
    block = fpq.NV_BLOCK


for _element in ("e4m3", "e5m2"):
    for _per_tensor in (False, True):
        _name = "fp8" + ("-e5m2" if _element == "e5m2" else "") + ("-tensor" if _per_tensor else "")
        register_weight_format(_name)(type(f"Fp8{_element.upper()}{'Tensor' if _per_tensor else ''}", (Fp8,),
                                           {"element": _element, "per_tensor": _per_tensor}))
