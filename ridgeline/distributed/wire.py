"""The one codec for what a distributed engine's processes send each other (plans, answers, start-up
facts): JSON of plain values and of the dataclasses registered here, with tensors and bytes in a
binary section after it. Nothing else can be decoded: no pickle, no class named by the sender that
was not registered, no size the frame does not hold.

    frame = u32 JSON length | JSON | binary section
    value = null | bool | int | float | str | [value, ...]
          | {"@": "t", "v": [...]}                         a tuple
          | {"@": "d", "v": [[key, value], ...]}           a dict (any keys)
          | {"@": "b", "o": offset, "n": bytes}            bytes in the binary section
          | {"@": "T", "dt": dtype, "s": shape, "o": offset, "n": bytes}    a tensor (CPU copy)
          | {"@": NAME, "v": [field, ...]}                 a registered dataclass, its fields in order

A decoded dataclass is built through its constructor, so its own validation runs (SamplingParams
checks every field); frozen ones whose fields are hashable are built once per distinct value."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import struct

import torch

from ridgeline.errors import RidgelineError

_LEN = struct.Struct("<I")
MAX_DEPTH = 32
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                                     torch.int32, torch.int8, torch.uint8, torch.bool)}
_TYPES: dict[str, type] = {}
_BUILD: dict[str, object] = {}
_CACHED: set[type] = set()
_CACHED_NAMES: set[str] = set()
_DECODED: dict = {}  # (name, fields' JSON) of a cached type -> the value (bounded: cleared when full)
_ENCODED: dict = {}  # value of a cached type -> its encoding (bounded: cleared when full)
_PLAIN = frozenset((int, str, bool, type(None)))  # float is not: a non-finite one needs a tag


class WireError(RidgelineError):
    """A frame that does not decode to registered types within its own bounds."""


def wire_type(cls: type, cached: bool = False) -> type:
    """Allow dataclass `cls` on the wire (by its class name). cached: a frozen type whose equal field
    values may share one instance (decoding then skips re-running its validation)."""
    name = cls.__name__
    if _TYPES.get(name, cls) is not cls:
        raise ValueError(f"two wire types named {name}")
    _TYPES[name] = cls
    if cached:
        _CACHED.add(cls)
        _CACHED_NAMES.add(name)
    else:
        _BUILD[name] = cls
    return cls


def encode(obj) -> bytes:
    chunks: list[bytes] = []
    size = [0]

    def blob(data: bytes) -> tuple[int, int]:
        off = size[0]
        chunks.append(data)
        size[0] += len(data)
        return off, len(data)

    def enc(v):
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"@": "f", "v": repr(v)}
        if isinstance(v, list):
            return [x if type(x) in _PLAIN else enc(x) for x in v]
        if isinstance(v, tuple):
            return {"@": "t", "v": [enc(x) for x in v]}
        if isinstance(v, dict):
            return {"@": "d", "v": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, (bytes, bytearray)):
            off, n = blob(bytes(v))
            return {"@": "b", "o": off, "n": n}
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            off, n = blob(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            return {"@": "T", "dt": str(t.dtype).removeprefix("torch."), "s": list(t.shape), "o": off, "n": n}
        cls = type(v)
        if cls in _CACHED:
            hit = _ENCODED.get(v)
            if hit is None:
                if len(_ENCODED) > 4096:
                    _ENCODED.clear()
                fields = [enc(getattr(v, f)) for f in _field_names(cls)]
                hit = _ENCODED[v] = {"@": cls.__name__, "j": json.dumps(fields, separators=(",", ":"))}
            return hit
        if _TYPES.get(cls.__name__) is cls:
            return {"@": cls.__name__, "v": [x if type(x) in _PLAIN else enc(x)
                                             for x in map(v.__getattribute__, _field_names(cls))]}
        raise TypeError(f"{cls.__name__} is not a wire type")

    head = json.dumps(enc(obj), separators=(",", ":"), allow_nan=False, check_circular=False).encode()
    return _LEN.pack(len(head)) + head + b"".join(chunks)


def decode(frame: bytes | bytearray | memoryview):
    view = memoryview(frame)
    if len(view) < _LEN.size:
        raise WireError("a frame shorter than its length field")
    (n,) = _LEN.unpack(view[:_LEN.size])
    if _LEN.size + n > len(view):
        raise WireError(f"a frame whose JSON ({n} bytes) runs past its end ({len(view)} bytes)")
    try:
        tree = json.loads(bytes(view[_LEN.size:_LEN.size + n]))
    except (ValueError, RecursionError) as e:
        raise WireError(f"a frame whose JSON does not parse: {e}") from None
    blobs = view[_LEN.size + n:]
    return _dec(tree, blobs, 0)


def _dec(v, blobs: memoryview, depth: int):
    if depth > MAX_DEPTH:
        raise WireError("a frame nested too deep")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [x if type(x) in _PLAIN else _dec(x, blobs, depth + 1) for x in v]
    if not isinstance(v, dict):
        raise WireError(f"an unexpected JSON value {type(v).__name__}")
    tag, items = v.get("@"), v.get("v")
    if "j" in v:
        return _cached(tag, v["j"], blobs)
    if tag == "f":
        return float(_str(items))
    if tag in ("b", "T"):
        return _blob(v, blobs)
    if not isinstance(items, list):
        raise WireError(f"a {tag!r} value without its items")
    if tag == "t":
        return tuple(_dec(x, blobs, depth + 1) for x in items)
    if tag == "d":
        pairs = [_pair(p) for p in items]
        out = {}
        for k, x in pairs:
            k = _dec(k, blobs, depth + 1)
            try:
                out[k] = _dec(x, blobs, depth + 1)
            except TypeError:  # an unhashable key
                raise WireError("a dict key that cannot be a key") from None
        return out
    build = _BUILD.get(tag) if isinstance(tag, str) else None
    if build is None:
        raise WireError(f"{tag!r} is not a wire type")
    return _build(tag, build, [x if type(x) in _PLAIN else _dec(x, blobs, depth + 1) for x in items])


def _build(tag: str, build, args: list):
    try:
        return build(*args)
    except (TypeError, ValueError) as e:  # wrong arity, or the type's own validation (InvalidRequestError)
        raise WireError(f"an invalid {tag}: {e}") from None


def _cached(tag, text, blobs: memoryview):
    """A cached type, its fields as JSON text: built once per distinct text."""
    key = (tag, text)
    hit = _DECODED.get(key)
    if hit is None:
        if tag not in _CACHED_NAMES or not isinstance(text, str):
            raise WireError(f"{tag!r} is not a cached wire type")
        try:
            items = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise WireError(f"a {tag} whose JSON does not parse: {e}") from None
        if not isinstance(items, list):
            raise WireError(f"a {tag} without its items")
        hit = _build(tag, _TYPES[tag], [_dec(x, blobs, 1) for x in items])
        if len(_DECODED) > 4096:
            _DECODED.clear()
        _DECODED[key] = hit
    return hit


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def _pair(p) -> tuple:
    if not isinstance(p, list) or len(p) != 2:
        raise WireError("a dict item that is not a [key, value] pair")
    return p[0], p[1]


def _str(v) -> str:
    if not isinstance(v, str):
        raise WireError("a float that is not spelled as a string")
    if v not in ("inf", "-inf", "nan"):
        raise WireError(f"a non-finite float spelled {v!r}")
    return v


def _blob(v: dict, blobs: memoryview):
    off, n = v.get("o"), v.get("n")
    if not (isinstance(off, int) and isinstance(n, int) and 0 <= off and 0 <= n and off + n <= len(blobs)):
        raise WireError("a binary value outside its frame")
    data = blobs[off:off + n]
    if v["@"] == "b":
        return bytes(data)
    dtype, shape = DTYPES.get(v.get("dt")), v.get("s")
    if dtype is None:
        raise WireError(f"a tensor of dtype {v.get('dt')!r}")
    if not (isinstance(shape, list) and len(shape) <= 8 and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise WireError("a tensor with a bad shape")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if math.prod(shape) * itemsize != n:
        raise WireError(f"a tensor of shape {shape} ({v.get('dt')}) that does not hold {n} bytes")
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
