"""Round-to-nearest weight quantizers and the exact dequantization each format defines.

int8, per output channel, symmetric:  w[n, k] = s[n] * q[n, k],  q in [-127, 127], s = max|w[n]| / 127 (fp32)
int8, groups of 32 consecutive k:     w = d * q, d = max|w| / 127 per group (fp16; GGUF Q8_0's grid)
int4, groups of G consecutive k of one output channel, q in [0, 15], fp16 scale d (and minimum m):
    asymmetric  w = d * q + m,   m = min, d = (max - min) / 15        (GGUF Q4_1's grid)
    symmetric   w = d * (q - 8), d = -v / 8, v the group's value of largest magnitude (GGUF Q4_0's)
q is rounded against the stored (fp16-rounded) d and m, so the grid a weight is rounded to is the one
it is dequantized from. Weights already on such a grid (a Q4_1 file's, dequantized) come back exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.formats.options import INT4_GROUP_SIZES

_FP16_MAX = 65504.0


@dataclass
class Int8Tensor:
    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] fp32

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * 4

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]


@dataclass
class Int8GroupTensor:
    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N, K / group] fp16
    group: int = 32

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * 2

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        return (self.q.float().view(N, K // self.group, self.group) * self.scale.float()[..., None]).view(N, K)


@dataclass
class Int4Tensor:
    q: torch.Tensor  # [N, K] uint8 in [0, 15]
    scale: torch.Tensor  # [N, K / group] fp16
    min: torch.Tensor | None  # [N, K / group] fp16 (asymmetric), None (symmetric)
    group: int

    @property
    def symmetric(self) -> bool:
        return self.min is None

    @property
    def nbytes(self) -> int:
        """As packed two per byte, with fp16 scales (and minimums)."""
        return self.q.numel() // 2 + self.scale.numel() * 2 * (1 if self.min is None else 2)

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        q = self.q.float().view(N, K // self.group, self.group)
        d = self.scale.float()[..., None]
        w = d * (q - 8) if self.min is None else d * q + self.min.float()[..., None]
        return w.view(N, K)


@dataclass
class Int5Tensor:
    """5-bit weights in groups of 32 (GGUF Q5_0's and Q5_1's grids, the kept form of Q5_K)."""
    q: torch.Tensor  # [N, K] uint8 in [0, 31]
    scale: torch.Tensor  # [N, K / 32] fp16
    min: torch.Tensor | None  # [N, K / 32] fp16 (asymmetric: w = d q + m), None (symmetric: w = d (q - 16))
    group: int = 32

    @property
    def symmetric(self) -> bool:
        return self.min is None

    @property
    def nbytes(self) -> int:
        """As packed: 5 bits a weight, with fp16 scales (and minimums)."""
        return self.q.numel() * 5 // 8 + self.scale.numel() * 2 * (1 if self.min is None else 2)

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        q = self.q.float().view(N, K // self.group, self.group)
        d = self.scale.float()[..., None]
        w = d * (q - 16) if self.min is None else d * q + self.min.float()[..., None]
        return w.view(N, K)


@dataclass
class Int6Tensor:
    """GGUF Q6_K's grid, as the file stores it: w = d * s * (q - 32), an int8 s per 16 k and an fp16 d per 256."""
    q: torch.Tensor  # [N, K] uint8 in [0, 63]
    sub: torch.Tensor  # [N, K / 16] int8 s
    scale: torch.Tensor  # [N, K / 256] fp16 d
    min = None  # symmetric
    group: int = 16

    @property
    def nbytes(self) -> int:
        """As packed: 6 bits a weight, a byte per 16, two bytes per 256 (6.5625 bits a weight, the file's)."""
        return self.q.numel() * 6 // 8 + self.sub.numel() + self.scale.numel() * 2

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        q = self.q.float().view(N, K // 256, 16, 16) - 32
        ds = self.scale.float().view(N, K // 256, 1) * self.sub.float().view(N, K // 256, 16)
        return (ds[..., None] * q).view(N, K)


@dataclass
class KGridTensor:
    """GGUF Q4_K's (bits 4) and Q5_K's (bits 5) grids, as the file stores them: w = scale * sub * q - dmin * mins per
    32 k, q in [0, 2^bits), sub and mins 6-bit (uint8), scale and dmin fp16 per 256 k."""
    bits: int
    q: torch.Tensor  # [N, K] uint8
    sub: torch.Tensor  # [N, K / 32] uint8
    mins: torch.Tensor  # [N, K / 32] uint8
    scale: torch.Tensor  # [N, K / 256] fp16 D
    dmin: torch.Tensor  # [N, K / 256] fp16
    min = None
    group: int = 32

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.bits // 8 + self.sub.numel() * 2 + self.scale.numel() * 4

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        d = self.scale.float().repeat_interleave(8, 1) * self.sub.float()
        m = self.dmin.float().repeat_interleave(8, 1) * self.mins.float()
        return (self.q.float().view(N, K // 32, 32) * d[..., None] - m[..., None]).view(N, K)


@dataclass
class KQTensor:
    """GGUF Q3_K's and Q2_K's grids, as the file stores them, per 16 k and per 256 k:
    bits 3: w = scale * sub * (q - 4), q in [0, 7], sub int8 (the 6-bit scale minus 32);
    bits 2: w = scale * (sub & 15) * q - dmin * (sub >> 4), q in [0, 3], sub uint8 (4-bit scale and minimum)."""
    bits: int
    q: torch.Tensor  # [N, K] uint8
    sub: torch.Tensor  # [N, K / 16] int8 (bits 3) or uint8 (bits 2)
    scale: torch.Tensor  # [N, K / 256] fp16 D
    dmin: torch.Tensor | None = None  # [N, K / 256] fp16 (bits 2)
    min = None
    group: int = 16

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.bits // 8 + self.sub.numel() + self.scale.numel() * 2 * (2 if self.bits == 2 else 1)

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        q = self.q.float().view(N, K // 16, 16)
        D = self.scale.float().repeat_interleave(16, 1)
        if self.bits == 3:
            return ((D * self.sub.float())[..., None] * (q - 4)).view(N, K)
        c = self.sub.int()
        dl, ml = D * (c & 15).float(), self.dmin.float().repeat_interleave(16, 1) * (c >> 4).float()
        return (dl[..., None] * q - ml[..., None]).view(N, K)


IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # GGUF IQ4_NL's table


@dataclass
class IQ4Tensor:
    """GGUF IQ4_NL's and IQ4_XS's grids, as the file stores them: w = d * IQ4_VALUES[q] per group of 32, d an fp16
    scale per 32 (IQ4_NL), or an int8 s per 32 by an fp16 scale per 256 (IQ4_XS: d = scale * s)."""
    q: torch.Tensor  # [N, K] uint8 codes in [0, 15]
    scale: torch.Tensor  # [N, K / 32] fp16 (IQ4_NL) or [N, K / 256] fp16 (IQ4_XS)
    sub: torch.Tensor | None = None  # IQ4_XS: [N, K / 32] int8 s
    min = None  # no minimum
    group: int = 32

    @property
    def block(self) -> int:
        return 32 if self.sub is None else 256

    @property
    def nbytes(self) -> int:
        return self.q.numel() // 2 + self.scale.numel() * 2 + (0 if self.sub is None else self.sub.numel())

    def dequantize(self) -> torch.Tensor:
        N, K = self.q.shape
        v = torch.tensor(IQ4_VALUES, dtype=torch.float32)[self.q.long()].view(N, K // 32, 32)
        d = self.scale.float()
        if self.sub is not None:
            d = d.repeat_interleave(8, 1) * self.sub.float()
        return (d[..., None] * v).view(N, K)


def quantize_int8(w: torch.Tensor) -> Int8Tensor:
    """w [N, K] float -> per-channel int8 (an all-zero row gets scale 0)."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Tensor(q, scale)


def quantize_int8_g32(w: torch.Tensor) -> Int8GroupTensor:
    """w [N, K] float, K a multiple of 32 -> int8 with an fp16 scale per 32 (q rounded against the stored scale)."""
    N, K = w.shape
    if K % 32:
        raise InvalidRequestError(f"int8-g32 needs input columns in multiples of 32, got {K}", "quantization")
    wg = w.detach().float().view(N, K // 32, 32)
    d = _fp16(wg.abs().amax(dim=-1) / 127)
    q = torch.round(wg / _nonzero(d.float())[..., None]).clamp_(-127, 127).to(torch.int8)
    return Int8GroupTensor(q.view(N, K), d)


def quantize_int4(w: torch.Tensor, group: int, symmetric: bool) -> Int4Tensor:
    """w [N, K] float, K a multiple of group -> group-wise int4."""
    if group not in INT4_GROUP_SIZES:
        raise InvalidRequestError(f"int4 group size {group} is not one of {INT4_GROUP_SIZES}", "quant_group_size")
    N, K = w.shape
    if K % group:
        raise InvalidRequestError(f"int4 group size {group} does not divide the {K} input columns", "quant_group_size")
    wg = w.detach().float().view(N, K // group, group)
    if symmetric:
        idx = wg.abs().argmax(dim=-1, keepdim=True)
        d = _fp16(wg.gather(-1, idx).squeeze(-1) / -8)
        q = torch.round(wg / _nonzero(d.float())[..., None]) + 8
        mn = None
    else:
        lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
        mn, d = _fp16(lo), _fp16((hi - lo) / 15)
        q = torch.round((wg - mn.float()[..., None]) / _nonzero(d.float())[..., None])
    q = torch.where(d[..., None] == 0, torch.zeros_like(q) + (8 if symmetric else 0), q)
    return Int4Tensor(q.clamp_(0, 15).to(torch.uint8).view(N, K), d, mn, group)


A8_BLOCK = 32  # W8A8's activation block (kernels/gemm_a8.c A8_B)


def fake_quantize_rows(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [M, K] fp32 rounded as the a8 kernels quantize activations (kernels/gemm_a8.c): each block of
    `block` consecutive k of a row (the last one shorter when block does not divide K) to a * r,
    a = max|x| / 127, r = round(x * 127 / max) in [-127, 127]. Returns the dequantized values a * r."""
    M, K = x.shape
    pad = -K % block
    xb = torch.nn.functional.pad(x.float(), (0, pad)).reshape(M, (K + pad) // block, block)
    mx = xb.abs().amax(-1, keepdim=True)
    # 127 / mx as one correctly rounded division, as the kernel computes it (torch's scalar / tensor
    # is 127 * (1 / mx), two roundings, which moves values next to a rounding tie across it)
    inv = torch.where(mx > 0, torch.full_like(mx, 127).div(mx), torch.zeros_like(mx))
    return (torch.round(xb * inv) * (mx / 127)).reshape(M, K + pad)[:, :K].to(x.dtype)


def _fp16(x: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(x).all()) or float(x.abs().max()) > _FP16_MAX:
        raise InvalidRequestError("weights too large (or not finite) for fp16 int4 group scales")
    return x.to(torch.float16)


def _nonzero(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.ones_like(d), d)
