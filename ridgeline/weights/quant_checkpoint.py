"""Folders already quantized to int4 in a hub layout (hub_layout.py): `quantization_config` in
config.json says which, and the checkpoint's packed tensors are unpacked here into the engine's
orientation before the loader hands them to a Linear (models/loader.py):

    <layer>.qweight  [N, K] uint8 q in [0, 15], input columns in checkpoint order
    <layer>.scales   [N, K / G] fp16 d
    <layer>.qzeros   [N, K / G] fp16 m = -s * z (asymmetric only: Q4_1's grid, grid.to_int4)
    <layer>.g_idx    [K] int32 (GPTQ only; k // G when the file has none)

Every tensor of one layer is read before that layer is emitted, so their order in the files does not
matter. A symmetric checkpoint must have every zero point at 8 (then it is Q4_0's grid exactly).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ridgeline.errors import ModelLoadError
from ridgeline.formats import grid, hub_layout

METHODS = ("gptq", "awq")
PARTS = {"gptq": ("qweight", "qzeros", "scales", "g_idx"), "awq": ("qweight", "qzeros", "scales")}


@dataclass(frozen=True)
class QuantConfig:
    method: str  # quant_method: gptq or awq
    bits: int
    group_size: int
    symmetric: bool
    v2: bool = False  # GPTQ "gptq_v2": zero points stored as they are (v1 stores z - 1)
    act_order: bool = False
    produced_by: str | None = None  # `ridgeline quantize`'s method (rtn, gptq, awq), when it wrote the folder


FP8_METHODS = ("fp8", "compressed-tensors")  # read by weights/fp8_checkpoint.py


def read_quant_config(folder: Path) -> QuantConfig | None:
    """The folder's quantization_config, or None when it has none. ModelLoadError for one the engine
    cannot run (another method, bits, or group size)."""
    path = Path(folder) / "config.json"
    try:
        qc = json.loads(path.read_text()).get("quantization_config")
    except (OSError, json.JSONDecodeError):
        return None  # the config loader reports a missing or broken config.json
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method in FP8_METHODS or method == "mxfp4":
        return None  # fp8 checkpoints: weights/fp8_checkpoint.py reads them; MXFP4 ones weights/mxfp4_checkpoint.py
    if method not in METHODS:
        raise ModelLoadError(f"{path}: quantization_config quant_method {method or 'missing'!r} is not one this "
                             f"engine loads ({', '.join(METHODS + FP8_METHODS + ('mxfp4',))})")
    bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
    if bits != 4:
        raise ModelLoadError(f"{path}: {method} with {bits} bits; the engine runs 4-bit only")
    if method == "awq" and str(qc.get("version", "gemm")).lower() != "gemm":
        raise ModelLoadError(f"{path}: AWQ version {qc.get('version')!r}; the engine reads the GEMM layout only")
    try:
        grid.check_group(group, group)
    except Exception:
        raise ModelLoadError(f"{path}: {method} group size {group}; the engine's int4 runs groups of 32, 64 or "
                             "128") from None
    sym = bool(qc.get("sym", True)) if method == "gptq" else not qc.get("zero_point", True)
    return QuantConfig(method, 4, int(group), sym, str(qc.get("checkpoint_format", "gptq")) == "gptq_v2",
                       bool(qc.get("desc_act", False)), qc.get("method"))


def unpack_checkpoint(tensors: Iterable[tuple[str, torch.Tensor]], qc: QuantConfig
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a quantized checkpoint -> the same with each layer's packed parts unpacked."""
    parts = PARTS[qc.method]
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors:
        prefix, _, part = name.rpartition(".")
        if part in parts:
            pending.setdefault(prefix, {})[part] = t
        else:
            yield name, t
    for prefix, found in pending.items():
        missing = [p for p in parts if p not in found and p != "g_idx"]
        if missing:
            raise ModelLoadError(f"{qc.method} layer {prefix} lacks {', '.join(missing)}")
        yield from _unpack_layer(prefix, found, qc)


def _unpack_layer(prefix: str, t: dict[str, torch.Tensor], qc: QuantConfig) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        if qc.method == "gptq":
            q, scale, zero, g_idx = hub_layout.unpack_gptq(t, qc.v2)
        else:
            (q, scale, zero), g_idx = hub_layout.unpack_awq(t), None
    except (RuntimeError, ValueError, IndexError) as e:
        raise ModelLoadError(f"{qc.method} layer {prefix}: packed tensors of inconsistent shapes ({e})") from None
    N, K = q.shape
    if scale.shape != (N, K // qc.group_size):
        raise ModelLoadError(f"{qc.method} layer {prefix}: scales {tuple(scale.shape)} do not match a [{N}, {K}] "
                             f"weight in groups of {qc.group_size}")
    if qc.symmetric and bool((zero != 8).any()):
        raise ModelLoadError(f"{qc.method} layer {prefix}: the config says symmetric but zero points differ from 8")
    yield f"{prefix}.qweight", q
    yield f"{prefix}.scales", scale
    if not qc.symmetric:
        yield f"{prefix}.qzeros", grid.minimum(scale, zero)
    if qc.method == "gptq":
        yield f"{prefix}.g_idx", (torch.arange(K, dtype=torch.int32) // qc.group_size if g_idx is None
                                  else g_idx.to(torch.int32))


def folder_quantization(folder: Path, requested: str, group_size: int | None, symmetric: bool
                        ) -> tuple[str, str | None]:
    """(the quantization the engine applies, the weight format every Linear takes or None for dense),
    from --quantization and the folder's quantization_config: a quantized folder loads as what it is
    (under `none`, the default, or its own method); asking for another method, or for gptq / awq of a
    folder without that config, is an error before any weight is read."""
    from ridgeline.errors import InvalidRequestError
    from ridgeline.formats.options import PREQUANTIZED, format_name
    qc = read_quant_config(folder)
    if qc is None:
        if requested in PREQUANTIZED:
            raise InvalidRequestError(f"--quantization {requested} loads a folder quantized with {requested} (its "
                                      f"config.json has quantization_config), and {folder} has none; quantize it "
                                      f"with `ridgeline quantize --method {requested}` or choose int4", "quantization")
        return requested, format_name(requested, group_size, symmetric)
    if requested not in ("none", qc.method):
        raise InvalidRequestError(f"{folder} is quantized with {qc.method} (quantization_config in config.json); "
                                  f"--quantization must be {qc.method} or left out, not {requested}", "quantization")
    if group_size is not None or symmetric:
        raise InvalidRequestError(f"{folder} is quantized with {qc.method}: its group size and grid come from its "
                                  "quantization_config, not --quant-group-size / --quant-symmetric", "quantization")
    return qc.method, format_name(qc.method, qc.group_size, qc.symmetric)
