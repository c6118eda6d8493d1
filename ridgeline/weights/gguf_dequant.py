"""Read GGUF files (metadata + tensor index) and dequantize their tensors to float32.

`read_gguf` parses the header directly from a memory map: gguf-py's `GGUFReader` builds a numpy
view per string of the 49k-entry vocabulary and takes seconds; this takes tens of milliseconds.
Dequantization is vectorized over all blocks of a tensor with torch (no Python loop per block).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ridgeline.errors import ModelLoadError

_MAGIC = b"GGUF"
# GGUF value type id -> (struct format, numpy dtype) for scalar types.
_SCALARS = {
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
    4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
    10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # logical (torch) order: GGUF's ne[] reversed
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    n_bytes: int


@dataclass
class GGUFFile:
    path: Path
    metadata: dict  # scalars as Python values, numeric arrays as numpy, string arrays as lists
    tensors: dict[str, GGUFTensorInfo]
    buffer: mmap.mmap

    def raw(self, info: GGUFTensorInfo) -> np.ndarray:
        return np.frombuffer(self.buffer, dtype=np.uint8, count=info.n_bytes, offset=info.offset)

    def dequantize(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        return dequantize(self.raw(info), info.qtype, info.shape, name)


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int) -> int:
        start = self.pos
        if start + n > len(self.buf):
            raise ModelLoadError(f"GGUF file {self.path} is truncated (header ends early)")
        self.pos += n
        return start

    def scalar(self, vtype: int):
        fmt, _ = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(10)
        start = self.need(n)
        return self.buf[start:start + n].decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.scalar(4), self.scalar(10)
            if itype == _STRING:
                return [self.string() for _ in range(count)]
            if itype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            dtype = np.dtype(_SCALARS[itype][1])
            start = self.need(count * dtype.itemsize)
            return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()
        if vtype not in _SCALARS:
            raise ModelLoadError(f"GGUF file {self.path} has an unknown metadata value type {vtype}")
        return self.scalar(vtype)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF v2/v3 file's metadata and tensor index; tensor bytes stay in the memory map."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # ValueError: mmap of an empty file
        raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from e
    cur = _Cursor(buf, path)
    if len(buf) < 24 or buf[:4] != _MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic or too short)")
    cur.pos = 4
    version = cur.scalar(4)
    if version not in (2, 3):
        raise ModelLoadError(f"GGUF file {path} has unsupported version {version} (need 2 or 3)")
    n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar(4))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
        qtype_id, offset = cur.scalar(4), cur.scalar(10)
        infos.append((name, tuple(reversed(dims)), qtype_id, offset))
    align = int(metadata.get("general.alignment", 32))
    data_start = -(-cur.pos // align) * align
    tensors = {}
    for name, shape, qtype_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(qtype_id)
        except ValueError:
            raise ModelLoadError(f"tensor {name!r} in {path} has unknown GGML type id {qtype_id}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape, dtype=np.int64))
        n_bytes = n // block * type_size
        start = data_start + offset
        if start + n_bytes > len(buf):
            raise ModelLoadError(f"GGUF file {path} is truncated: tensor {name!r} runs past the end")
        tensors[name] = GGUFTensorInfo(name, shape, qtype, start, n_bytes)
    return GGUFFile(path, metadata, tensors, buf)


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
