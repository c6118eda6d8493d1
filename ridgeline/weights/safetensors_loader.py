"""Read a Hugging Face folder's safetensors weights (single file or sharded with an index).

Each file's header (an 8-byte length, then that many bytes of JSON naming every tensor's dtype, shape and
byte range) is checked against the file's size before the file is handed to the safetensors library.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ridgeline.errors import ModelLoadError

MAX_HEADER = 100 << 20  # bytes of header JSON; the safetensors library refuses more
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {e}") from None
        files = [folder / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise ModelLoadError(f"weight files named in {index.name} are missing: {', '.join(missing)}")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {folder}")
    for f in files:
        check_header(f)
    return files


def check_header(path: Path) -> int:
    """Check a safetensors file's header against the file; returns the file's size in bytes."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or n > min(MAX_HEADER, size - 8):
                raise ModelLoadError(f"{path} is truncated or not a safetensors file: its header length {n} is past "
                                     f"the end of the file ({size} bytes) or over {MAX_HEADER}")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ModelLoadError(f"cannot read weights from {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ModelLoadError(f"{path}: the safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: the safetensors header is not a JSON object")
    data = size - 8 - n
    for name, info in header.items():
        if name != "__metadata__":
            _check_entry(path, name, info, data)
    return size


def _check_entry(path: Path, name: str, info, data: int) -> None:
    """One tensor's entry: its byte range [begin, end) inside the data section, sized for its dtype and shape."""
    if not isinstance(info, dict):
        raise ModelLoadError(f"{path}: the safetensors header entry of {name!r} is not an object")
    shape, offsets, dtype = info.get("shape"), info.get("data_offsets"), info.get("dtype")

    def ints(v, n=None):
        return isinstance(v, list) and (n is None or len(v) == n) and all(
            type(x) is int and x >= 0 for x in v)

    if not ints(shape) or not ints(offsets, 2) or not isinstance(dtype, str):
        raise ModelLoadError(f"{path}: tensor {name!r} has a malformed header entry (dtype {dtype!r}, shape "
                             f"{shape!r}, data_offsets {offsets!r})")
    begin, end = offsets
    if not begin <= end <= data:
        raise ModelLoadError(f"{path}: tensor {name!r} has data_offsets [{begin}, {end}] outside the file's "
                             f"{data} bytes of data")
    if dtype in DTYPE_BYTES and end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        raise ModelLoadError(f"{path}: tensor {name!r} ({dtype}, shape {shape}) needs "
                             f"{math.prod(shape) * DTYPE_BYTES[dtype]} bytes, its data_offsets give {end - begin}")


def iter_tensors(folder: Path, skip: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """skip(name) True: that tensor is not read at all (another rank's expert)."""
    for path in weight_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if skip is None or not skip(name):
                        yield name, f.get_tensor(name)
        except Exception as e:  # safetensors raises several types for a damaged header/body
            if isinstance(e, ModelLoadError):
                raise
            raise ModelLoadError(f"cannot read weights from {path} (missing, truncated or damaged?): {e}") from None
