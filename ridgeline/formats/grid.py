"""The int4 grid AWQ, GPTQ and `ridgeline quantize` write: w = s * (q - z), q in [0, 15], one fp16 scale s
and one integer zero point z per group of G consecutive input columns of an output row (the hub's
GPTQ and AWQ layouts store exactly these). Both map onto the engine's int4 formats (rtn.py):

    symmetric    z = 8 and s = d: Q4_0's grid, d = -v / 8 with v the group's value of largest magnitude
                 (the same scale round-to-nearest int4-sym picks)
    asymmetric   d = s, m = -s * z: Q4_1's grid, exactly, because s keeps at most 7 significant bits
                 (so s * z, z < 16, fits fp16's 11) and z is in [1, 15] (GPTQ's v1 layout stores z - 1)

A group with every weight zero gets s = 0 and dequantizes to zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.formats import rtn

SCALE_BITS = 7  # significant bits kept in an asymmetric scale (s * z exact in fp16 for z < 16)


@dataclass
class GroupGrid:
    """One grid per group: scale [N, K/G] fp16, zero [N, K/G] int32 (8 everywhere when symmetric)."""
    scale: torch.Tensor
    zero: torch.Tensor
    symmetric: bool

    def quantize(self, w: torch.Tensor, group: int) -> torch.Tensor:
        """w [N, K] float -> q [N, K] uint8 rounded to the nearest grid point of its group."""
        s, z = _expand(self.scale.float(), group), _expand(self.zero.float(), group)
        return _codes(w.float(), s, z).to(torch.uint8)

    def dequantize(self, q: torch.Tensor, group: int) -> torch.Tensor:
        s, z = _expand(self.scale.float(), group), _expand(self.zero.float(), group)
        return s * (q.float() - z)

    def round_blocks(self, w: torch.Tensor) -> torch.Tensor:
        """w [N, K/G, G] float -> the values it rounds to: dequantize(quantize(w)), in the grouped shape."""
        s, z = self.scale.float()[..., None], self.zero.float()[..., None]
        return s * (_codes(w, s, z) - z)


def _codes(w: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """w's nearest codes in [0, 15] as floats, s and z broadcast against w; a zero scale gives z."""
    q = torch.round(w / torch.where(s == 0, torch.ones_like(s), s)) + z
    return torch.where(s == 0, z, q).clamp_(0, 15)


def fit(w: torch.Tensor, symmetric: bool, ratio: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., G] (the groups of one column block) -> (scale [...] fp16, zero [...] int32); ratio < 1
    shrinks the range the grid covers (clipping the largest weights; clip.py chooses it)."""
    w = w.detach().float()
    if symmetric:
        idx = w.abs().argmax(dim=-1, keepdim=True)
        s = rtn._fp16(w.gather(-1, idx).squeeze(-1) * (ratio / -8))
        return s, torch.full(s.shape, 8, dtype=torch.int32)
    lo, hi = w.amin(dim=-1).clamp(max=0) * ratio, w.amax(dim=-1).clamp(min=0) * ratio
    s = rtn._fp16(round_significand((hi - lo) / 15, SCALE_BITS)).float()
    z = torch.round(-lo / torch.where(s == 0, torch.ones_like(s), s)).clamp_(1, 15)
    return s.to(torch.float16), z.to(torch.int32)


def fit_groups(w: torch.Tensor, group: int, symmetric: bool) -> GroupGrid:
    """The grid of every group of w [N, K] (K a multiple of group)."""
    N, K = w.shape
    check_group(K, group)
    s, z = fit(w.reshape(N, K // group, group), symmetric)
    return GroupGrid(s, z, symmetric)


def round_significand(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded to `bits` significant binary digits (round to nearest)."""
    m, e = torch.frexp(x.float())
    return torch.ldexp(torch.round(torch.ldexp(m, torch.full_like(e, bits))), e - bits)


def to_int4(q: torch.Tensor, grid: GroupGrid, group: int) -> rtn.Int4Tensor:
    """The engine's int4 tensor: d = s, and m = -s * z rounded to fp16 when asymmetric. Exact for
    every grid fit() makes; for another grid (a hub checkpoint's) a group whose s * z needs more than
    fp16's 11 significant bits moves by at most half an fp16 ulp of s * z: |error| <= 2^-11 * 15 |s|,
    under 1/128 of the group's step."""
    if grid.symmetric:
        if bool((grid.zero != 8).any()):
            raise ValueError("a symmetric int4 grid needs every zero point at 8")
        return rtn.Int4Tensor(q, grid.scale, None, group)
    return rtn.Int4Tensor(q, grid.scale, minimum(grid.scale, grid.zero), group)


def minimum(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """m = -s * z rounded to fp16 (computed exactly in fp32: 11 significant bits times 4)."""
    return (-scale.float() * zero.float()).to(torch.float16)


def inexact_minimums(scale: torch.Tensor, zero: torch.Tensor) -> int:
    """How many groups' -s * z fp16 cannot hold exactly."""
    return int((minimum(scale, zero).float() != -scale.float() * zero.float()).sum())


def check_group(K: int, group: int) -> None:
    if group not in rtn.INT4_GROUP_SIZES:
        raise InvalidRequestError(f"group size {group} is not one of {', '.join(map(str, rtn.INT4_GROUP_SIZES))}",
                                  "group_size")
    if K % group:
        fits = [g for g in rtn.INT4_GROUP_SIZES if K % g == 0]
        raise InvalidRequestError(f"group size {group} does not divide {K} input columns; group sizes that do: "
                                  f"{', '.join(map(str, fits)) or 'none'}", "group_size")


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.repeat_interleave(group, dim=-1)
