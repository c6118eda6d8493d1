"""KV-cache quantization in torch: the reference the C write (kernels/kv_quant.h) matches bit for bit,
and the write and read path wherever the C kernels do not run (the SDPA backend, a GPU).

Formats (ridgeline/kv_spec.py KV_FORMATS), per (token, KV head) vector x of head_dim D, in fp32:
  int8      s = fp16(amax * (1/127)); q = clamp(round(x / s), -127, 127)               data int8 [D]
  int4      x <- H x (normalized Hadamard, blocks of the largest power of two dividing D); per group of 32:
            m = the element of largest magnitude, d = fp16(m * f), q = clamp(round(x / d), -8, 7) + 8, for
            each f of INT4_FACTORS (-1/8: m to -8; the others clip m for a finer step), keeping the d
            with the least squared error (the first on a tie); byte j = q[j] | q[j + 16] << 4  data uint8 [D/2]
  fp8_e4m3  s = fp16(amax * (1/448)); e4m3(clamp(x / s, +-448)), round to nearest even   data uint8 [D]
  fp8_e5m2  s = fp16(amax * (1/256)); e5m2(x / s)                                        data uint8 [D]
"x / s" is x * (1 / s) (1 / s exact, 0 where s is 0): one rounding, the same in C with -ffast-math.
Dequantized: q * s (int4: (q - 8) * d, still rotated: attention rotates q the same way, and the output
back, since H is its own inverse).
"""
from __future__ import annotations

import math

import torch

from ridgeline.kv_spec import KVFormat

FLOAT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 1 / 448, 448.0), "fp8_e5m2": (torch.float8_e5m2, 1 / 256, 57344.0)}
_F32 = torch.float32
# int4 scales tried per group (d = factor * m): m to -8, then clipping m to -8 * 15/16, 14/16, 13/16
INT4_FACTORS = (-0.125, -0.1171875, -0.109375, -0.1015625)


def storage_dtype(fmt: KVFormat) -> torch.dtype:
    if fmt.name in FLOAT_DTYPES:
        return FLOAT_DTYPES[fmt.name]
    return torch.int8 if fmt.name == "int8" else torch.uint8


def hadamard_block(head_dim: int) -> int:
    return head_dim & -head_dim


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Normalized Walsh-Hadamard transform along the last dim, in blocks of hadamard_block(D) (fp32 in and out;
    butterflies in the order the C kernels use, so both round alike)."""
    D = x.shape[-1]
    n = hadamard_block(D)
    lead = x.shape[:-1]
    y = x.reshape(-1, D // n, n).to(_F32)
    h = 1
    while h < n:
        y = y.view(-1, D // n, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).view(-1, D // n, n)
        h *= 2
    return (y * torch.tensor(1 / math.sqrt(n), dtype=_F32)).view(*lead, D)


def _squared_error(diff: torch.Tensor) -> torch.Tensor:
    """[..., 32] fp32 -> [..., 1] fp64: exact squares summed in index order, as kv_i4_err does."""
    acc = torch.zeros(*diff.shape[:-1], 1, dtype=torch.float64)
    for j in range(diff.shape[-1]):
        acc += diff[..., j:j + 1].double() ** 2
    return acc


def _scale(amax: torch.Tensor, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp16 scale, its fp32 reciprocal or 0)."""
    s = (amax * torch.tensor(factor, dtype=_F32)).to(torch.float16)
    sf = s.to(_F32)
    return s, torch.where(sf != 0, 1.0 / sf, torch.zeros((), dtype=_F32))


def quantize(fmt: KVFormat, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [N, D] -> (data [N, fmt.data_units(D)] in storage_dtype(fmt), scales [N, per vector] fp16 or None)."""
    name = fmt.name
    if name in FLOAT_DTYPES:
        return x.to(FLOAT_DTYPES[name]), None
    x = x.to(_F32)
    if fmt.rotate:
        x = hadamard(x)
    if name == "int8":
        s, inv = _scale(x.abs().amax(-1, keepdim=True), 1 / 127)
        return torch.round(x * inv).clamp_(-127, 127).to(torch.int8), s
    if name == "int4":
        N, D = x.shape
        g = x.reshape(N, D // 32, 32)
        m = g.gather(-1, g.abs().argmax(-1, keepdim=True))
        least = d = q = None
        for factor in INT4_FACTORS:
            dc, inv = _scale(m, factor)
            qc = torch.round(g * inv).clamp_(-8, 7)
            err = _squared_error(g - qc * dc.to(_F32))
            take = torch.ones_like(err, dtype=torch.bool) if least is None else err < least
            least, d, q = (err, dc, qc) if least is None else (torch.where(take, err, least),
                                                               torch.where(take, dc, d), torch.where(take, qc, q))
        q = (q + 8).to(torch.uint8)
        return (q[..., :16] | (q[..., 16:] << 4)).reshape(N, D // 2), d.reshape(N, D // 32)
    dtype, factor, top = _FP8[name]
    s, inv = _scale(x.abs().amax(-1, keepdim=True), factor)
    return (x * inv).clamp_(-top, top).to(dtype).view(torch.uint8), s


def dequantize(fmt: KVFormat, data: torch.Tensor, scale: torch.Tensor | None, dtype=_F32) -> torch.Tensor:
    """data [..., units] (+ scales [..., per vector]) -> [..., D] in dtype (rotated formats stay rotated)."""
    name = fmt.name
    if name in FLOAT_DTYPES:
        return data.to(dtype)
    sf = scale.to(_F32)
    if name == "int8":
        return (data.to(_F32) * sf).to(dtype)
    if name == "int4":
        lead, G = data.shape[:-1], scale.shape[-1]
        b = data.reshape(*lead, G, 16)
        q = torch.cat((b & 15, b >> 4), dim=-1).to(_F32) - 8
        return (q * sf.unsqueeze(-1)).reshape(*lead, G * 32).to(dtype)
    return (data.view(_FP8[name][0]).to(_F32) * sf).to(dtype)
