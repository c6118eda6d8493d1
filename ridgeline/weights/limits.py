"""The model sizes Ridgeline accepts, checked where a config.json or a GGUF file's metadata is read.

Each bound is far past any released model and finite, so that a damaged or hostile file is refused by
name (field and value) before anything is sized from it. Sizes within their bounds can still describe a
model far larger than its weights: models/loader.py compares the two before allocating.
"""
from __future__ import annotations

import math

import numpy as np

from ridgeline.errors import ModelLoadError

# kind -> largest accepted value (the smallest is 1)
LIMITS = {
    "layers": 1024,
    "hidden": 1 << 17,
    "intermediate": 1 << 20,
    "vocab": 1 << 22,
    "heads": 1 << 10,
    "head_dim": 1 << 12,
    "positions": 1 << 24,
    "experts": 1 << 12,
}


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def checked_int(value, field: str, kind: str, where: str) -> int:
    """value as an int in 1..LIMITS[kind]; anything else is a ModelLoadError naming `field` in `where`."""
    if not _is_int(value):
        raise ModelLoadError(f"{where}: {field} is {describe(value)}, not an integer")
    if not 1 <= value <= LIMITS[kind]:
        raise ModelLoadError(f"{where}: {field} = {int(value)} is out of range (1 to {LIMITS[kind]})")
    return int(value)


def checked_index(value, field: str, where: str) -> int:
    """A token id (or another index): a non-negative int."""
    if not _is_int(value) or value < 0:
        raise ModelLoadError(f"{where}: {field} is {describe(value)}, not a non-negative integer")
    return int(value)


def checked_float(value, field: str, where: str, positive: bool = False) -> float:
    if not (_is_int(value) or isinstance(value, (float, np.floating))) or not math.isfinite(value):
        raise ModelLoadError(f"{where}: {field} is {describe(value)}, not a finite number")
    if value < 0 or (positive and value == 0):
        raise ModelLoadError(f"{where}: {field} = {value} must be {'positive' if positive else 'non-negative'}")
    return float(value)


def check_heads(heads: int, kv_heads: int, head_dim: int, fields: tuple[str, str, str], where: str) -> None:
    """Query heads share KV heads in equal groups; rotary embeddings rotate pairs of a head's dimensions."""
    if heads % kv_heads:
        raise ModelLoadError(f"{where}: {fields[0]} = {heads} is not a multiple of {fields[1]} = {kv_heads}")
    if head_dim % 2:
        raise ModelLoadError(f"{where}: {fields[2]} = {head_dim} is odd (rotary embeddings need an even head size)")


def describe(value) -> str:
    """A value for a message: its type and at most 60 characters of it."""
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
