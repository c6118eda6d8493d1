"""Dequantize GGUF tensors to float32, vectorized over all blocks of a tensor with torch (no Python loop
per block). The header parser lives in gguf_reader.py; its names are re-exported here.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ridgeline.errors import ModelLoadError
from ridgeline.weights.gguf_reader import GGUFFile, GGUFTensorInfo, read_gguf

__all__ = ["GGUFFile", "GGUFTensorInfo", "SUPPORTED_TYPES", "dequantize", "read_gguf"]


def _blocks(raw: np.ndarray, type_size: int) -> torch.Tensor:
    return torch.from_numpy(np.array(raw, copy=True)).view(-1, type_size)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # [n, 16] bytes -> [n, 32] values: low nibbles are elements 0..15, high nibbles 16..31.
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _q8_0(b):
    return _f16(b[:, :2]) * b[:, 2:].view(torch.int8).float()


def _q4_0(b):
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).float() - 8.0)


def _q4_1(b):
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).float() + _f16(b[:, 2:4])


def _q4_k(b):
    d, dmin, sc, qs = _f16(b[:, :2]), _f16(b[:, 2:4]), b[:, 4:16].int(), b[:, 16:]
    # 8 sub-blocks of 32 share 6-bit scales/mins packed into 12 bytes.
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    scale = d * torch.cat([lo_s, hi_s], 1).float()  # [n, 8]
    mins = dmin * torch.cat([lo_m, hi_m], 1).float()
    # qs is 4 chunks of 32 bytes; chunk c holds sub-block 2c (low nibbles) and 2c+1 (high nibbles).
    q = qs.reshape(-1, 4, 1, 32)
    q = torch.cat([q & 0x0F, q >> 4], dim=2).reshape(-1, 8, 32).float()
    return (scale.unsqueeze(-1) * q - mins.unsqueeze(-1)).reshape(-1, 256)


def _q6_k(b):
    ql, qh = b[:, :128].reshape(-1, 2, 2, 32), b[:, 128:192].reshape(-1, 2, 1, 32)
    sc = b[:, 192:208].contiguous().view(torch.int8).float().reshape(-1, 2, 8)
    d = _f16(b[:, 208:210])
    # Each 128-element half h: element 32*j + l, j in 0..3, low 4 bits from ql[h][j % 2] (low nibble
    # for j < 2), high 2 bits from qh[h] at bit 2*j; scale index 16-element group.
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # [n, 2, 4, 32]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = (low | (high << 4)).float() - 32.0  # [n, 2, 4, 32]
    scale = sc.reshape(-1, 2, 4, 2, 1).expand(-1, 2, 4, 2, 16).reshape(-1, 2, 4, 32)
    return (d.view(-1, 1, 1, 1) * scale * q).reshape(-1, 256)


_QUANTIZED = {
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}
SUPPORTED_TYPES = frozenset(_QUANTIZED) | {
    GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
}


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType | int, shape: tuple[int, ...],
               name: str = "<tensor>") -> torch.Tensor:
    """Raw GGUF tensor bytes (uint8) -> float32 tensor of logical `shape` (torch order)."""
    try:
        qtype = GGMLQuantizationType(qtype)
    except ValueError:
        raise ModelLoadError(f"tensor {name!r} has unknown GGML type id {qtype}") from None
    if qtype not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"tensor {name!r} has GGML type {qtype.name}, which Ridgeline cannot dequantize "
            f"(supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))})")
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if qtype == GGMLQuantizationType.F32:
        out = torch.from_numpy(raw.copy().view(np.float32))
    elif qtype == GGMLQuantizationType.F16:
        out = torch.from_numpy(raw.copy().view(np.float16)).float()
    elif qtype == GGMLQuantizationType.BF16:
        out = torch.from_numpy(raw.copy().view(np.int16)).view(torch.bfloat16).float()
    else:
        out = _QUANTIZED[qtype](_blocks(raw, GGML_QUANT_SIZES[qtype][1]))
    n = int(np.prod(shape, dtype=np.int64))
    if out.numel() != n:
        raise ModelLoadError(f"tensor {name!r}: {raw.size} bytes of {qtype.name} do not hold shape {shape}")
    return out.reshape(shape)


def dequantize_tensor(g: GGUFFile, name: str) -> torch.Tensor:
    """Tensor `name` of an open GGUF file as float32, in torch order."""
    info = g.tensors[name]
    return dequantize(g.raw(info), info.qtype, info.shape, name)
