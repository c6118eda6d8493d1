"""GGUF blocks -> our packed formats' tensors, without decoding the model to floats, from each type's
unpacked layout (layouts.py: w = scale * (q - zero) + min per sub-block of G):

    int4-sym  G = 32, zero 8, no min: q and the fp16 scale as they are (Q4_0)
    int4      G = 32, q in [0, 15]: q kept, d = scale and m = min - zero * scale in fp16; exact where
              the file stores them so (Q4_1; Q4_0, whose -8 d is a power-of-two multiple, while it stays
              in fp16's range); Q4_K's fp32 products d s and -dmin n are rounded to fp16
    int8-g32  G = 32, |q - zero| <= 127, fp16 scale, no min: q - zero and the scale as they are (Q8_0;
              MXFP4 as twice its values over 2^(e - 128), where that is an fp16 number); any other type
              round-to-nearest of its values (Q6_K's two 16-scales per 32 do not fit; the types with no
              layout, Q5_1, Q5_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, from gguf's dequantizers)
    mxfp4     MXFP4 alone: its codes and E8M0 exponents as they are (a layer of MXFP4 shards only)

Each conversion returns the tensor and whether it holds exactly the file's values.
"""
from __future__ import annotations

import torch

from gguf import GGMLQuantizationType as T

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.blocks import GGUFBlocks
from ridgeline.gguf.layouts import LAYOUTS, REPACKED, mxfp4_codes
from ridgeline.formats import fpq, rtn

TARGETS = ("int4-sym", "int4", "int8-g32")  # each holds the grids of those before it
EXACT = {(target, qtype) for qtype, layout in LAYOUTS.items() for target in layout.exact}


def _kept(t) -> str:
    return LAYOUTS[t].kept if t in LAYOUTS else REPACKED[t]


def target_for(types: set) -> str | None:
    """Our format for a layer whose shards have these GGML types: the widest their layouts keep (int4-sym,
    int4, int8-g32; the types with no layout int8-g32), or None (dense: a dense or unsupported shard)."""
    if not types or any(t not in LAYOUTS and t not in REPACKED for t in types):
        return None
    if T.MXFP4 in types:  # its own blocks alone; beside another type the grid that holds them both
        return "mxfp4" if types == {T.MXFP4} else "int8-g32"
    return max((_kept(t) for t in types), key=TARGETS.index)


def to_int4(t: GGUFBlocks, symmetric: bool) -> tuple[rtn.Int4Tensor, bool]:
    N, K = t.shape
    target = "int4-sym" if symmetric else "int4"
    layout = LAYOUTS.get(t.qtype)
    if layout is None or layout.kept not in TARGETS or TARGETS.index(layout.kept) > TARGETS.index(target):
        raise ValueError(f"{t.name}: GGML type {t.qtype.name} has no {'symmetric ' if symmetric else ''}int4 form")
    p = layout.unpack(t.blocks())
    exact = (target, t.qtype) in EXACT
    d, m = p.scale.to(torch.float16), None
    if not symmetric:
        m = p.min.to(torch.float16) if p.min is not None else None
        if p.zero:  # m - zero * d: only past fp16's range is it not the file's value
            m = p.scale.float() * -p.zero
            m = (m if p.min is None else m + p.min.float()).to(torch.float16)
            exact = exact and bool(torch.isfinite(m).all())
        elif not exact and not bool(torch.isfinite(d).all() and torch.isfinite(m).all()):
            raise ModelLoadError(f"{t.name}: {t.qtype.name} scales past fp16's range cannot be repacked to int4")
    out = rtn.Int4Tensor(p.q.reshape(N, K).contiguous(), d.reshape(N, K // 32),
                         None if m is None else m.reshape(N, K // 32), 32)
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


def convert(t: GGUFBlocks, target: str):
    """(tensor of `target`, exact?) for one shard."""
    if target == "mxfp4":
        return to_mxfp4(t)
    return to_int8_g32(t) if target == "int8-g32" else to_int4(t, target == "int4-sym")


def concat(parts: list) -> rtn.Int4Tensor | rtn.Int8GroupTensor:
    """The shards of a fused projection, stacked along the output channels."""
    first = parts[0]
    if isinstance(first, fpq.BlockTensor):
        return fpq.BlockTensor(first.kind, torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))
    if isinstance(first, rtn.Int8GroupTensor):
        return rtn.Int8GroupTensor(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))
    mins = None if first.min is None else torch.cat([p.min for p in parts])
    return rtn.Int4Tensor(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]), mins, 32)
