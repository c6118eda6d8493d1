"""GGUF blocks -> our packed formats' tensors, without decoding the model to floats.

    Q4_1  d, m fp16; 32 nibbles       w = d * q + m        -> int4 g32 asymmetric: q, d, m as they are
    Q4_0  d fp16; 32 nibbles          w = d * (q - 8)      -> int4 g32 symmetric as it is; or asymmetric
                                                              with m = -8 d (exact: a power-of-two multiple)
    Q8_0  d fp16; 32 int8             w = d * q            -> int8-g32: q, d as they are
    Q4_K  256 = 8 x 32; d, dmin fp16, 6-bit scale s and min n per 32; nibbles q
                                      w = (d s) q - (dmin n) -> int4 g32 asymmetric: q kept, the scale
                                      d s and minimum -dmin n (fp32 products) rounded to fp16
    Q6_K  256 = 16 x 16; int8 scale per 16, 6-bit q, fp16 d   -> int8-g32 by round-to-nearest of its values
                                      (two 16-scales share one 32-group scale: not representable as is)

Each conversion returns the tensor and whether it holds exactly the file's values. The nibble order
inside a block is GGML's: in Q4_0/Q4_1 byte j holds elements j (low) and j + 16 (high); in Q4_K each
32-byte chunk c holds sub-block 2c (low nibbles) and 2c + 1 (high).
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from ridgeline.errors import ModelLoadError
from ridgeline.quant import rtn
from ridgeline.weights.gguf_blocks import GGUFBlocks

INT4_SYM_TYPES = frozenset({T.Q4_0})
INT4_TYPES = frozenset({T.Q4_0, T.Q4_1, T.Q4_K})
INT8_TYPES = frozenset({T.Q8_0, T.Q6_K})
EXACT = {("int4-sym", T.Q4_0), ("int4", T.Q4_0), ("int4", T.Q4_1), ("int8-g32", T.Q8_0)}


def target_for(types: set) -> str | None:
    """Our format for a layer whose shards have these GGML types: int4-sym, int4, int8-g32, or None
    (dense: a dense or unsupported shard)."""
    if types <= INT4_SYM_TYPES:
        return "int4-sym"
    if types <= INT4_TYPES:
        return "int4"
    if types <= INT4_TYPES | INT8_TYPES:
        return "int8-g32"
    return None


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] bytes -> [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    a = qs.numpy()  # numpy's single-threaded bit ops beat torch's on these strided byte views
    return torch.from_numpy(np.concatenate([a & 0x0F, a >> 4], axis=-1))


def _q4_k_parts(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[n, 144] Q4_K blocks -> q [n, 8, 32] uint8, scale [n, 8] and minimum [n, 8] fp32 (w = scale q + min)."""
    d, dmin, sc, qs = _f16(b[:, :2]).float(), _f16(b[:, 2:4]).float(), b[:, 4:16].int(), b[:, 16:]
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    q = qs.reshape(-1, 4, 1, 32)
    q = torch.cat([q & 0x0F, q >> 4], dim=2).reshape(-1, 8, 32)
    return q, d * torch.cat([lo_s, hi_s], 1).float(), -(dmin * torch.cat([lo_m, hi_m], 1).float())


def to_int4(t: GGUFBlocks, symmetric: bool) -> tuple[rtn.Int4Tensor, bool]:
    N, K = t.shape
    b = t.blocks()
    if t.qtype == T.Q4_1:
        d, m, q = _f16(b[:, :2]), _f16(b[:, 2:4]), _nibbles(b[:, 4:])
    elif t.qtype == T.Q4_0:
        d, q = _f16(b[:, :2]), _nibbles(b[:, 2:])
        m = None if symmetric else (d.float() * -8).to(torch.float16)
    elif t.qtype == T.Q4_K and not symmetric:
        q, scale, mn = _q4_k_parts(b)
        d, m = scale.to(torch.float16), mn.to(torch.float16)
        if not bool(torch.isfinite(d).all() and torch.isfinite(m).all()):
            raise ModelLoadError(f"{t.name}: Q4_K scales past fp16's range cannot be repacked to int4")
    else:
        raise ValueError(f"{t.name}: GGML type {t.qtype.name} has no {'symmetric ' if symmetric else ''}int4 form")
    exact = (("int4-sym" if symmetric else "int4"), t.qtype) in EXACT
    if t.qtype == T.Q4_0 and m is not None:  # -8 d leaves fp16 only past its range
        exact = bool(torch.isfinite(m).all())
    out = rtn.Int4Tensor(q.reshape(N, K).contiguous(), d.reshape(N, K // 32),
                         None if m is None else m.reshape(N, K // 32), 32)
    return out, exact


def to_int8_g32(t: GGUFBlocks) -> tuple[rtn.Int8GroupTensor, bool]:
    N, K = t.shape
    if t.qtype == T.Q8_0:
        b = t.blocks()
        return rtn.Int8GroupTensor(b[:, 2:].contiguous().view(torch.int8).reshape(N, K),
                                   _f16(b[:, :2]).reshape(N, K // 32)), True
    return rtn.quantize_int8_g32(t.dequantize()), False


def convert(t: GGUFBlocks, target: str):
    """(tensor of `target`, exact?) for one shard."""
    return to_int8_g32(t) if target == "int8-g32" else to_int4(t, target == "int4-sym")


def concat(parts: list) -> rtn.Int4Tensor | rtn.Int8GroupTensor:
    """The shards of a fused projection, stacked along the output channels."""
    first = parts[0]
    if isinstance(first, rtn.Int8GroupTensor):
        return rtn.Int8GroupTensor(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))
    mins = None if first.min is None else torch.cat([p.min for p in parts])
    return rtn.Int4Tensor(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]), mins, 32)
