"""Parse a GGUF v2/v3 file's header (metadata + tensor index) from a memory map.

gguf-py's `GGUFReader` builds a numpy view per string of a 49k-entry vocabulary and takes seconds; this
takes tens of milliseconds. Every count, length, dimension and offset is checked against the file before
anything is built from it, so a damaged or hostile header is a ModelLoadError naming the field, never an
allocation the file cannot back: a string or array is read only if the bytes it claims are there, a
tensor is indexed only if its bytes lie inside the file.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
# the fewest bytes an element of each type takes in the file: a string or an array is its 8-byte length
# (an array also its 4-byte element type) before any content
_MIN_BYTES = {**{t: struct.calcsize(f) for t, (f, _) in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}
MAX_NAME = 63  # llama.cpp's GGML_MAX_NAME (64) less its NUL: it refuses longer tensor names
MAX_KEY = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 2  # arrays of arrays: llama.cpp reads none; gguf-py writes one level
MAX_ALIGNMENT = 1 << 16
_KV_MIN = 8 + 1 + 4 + 1  # key length, a key of one byte, value type, the smallest value
_TENSOR_MIN = 8 + 1 + 4 + 8 + 4 + 8  # name length, a name of one byte, n_dims, one dim, type, offset


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

    def close(self) -> None:
        """Unmap the file; while an exception's traceback still holds a view of a tensor's bytes, the map goes
        with the last view instead (closing it then would raise BufferError over the error being reported)."""
        try:
            self.buffer.close()
        except BufferError:
            pass


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"GGUF file {self.path}: {what}")

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if n > len(self.buf) - start:
            raise self.fail(f"truncated: {what} ({n} bytes at byte {start}) runs past the end of the "
                            f"file ({len(self.buf)} bytes)")
        self.pos += n
        return start

    def scalar(self, vtype: int, what: str):
        fmt, _ = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), what))[0]

    def count(self, what: str, min_bytes: int, cap: int | None = None) -> int:
        """A uint64 count of items of at least min_bytes each: no more than the rest of the file holds."""
        n = self.scalar(10, what)
        left = len(self.buf) - self.pos
        if n * min_bytes > left or (cap is not None and n > cap):
            limit = left // min_bytes if cap is None else min(cap, left // min_bytes)
            raise self.fail(f"{what} = {n} is out of range (at most {limit} here)")
        return n

    def string(self, what: str, cap: int | None = None) -> str:
        n = self.count(f"length of {what}", 1, cap)
        start = self.need(n, what)
        return self.buf[start:start + n].decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str, depth: int = 0):
        if vtype == _STRING:
            return self.string(f"the string value of {key}")
        if vtype == _ARRAY:
            return self.array(key, depth)
        if vtype not in _SCALARS:
            raise self.fail(f"metadata {key} has unknown value type {vtype}")
        return self.scalar(vtype, f"the value of {key}")

    def array(self, key: str, depth: int):
        itype = self.scalar(4, f"the element type of {key}")
        if itype not in _MIN_BYTES:
            raise self.fail(f"metadata {key} is an array of unknown value type {itype}")
        if itype == _ARRAY and depth + 1 >= MAX_NESTING:
            raise self.fail(f"metadata {key} nests arrays deeper than {MAX_NESTING} levels")
        count = self.count(f"the array length of {key}", _MIN_BYTES[itype])
        if itype == _STRING:
            return [self.string(f"element {i} of {key}") for i in range(count)]
        if itype == _ARRAY:
            return [self.array(key, depth + 1) for _ in range(count)]
        dtype = np.dtype(_SCALARS[itype][1])
        start = self.need(count * dtype.itemsize, f"the elements of {key}")
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF v2/v3 file's metadata and tensor index; tensor bytes stay in the memory map."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # ValueError: mmap of an empty file
        raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from e
    try:
        return _parse(buf, path)
    except BaseException:
        buf.close()
        raise


def _parse(buf: mmap.mmap, path: Path) -> GGUFFile:
    cur = _Cursor(buf, path)
    if len(buf) < 24 or buf[:4] != _MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic or too short)")
    cur.pos = 4
    version = cur.scalar(4, "version")
    if version not in (2, 3):
        raise cur.fail(f"unsupported version {version} (need 2 or 3, little-endian)")
    n_tensors = cur.scalar(10, "tensor count")
    n_kv = cur.count("metadata key-value count", _KV_MIN)
    metadata = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}", MAX_KEY)
        if not key or key in metadata:
            raise cur.fail(f"metadata key {i} {key!r} is {'empty' if not key else 'repeated'}")
        metadata[key] = cur.value(cur.scalar(4, f"the value type of {key}"), key)
    if n_tensors * _TENSOR_MIN > len(buf) - cur.pos:
        raise cur.fail(f"tensor count = {n_tensors} is out of range (at most {(len(buf) - cur.pos) // _TENSOR_MIN} "
                       "here)")
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    align = _alignment(metadata, cur)
    data_start = -(-cur.pos // align) * align
    tensors = {}
    for name, dims, qtype_id, offset in infos:
        if name in tensors:
            raise cur.fail(f"tensor {name!r} is listed twice")
        tensors[name] = _locate(cur, name, dims, qtype_id, offset, data_start, align)
    _check_disjoint(cur, tensors.values())
    return GGUFFile(path, metadata, tensors, buf)


def _check_disjoint(cur: _Cursor, infos) -> None:
    """No two tensors share bytes (a writer lays them out one after another): a type or offset changed by
    damage would otherwise read another tensor's bytes as its own."""
    end, last = 0, None
    for info in sorted(infos, key=lambda i: i.offset):
        if info.offset < end:
            raise cur.fail(f"tensor {info.name!r} (bytes {info.offset} to {info.offset + info.n_bytes}) overlaps "
                           f"tensor {last!r}, which ends at byte {end}")
        end, last = info.offset + info.n_bytes, info.name


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, list[int], int, int]:
    name = cur.string(f"the name of tensor {i}", MAX_NAME)
    n_dims = cur.scalar(4, f"the dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = [cur.scalar(10, f"dimension {j} of tensor {name!r}") for j in range(n_dims)]
    return name, dims, cur.scalar(4, f"the type of tensor {name!r}"), cur.scalar(10, f"the offset of tensor {name!r}")


def _alignment(metadata: dict, cur: _Cursor) -> int:
    align = metadata.get("general.alignment", 32)
    if isinstance(align, bool) or not isinstance(align, int) or not 0 < align <= MAX_ALIGNMENT \
            or align & (align - 1):
        raise cur.fail(f"general.alignment = {align!r} is not a power of two up to {MAX_ALIGNMENT}")
    return align


def _locate(cur: _Cursor, name: str, dims: list[int], qtype_id: int, offset: int, data_start: int,
            align: int) -> GGUFTensorInfo:
    """The tensor's place in the file, its dimensions (GGUF order: dims[0] is the row) checked first."""
    try:
        qtype = GGMLQuantizationType(qtype_id)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise cur.fail(f"tensor {name!r} has unknown GGML type id {qtype_id}") from None
    for j, d in enumerate(dims):
        if not 1 <= d < 1 << 63:
            raise cur.fail(f"dimension {j} of tensor {name!r} is {d}")
    if dims[0] % block:
        raise cur.fail(f"tensor {name!r} has rows of {dims[0]} elements, not a multiple of {qtype.name}'s "
                       f"block of {block}")
    n_bytes = int(np.prod(dims, dtype=object)) // block * type_size
    if offset % align:
        raise cur.fail(f"tensor {name!r} has offset {offset}, not a multiple of the alignment {align}")
    start = data_start + offset
    if n_bytes > len(cur.buf) or start > len(cur.buf) - n_bytes:
        raise cur.fail(f"truncated: tensor {name!r} ({n_bytes} bytes at byte {start}) runs past the end of the "
                       f"file ({len(cur.buf)} bytes)")
    return GGUFTensorInfo(name, tuple(reversed(dims)), qtype, start, n_bytes)
