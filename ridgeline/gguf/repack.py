"""GGUF blocks -> our packed formats' tensors, without decoding the model to floats, from each type's
unpacked layout (layouts.py: w = scale * (q - zero) + min per sub-block of G):

    int4-sym  G = 32, zero 8, no min: q and the fp16 scale as they are (Q4_0)
    int4      G = 32, q in [0, 15]: q kept, d = scale and m = min - zero * scale in fp16; exact where
              the file stores them so (Q4_1; Q4_0, whose -8 d is a power-of-two multiple, while it stays
              in fp16's range); Q4_K's fp32 products d s and -dmin n, beside another type, are rounded to fp16
    int4-k    Q4_K alone: q, its 6-bit scales and mins per 32, its fp16 d and dmin per 256 as they are
    int5-k    Q5_K alone: the same, with 5-bit q
    int5-sym  G = 32, zero 16, no min: q (or Q4_0's q + 8) and the fp16 scale as they are (Q5_0)
    int5      G = 32, q in [0, 31]: q kept, d and m as int4's (Q5_1 exact; Q5_0 as int4 takes Q4_0; Q5_K's fp32
              products rounded to fp16; Q4_K and Q4_1 too, beside a 5-bit shard)
    int6      Q6_K alone: q, its int8 scale per 16 and fp16 scale per 256 as they are (6.5625 bits a weight)
    iq4-nl    IQ4_NL alone: its codes and fp16 scale per 32 as they are
    iq4-xs    IQ4_XS alone: its codes, its 6-bit scales minus 32 as int8 per 32, its fp16 scale per 256
    int3      Q3_K alone: q, its 6-bit scales minus 32 as int8 per 16, its fp16 scale per 256
    int2      Q2_K alone: q, its scale and minimum nibbles per 16, its fp16 scale and minimum per 256
    int8-g32  G = 32, |q - zero| <= 127, fp16 scale, no min: q - zero and the scale as they are (Q8_0; IQ4_NL's
              table values; MXFP4 as twice its values over 2^(e - 128), where that is an fp16 number); any other
              type round-to-nearest of its values (Q6_K, Q3_K, Q2_K, IQ4_XS beside another type: their scales
              per 16, or their fp32 scale products, do not fit)
    mxfp4     MXFP4 alone: its codes and E8M0 exponents as they are (a layer of MXFP4 shards only)

Each conversion returns the tensor and whether it holds exactly the file's values.
"""
from __future__ import annotations

import dataclasses

import torch

from gguf import GGMLQuantizationType as T

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.blocks import GGUFBlocks
from ridgeline.gguf.layouts import (LAYOUTS, iq4_nl_grid, iq4_xs_grid, mxfp4_codes, q2_k_grid, q3_k_grid, q4_k_grid,
                                    q5_k_grid, q6_k_grid)
from ridgeline.formats import fpq, rtn

TARGETS = ("int2", "int3", "iq4-xs", "int4-sym", "iq4-nl", "int4-k", "int4", "int5-sym", "int5-k", "int5", "int6",
           "int8-g32")  # in bytes per weight
# target -> the kept formats (layouts.py) whose values it takes (int8-g32: int4's and int5's minimums by re-rounding);
# a target not named takes its own only
_WIDER = {"int4": {"int4-sym", "int4", "int4-k"}, "int5-sym": {"int4-sym", "int5-sym"},
          "int5": {"int4-sym", "int4", "int4-k", "int5-sym", "int5-k", "int5"}, "int8-g32": set(TARGETS)}
HOLDS = {target: _WIDER.get(target, {target}) for target in TARGETS}
BITS = {"int4-sym": 4, "int4": 4, "int5-sym": 5, "int5": 5}
EXACT = {(target, qtype) for qtype, layout in LAYOUTS.items() for target in layout.exact}


def target_for(types: set) -> str | None:
    """Our format for a layer whose shards have these GGML types: the narrowest that holds what their layouts
    keep (TARGETS), or None (dense: a dense or unsupported shard)."""
    if not types or any(t not in LAYOUTS for t in types):
        return None
    if T.MXFP4 in types:  # its own blocks alone; beside another type the grid that holds them both
        return "mxfp4" if types == {T.MXFP4} else "int8-g32"
    kept = {LAYOUTS[t].kept for t in types}
    return next(target for target in TARGETS if kept <= HOLDS[target])


def to_grid(t: GGUFBlocks, target: str) -> tuple[rtn.Int4Tensor | rtn.Int5Tensor, bool]:
    """One shard in int4-sym, int4, int5-sym or int5 (its kept format held by target: HOLDS)."""
    N, K = t.shape
    layout = LAYOUTS.get(t.qtype)
    if layout is None or layout.kept not in HOLDS[target]:
        raise ValueError(f"{t.name}: GGML type {t.qtype.name} has no {target} form")
    p = layout.unpack(t.blocks())
    exact = (target, t.qtype) in EXACT
    symmetric, zero = target.endswith("-sym"), 1 << (BITS[target] - 1)
    d, m, q = p.scale.to(torch.float16), None, p.q
    if symmetric:  # the source is symmetric too (HOLDS): its q moved to this zero
        q = q if p.zero == zero else (q.to(torch.int16) + (zero - p.zero)).to(torch.uint8)
    else:
        m = p.min.to(torch.float16) if p.min is not None else None
        if p.zero:  # m - zero * d: only past fp16's range is it not the file's value
            m = p.scale.float() * -p.zero
            m = (m if p.min is None else m + p.min.float()).to(torch.float16)
            exact = exact and bool(torch.isfinite(m).all())
        elif not exact and not bool(torch.isfinite(d).all() and torch.isfinite(m).all()):
            raise ModelLoadError(f"{t.name}: {t.qtype.name} scales past fp16's range cannot be repacked to {target}")
    cls = rtn.Int4Tensor if BITS[target] == 4 else rtn.Int5Tensor
    out = cls(q.reshape(N, K).contiguous(), d.reshape(N, K // 32), None if m is None else m.reshape(N, K // 32), 32)
    return out, exact



def to_int8_g32(t: GGUFBlocks) -> tuple[rtn.Int8GroupTensor, bool]:
    N, K = t.shape
    if ("int8-g32", t.qtype) in EXACT:
        p = LAYOUTS[t.qtype].unpack(t.blocks())
        scale = p.scale.to(torch.float16)
        if scale.dtype == p.scale.dtype or bool((scale.float() == p.scale.float()).all()):  # the file's scales
            q = p.q if not p.zero else (p.q.to(torch.int16) - p.zero).to(torch.int8)
            return rtn.Int8GroupTensor(q.reshape(N, K), scale.reshape(N, K // 32)), True
    return rtn.quantize_int8_g32(t.dequantize()), False


def to_mxfp4(t: GGUFBlocks) -> tuple[fpq.BlockTensor, bool]:
    """MXFP4 blocks as the mxfp4 format holds them: the same codes and exponents, reordered to element order."""
    N, K = t.shape
    if t.qtype != T.MXFP4:
        raise ValueError(f"{t.name}: GGML type {t.qtype.name} has no mxfp4 form")
    codes, e = mxfp4_codes(t.blocks())
    if bool((e == 255).any()):
        raise ModelLoadError(f"{t.name}: an MXFP4 block exponent of 255 (2^127 in GGML, infinite in the kernel)")
    return fpq.BlockTensor("mxfp4", codes.reshape(N, K).contiguous(), e.reshape(N, K // 32)), True


# the grids kept as the file stores them: target -> (its GGML type, the grid's fields per block (layouts.py), the
# tensor built from those fields as rows of the matrix)
AS_STORED = {
    "int6": (T.Q6_K, q6_k_grid, rtn.Int6Tensor),
    "iq4-nl": (T.IQ4_NL, iq4_nl_grid, rtn.IQ4Tensor),
    "iq4-xs": (T.IQ4_XS, iq4_xs_grid, lambda q, s, d: rtn.IQ4Tensor(q, d, s)),
    "int3": (T.Q3_K, q3_k_grid, lambda *f: rtn.KQTensor(3, *f)),
    "int2": (T.Q2_K, q2_k_grid, lambda *f: rtn.KQTensor(2, *f)),
    "int4-k": (T.Q4_K, q4_k_grid, lambda *f: rtn.KGridTensor(4, *f)),
    "int5-k": (T.Q5_K, q5_k_grid, lambda *f: rtn.KGridTensor(5, *f)),
}


def as_stored(t: GGUFBlocks, target: str):
    """One shard in its own grid (AS_STORED): the file's values and scales, each field [N, its count per row]."""
    qtype, grid, build = AS_STORED[target]
    if t.qtype != qtype:
        raise ValueError(f"{t.name}: GGML type {t.qtype.name} has no {target} form")
    return build(*(f.reshape(t.shape[0], -1).contiguous() for f in grid(t.blocks()))), True


def convert(t: GGUFBlocks, target: str):
    """(tensor of `target`, exact?) for one shard."""
    if target == "mxfp4":
        return to_mxfp4(t)
    if target in AS_STORED:
        return as_stored(t, target)
    return to_int8_g32(t) if target == "int8-g32" else to_grid(t, target)


def concat(parts: list):
    """The shards of a fused projection (one tensor type), stacked along the output channels: each tensor field
    concatenated, the rest (bits, group, kind) the first's."""
    first = parts[0]
    fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(first)}
    return type(first)(**{k: torch.cat([getattr(p, k) for p in parts]) if isinstance(v, torch.Tensor) else v
                          for k, v in fields.items()})
