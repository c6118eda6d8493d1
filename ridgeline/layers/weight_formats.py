"""Weight formats: how a Linear stores, loads and applies its weight. A registry of entries, each
one class, bound per engine to its KernelPlan (vLLM calls these linear methods):

    create(layer)                     register the parameters (on the meta device at construction)
    load(layer, param, tensor, shard) copy one checkpoint tensor into a parameter (a shard of a
                                      fused projection, or the whole of it; already-packed layouts too)
    finish(layer)                     after every tensor is in: repack for the kernels
    apply(layer, x)                   x [M, K] -> [M, N] in x's dtype, without the bias
    stack_weight(layer)               (C format code, data pointer, scale pointer) for the C decoder
                                      stack (codes: kernels/formats.py), or a sentence saying why the
                                      stack cannot run it

Dense fp32 and bf16 (and fp16, GPU only) are the first entries; the quantized ones register from
ridgeline/layers/int_formats.py, which layers/build_options.py (where formats are chosen by name) imports.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_gemm, cpu_gemv
from ridgeline.kernels.formats import code_of
from ridgeline.layers.kernel_plan import KernelPlan

WEIGHT_FORMATS: dict[str, type[WeightFormat]] = {}

# the dense formats' codes in the C descriptors (kernels/formats.py)
C_F32_PACKED, C_BF16_PACKED = code_of("f32"), code_of("bf16")


def register_weight_format(name: str):
    def deco(cls):
        cls.name = name
        WEIGHT_FORMATS[name] = cls
        return cls
    return deco


def create_weight_format(name: str, plan: KernelPlan) -> WeightFormat:
    try:
        return WEIGHT_FORMATS[name](plan)
    except KeyError:
        raise ValueError(f"unknown weight format {name!r}; known: {', '.join(sorted(WEIGHT_FORMATS))}") from None


class WeightFormat:
    name = "?"
    dtype: torch.dtype
    shares_tied_weight = True  # an LM head tied to the embedding uses the embedding's tensor as its weight

    def takes(self, tensor) -> bool:
        """Whether load() takes this block object (a GGUF file's, an MXFP4 checkpoint's) as it is; the formats
        that keep blocks say which they keep, for every other one blocks arrive dequantized."""
        return False

    def __init__(self, plan: KernelPlan):
        self.plan = plan

    def create(self, layer: nn.Module) -> None:
        raise NotImplementedError

    def load(self, layer: nn.Module, param: str, tensor: torch.Tensor, shard: int | None) -> None:
        load_rows(getattr(layer, param).data, tensor, layer.shard_rows(shard), f"{param} of {layer.prefix}")

    def finish(self, layer: nn.Module) -> None:
        pass

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def stack_weight(self, layer: nn.Module) -> tuple[int, int, int] | str:
        return f"weight format {self.name} has no C kernel"

    def weight_bytes(self, layer: nn.Module) -> int:
        raise NotImplementedError

    def label(self, layer: nn.Module) -> str:
        """What the start-up summary calls this layer's weight."""
        return self.name


def load_rows(dst: torch.Tensor, tensor: torch.Tensor, rows: tuple[int, int] | None, what: str) -> None:
    """Copy tensor into dst, or into its rows [start, start + size) for a shard of a fused projection."""
    if rows is not None:
        dst = dst.narrow(0, *rows)
    if tuple(dst.shape) != tuple(tensor.shape):
        raise ValueError(f"{what}: checkpoint shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(tensor)


class _Dense(WeightFormat):
    """A [N, K] weight in one float dtype; on AVX-512 CPUs repacked once for the packed kernel."""

    def create(self, layer: nn.Module) -> None:
        layer.weight = nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=self.dtype),
                                    requires_grad=False)  # [N, K]
        layer.packed = None  # cpu_gemm.PackedWeight once finish() repacks it

    def finish(self, layer: nn.Module) -> None:
        """A weight shared with another module (tied embeddings) stays there; the layer keeps the packed copy."""
        if layer.packed is None and layer.weight is not None and self.plan.packs(layer.weight):
            layer.packed = cpu_gemm.PackedWeight(layer.weight)
            layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.packed is not None:
            return layer.packed(x).to(x.dtype)
        return dense_matmul(x, layer.weight, self.plan)

    def stack_weight(self, layer: nn.Module) -> tuple[int, int, int] | str:
        if layer.packed is None:
            return f"{self.name} weight is not repacked for the C matmul on this CPU"
        return (C_F32_PACKED if layer.packed.dtype == torch.float32 else C_BF16_PACKED), layer.packed.data.data_ptr(), 0

    def weight_bytes(self, layer: nn.Module) -> int:
        return layer.packed.nbytes if layer.packed is not None else layer.weight.numel() * layer.weight.element_size()


@register_weight_format("f32")
class DenseF32(_Dense):
    dtype = torch.float32


@register_weight_format("bf16")
class DenseBF16(_Dense):
    dtype = torch.bfloat16


@register_weight_format("f16")
class DenseF16(_Dense):
    dtype = torch.float16


DENSE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def dense_matmul(x: torch.Tensor, w: torch.Tensor, plan: KernelPlan) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T -> [M, N] in x's dtype, for an unpacked weight."""
    if plan.skinny == "c" and x.shape[0] <= plan.skinny_max_m and w.dtype in (torch.float32, torch.bfloat16):
        return cpu_gemv.gemv(x, w).to(x.dtype)
    if x.dtype == w.dtype:
        return F.linear(x, w)
    return F.linear(x.to(w.dtype), w).to(x.dtype)  # bf16 weights, fp32 activations (CPU): GEMM in bf16


def keep_shard(layer: nn.Module, param: str, blocks, shard: int | None) -> None:
    """A format that keeps a checkpoint's blocks as stored (GGUF's, an MXFP4 checkpoint's): shard `shard`'s
    blocks, their shape checked, set aside in layer.blocks until finish()."""
    rows = layer.shard_rows(shard)
    want = (rows[1] if rows else layer.out_features, layer.in_features)
    if tuple(blocks.shape) != want:
        raise ValueError(f"{param} of {layer.prefix}: checkpoint shape {tuple(blocks.shape)}, expected {want}")
    layer.blocks[shard] = blocks


def kept_shards(layer: nn.Module) -> list[int | None]:
    """The shards a kept-blocks layer holds in order ([None]: the whole weight at once)."""
    return [None] if None in layer.blocks else list(range(len(layer.shard_sizes or [None])))
