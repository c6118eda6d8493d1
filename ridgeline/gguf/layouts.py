"""GGML's quantized block layouts, each unpacked once into integers and scales: dequantization
(dequant.py) and the conversion to our packed formats (repack.py) both read them from here.

A type's blocks [n, type_size] unpack to sub-blocks of G elements, w = scale * (q - zero) + min:

    Q4_0  32: d fp16; 16 bytes of nibbles            q in [0, 15], zero 8, scale d
    Q4_1  32: d, m fp16; 16 bytes of nibbles         q in [0, 15], scale d, min m
    Q8_0  32: d fp16; 32 int8                        q in [-127, 127], scale d
    Q5_0  32: d fp16; 32 high bits (a little-endian uint32, bit j for element j); 16 bytes of nibbles
                                                     q in [0, 31], zero 16, scale d
    Q5_1  32: d, m fp16; 32 high bits as Q5_0's; 16 bytes of nibbles
                                                     q in [0, 31], scale d, min m
    Q4_K  256 = 8 x 32: d, dmin fp16, 12 bytes of 6-bit scales s and mins n, 128 bytes of nibbles
                                                     q in [0, 15], scale d * s, min -(dmin * n) (fp32)
    Q5_K  256 = 8 x 32: d, dmin fp16, 12 bytes of scales and mins as Q4_K's, 32 bytes of high bits (bit s of
          byte l for element l of sub-block s), 128 bytes of nibbles as Q4_K's
                                                     q in [0, 31], scale d * s, min -(dmin * n) (fp32)
    Q6_K  256 = 16 x 16: 128 bytes of low nibbles, 64 of high 2-bit pairs, int8 scales s, d fp16
                                                     q in [0, 63], zero 32, scale d * s (fp32)
    Q3_K  256 = 16 x 16: 32 bytes of third bits (bit i of byte l: element 32 i + l), 64 bytes of 2-bit values
          (each 128 k h: bytes 32 h.., shift 2 j for its elements 32 j..), 12 bytes of 6-bit scales s, d fp16
                                                     q in [0, 7], zero 4, scale d * (s - 32) (fp32)
    Q2_K  256 = 16 x 16: 16 bytes c (scale c & 15, minimum c >> 4), 64 bytes of 2-bit values as Q3_K's, d, dmin
                                                     q in [0, 3], scale d * (c & 15), min -(dmin * (c >> 4))
    IQ4_NL 32: d fp16; 16 bytes of codes as Q4_0's  q = IQ4_VALUES[code] (an int8), scale d
    IQ4_XS 256 = 8 x 32: d fp16, a uint16 of high scale bit pairs, 4 bytes of low scale nibbles, 128 bytes of
          codes (each 16 bytes a sub-block as IQ4_NL's)    q as IQ4_NL's, scale d * (s - 32) (fp32)
    MXFP4 32: E8M0 byte e; 16 bytes of E2M1 codes    q = twice the code's value (an int8 in [-12, 12]),
                                                     scale 2^(e - 128) (fp32)

Nibble order is GGML's: in Q4_0 / Q4_1 / MXFP4 byte j holds elements j (low) and j + 16 (high); in Q4_K each
32-byte chunk c holds sub-block 2c (low) and 2c + 1 (high). `kept` names the narrowest of our packed
formats a layer of that type keeps its blocks in (repack.py), `exact` those that hold its values as
they are. A new block type is one layout here: its unpacking, its kept format and where it is exact.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from ridgeline.formats import rtn


@dataclass(frozen=True)
class Parts:
    """One tensor's blocks, unpacked: w[n, s, g] = scale[n, s] * (q[n, s, g] - zero) + min[n, s]."""
    q: torch.Tensor  # [n, S, G] integers as stored (uint8; int8 for Q8_0)
    zero: int
    scale: torch.Tensor  # [n, S]: fp16 where the file stores one per sub-block, else the fp32 products
    min: torch.Tensor | None  # [n, S] as scale, or None

    def values(self) -> torch.Tensor:
        """[n, S * G] float32."""
        q = self.q.float()
        if self.zero:
            q = q - float(self.zero)
        w = self.scale.float().unsqueeze(-1) * q
        if self.min is not None:
            w = w + self.min.float().unsqueeze(-1)
        return w.reshape(len(w), -1)


@dataclass(frozen=True)
class Layout:
    unpack: Callable[[torch.Tensor], Parts]  # blocks [n, type_size] uint8 -> parts
    kept: str  # the narrowest packed format a layer of this type keeps its blocks in
    exact: frozenset[str]  # the packed formats that hold its values exactly


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] bytes -> [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    a = qs.numpy()  # numpy's single-threaded bit ops beat torch's on these strided byte views
    return torch.from_numpy(np.concatenate([a & 0x0F, a >> 4], axis=-1))


def _q4_0(b):
    return Parts(_nibbles(b[:, 2:]).unsqueeze(1), 8, _f16(b[:, :2]), None)


def _q4_1(b):
    return Parts(_nibbles(b[:, 4:]).unsqueeze(1), 0, _f16(b[:, :2]), _f16(b[:, 2:4]))


def _q8_0(b):
    return Parts(b[:, 2:].contiguous().view(torch.int8).unsqueeze(1), 0, _f16(b[:, :2]), None)


def _q5_0(b):
    high = (b[:, 2:6].contiguous().view(torch.int32) >> torch.arange(32, dtype=torch.int32)) & 1  # [n, 32]
    return Parts((_nibbles(b[:, 6:]) | (high.to(torch.uint8) << 4)).unsqueeze(1), 16, _f16(b[:, :2]), None)


MXFP4_DOUBLED = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.int8)


def mxfp4_codes(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 blocks [n, 17] -> (E2M1 codes [n, 32] uint8 in element order, E8M0 exponents [n] uint8)."""
    return _nibbles(b[:, 1:]), b[:, 0].contiguous()


def _mxfp4(b):
    codes, e = mxfp4_codes(b)
    return Parts(MXFP4_DOUBLED[codes.long()].unsqueeze(1), 0, torch.exp2(e.float() - 128).unsqueeze(1), None)


def _q5_1(b):
    high = (b[:, 4:8].contiguous().view(torch.int32) >> torch.arange(32, dtype=torch.int32)) & 1  # [n, 32]
    return Parts((_nibbles(b[:, 8:]) | (high.to(torch.uint8) << 4)).unsqueeze(1), 0, _f16(b[:, :2]), _f16(b[:, 2:4]))


def _k_scale_bits(b):
    """A K-quant block's 8 pairs of 6-bit scales and mins (bytes 4..16) as integers: [n, 8] each."""
    sc = b[:, 4:16].int()
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return torch.cat([lo_s, hi_s], 1), torch.cat([lo_m, hi_m], 1)


def _k_scales(b):
    """A K-quant block's d, dmin and 8 pairs of 6-bit scales and mins (bytes 4..16): [n, 8] scale and min."""
    d, dmin = _f16(b[:, :2]).float(), _f16(b[:, 2:4]).float()
    s, m = _k_scale_bits(b)
    return d * s.float(), -(dmin * m.float())


def q5_k_grid(b):
    """Q5_K blocks [n, 176] as the int5-k format keeps them: q [n, 256] in [0, 31], then as q4_k_grid's."""
    _, s, m, d, dmin = q4_k_grid(torch.cat([b[:, :16], b[:, 48:]], 1))  # Q4_K's layout without the high bits
    return _q5_k(b).q.reshape(len(b), 256), s, m, d, dmin


def q4_k_grid(b):
    """Q4_K blocks [n, 144] as the int4-k format keeps them: q [n, 256], scales and mins [n, 8] uint8, d and dmin [n]."""
    s, m = _k_scale_bits(b)
    return (_k_nibbles(b[:, 16:]).reshape(len(b), 256), s.to(torch.uint8), m.to(torch.uint8),
            _f16(b[:, :2]).reshape(-1), _f16(b[:, 2:4]).reshape(-1))


def _k_nibbles(qs):
    """[n, 128] bytes -> [n, 8, 32]: chunk c holds sub-block 2c in the low nibbles, 2c + 1 in the high."""
    q = qs.reshape(-1, 4, 1, 32)
    return torch.cat([q & 0x0F, q >> 4], dim=2).reshape(-1, 8, 32)


def _q4_k(b):
    scale, mn = _k_scales(b)  # 8 sub-blocks of 32 share 6-bit scales and mins packed into 12 bytes
    return Parts(_k_nibbles(b[:, 16:]), 0, scale, mn)


def _q5_k(b):
    scale, mn = _k_scales(b)
    qh = b[:, 16:48].reshape(-1, 1, 32)  # bit s of byte l: element l of sub-block s
    high = (qh >> torch.arange(8, dtype=torch.uint8).view(1, 8, 1)) & 1
    return Parts(_k_nibbles(b[:, 48:]) | (high << 4), 0, scale, mn)


def _q6_k(b):
    ql, qh = b[:, :128].reshape(-1, 2, 2, 32), b[:, 128:192].reshape(-1, 2, 1, 32)
    sc = b[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]: one per 16 elements, in order
    d = _f16(b[:, 208:210]).float()
    # each 128-element half h: element 32 j + l (j < 4) takes its low 4 bits from ql[h][j % 2] (the
    # low nibble for j < 2) and its high 2 bits from qh[h] at bit 2 j
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # [n, 2, 4, 32]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    q = low | (((qh >> shifts) & 3) << 4)
    return Parts(q.reshape(-1, 16, 16), 32, d * sc, None)


def q6_k_grid(b):
    """Q6_K blocks [n, 210] as the int6 format keeps them: q [n, 256] in [0, 63], s [n, 16] int8, d [n] fp16."""
    q = _q6_k(b).q.reshape(len(b), 256)
    return q, b[:, 192:208].contiguous().view(torch.int8), _f16(b[:, 208:210]).reshape(-1)


def _k_crumbs(qs):
    """[n, 64] bytes of 2-bit values -> [n, 256]: each 128 k h takes bytes 32 h .. 32 h + 31, shift 2 j for
    elements 32 j .. 32 j + 31 of it."""
    a = qs.numpy().reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return torch.from_numpy((a & 3).reshape(len(a), 256))


def q3_k_grid(b):
    """Q3_K blocks [n, 110]: q [n, 256] in [0, 7] (zero 4), s [n, 16] int8 (6-bit scales minus 32), d [n] fp16."""
    n = len(b)
    hm = b[:, :32].numpy().reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = _k_crumbs(b[:, 32:96]) | (torch.from_numpy((hm & 1).reshape(n, 256)) << 2)
    sc = b[:, 96:108].numpy()
    low = (sc[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16) & 15
    high = (sc[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16) & 3
    s = torch.from_numpy((low | (high << 4)).astype(np.int8) - np.int8(32))
    return q, s, _f16(b[:, 108:110]).reshape(-1)


def q2_k_grid(b):
    """Q2_K blocks [n, 84]: q [n, 256] in [0, 3], c [n, 16] uint8 (scale in the low nibble, minimum in the
    high), d and dmin [n] fp16."""
    return _k_crumbs(b[:, 16:80]), b[:, :16].contiguous(), _f16(b[:, 80:82]).reshape(-1), _f16(b[:, 82:84]).reshape(-1)


def _q3_k(b):
    q, s, d = q3_k_grid(b)
    return Parts(q.view(len(b), 16, 16), 4, d.float()[:, None] * s.float(), None)


def _q2_k(b):
    q, c, d, dmin = q2_k_grid(b)
    c = c.int()
    return Parts(q.view(len(b), 16, 16), 0, d.float()[:, None] * (c & 15).float(),
                 -(dmin.float()[:, None] * (c >> 4).float()))


IQ4_VALUES = torch.tensor(rtn.IQ4_VALUES, dtype=torch.int8)


def iq4_nl_grid(b):
    """IQ4_NL blocks [n, 18]: codes [n, 32] (byte j: element j low, j + 16 high), d [n] fp16."""
    return _nibbles(b[:, 2:]), _f16(b[:, :2]).reshape(-1)


def iq4_xs_grid(b):
    """IQ4_XS blocks [n, 136]: codes [n, 256] (each 16-byte chunk a sub-block of 32 as IQ4_NL's), s [n, 8] int8
    (6-bit scales, 4 low bits in bytes 4..7 two to a byte, 2 high bits in the uint16 at bytes 2..3, minus 32),
    d [n] fp16."""
    n = len(b)
    codes = _nibbles(b[:, 8:].reshape(n * 8, 16)).reshape(n, 256)
    low = b[:, 4:8].int()
    low = torch.stack([low & 0x0F, low >> 4], dim=-1).reshape(n, 8)
    high = (b[:, 2:4].contiguous().view(torch.int16).int() & 0xFFFF) >> torch.arange(0, 16, 2, dtype=torch.int32)
    s = (low | ((high & 3) << 4)) - 32
    return codes, s.to(torch.int8), _f16(b[:, :2]).reshape(-1)


def _iq4_nl(b):
    codes, d = iq4_nl_grid(b)
    return Parts(IQ4_VALUES[codes.long()].unsqueeze(1), 0, d.unsqueeze(1), None)


def _iq4_xs(b):
    codes, s, d = iq4_xs_grid(b)
    return Parts(IQ4_VALUES[codes.long()].view(len(b), 8, 32), 0, d.float()[:, None] * s.float(), None)


# IQ1_*, IQ2_*, IQ3_*, TQ1_0 and TQ2_0 have no layout: refused by name (dequant.check_type)
LAYOUTS: dict[T, Layout] = {
    T.Q4_0: Layout(_q4_0, "int4-sym", frozenset({"int4-sym", "int4", "int5-sym", "int5"})),
    T.Q4_1: Layout(_q4_1, "int4", frozenset({"int4", "int5"})),
    T.Q8_0: Layout(_q8_0, "int8-g32", frozenset({"int8-g32"})),
    T.Q5_0: Layout(_q5_0, "int5-sym", frozenset({"int5-sym", "int5", "int8-g32"})),  # q - 16: int8 exactly too
    T.Q5_1: Layout(_q5_1, "int5", frozenset({"int5"})),
    T.Q4_K: Layout(_q4_k, "int4-k", frozenset({"int4-k"})),
    T.Q5_K: Layout(_q5_k, "int5-k", frozenset({"int5-k"})),
    T.Q6_K: Layout(_q6_k, "int6", frozenset({"int6"})),
    # codes through IQ4_NL's table: int8 values, so int8-g32 holds IQ4_NL (its fp16 d) exactly too
    T.IQ4_NL: Layout(_iq4_nl, "iq4-nl", frozenset({"iq4-nl", "int8-g32"})),
    T.IQ4_XS: Layout(_iq4_xs, "iq4-xs", frozenset({"iq4-xs"})),
    T.Q3_K: Layout(_q3_k, "int3", frozenset({"int3"})),
    T.Q2_K: Layout(_q2_k, "int2", frozenset({"int2"})),
    # kept as the mxfp4 format's own blocks (GPT-OSS's experts); beside other types, int8-g32 holds its values
    # exactly while 2^(e - 128) is an fp16 number
    T.MXFP4: Layout(_mxfp4, "mxfp4", frozenset({"mxfp4", "int8-g32"})),
}
