"""Dequantize GGUF tensors to float32, vectorized over all blocks of a tensor (no Python loop per block):
dense types by their dtype, quantized ones through their block layout (layouts.py)."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.layouts import LAYOUTS
from ridgeline.gguf.reader import GGUFFile

SUPPORTED_TYPES = frozenset(LAYOUTS) | {
    GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
}


def check_type(qtype: GGMLQuantizationType | int, name: str) -> GGMLQuantizationType:
    """The tensor's type if Ridgeline reads it, else an error naming it and the types that load."""
    try:
        qtype = GGMLQuantizationType(qtype)
    except ValueError:
        raise ModelLoadError(f"tensor {name!r} has unknown GGML type id {qtype}") from None
    if qtype not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"tensor {name!r} has GGML type {qtype.name}, which Ridgeline cannot dequantize "
            f"(supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))})")
    return qtype


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType | int, shape: tuple[int, ...],
               name: str = "<tensor>") -> torch.Tensor:
    """Raw GGUF tensor bytes (uint8) -> float32 tensor of logical `shape` (torch order)."""
    qtype = check_type(qtype, name)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if qtype == GGMLQuantizationType.F32:
        out = torch.from_numpy(raw.copy().view(np.float32))
    elif qtype == GGMLQuantizationType.F16:
        out = torch.from_numpy(raw.copy().view(np.float16)).float()
    elif qtype == GGMLQuantizationType.BF16:
        out = torch.from_numpy(raw.copy().view(np.int16)).view(torch.bfloat16).float()
    else:
        size = GGML_QUANT_SIZES[qtype][1]
        if raw.size % size:
            raise ModelLoadError(f"tensor {name!r}: {raw.size} bytes are not whole {qtype.name} blocks")
        blocks = torch.from_numpy(raw.copy()).view(-1, size)
        out = LAYOUTS[qtype].unpack(blocks).values()
    n = int(np.prod(shape, dtype=np.int64))
    if out.numel() != n:
        raise ModelLoadError(f"tensor {name!r}: {raw.size} bytes of {qtype.name} do not hold shape {shape}")
    return out.reshape(shape)


def dequantize_tensor(g: GGUFFile, name: str) -> torch.Tensor:
    """Tensor `name` of an open GGUF file as float32, in torch order."""
    info = g.tensors[name]
    return dequantize(g.raw(info), info.qtype, info.shape, name)
