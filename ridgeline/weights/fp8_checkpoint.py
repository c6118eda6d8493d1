"""FP8 checkpoints as Hugging Face folders have them: `config.json` `quantization_config` with
quant_method "fp8", or "compressed-tensors" whose config groups store weights as 8-bit floats. Each
quantized Linear's `X.weight` is float8 (E4M3) beside `X.weight_scale` (or "fp8"'s `X.weight_scale_inv`):
one value for the tensor or one per output channel, w = scale * weight. `X.input_scale` (a static
activation scale) is read past: the fp8 formats here are weight-only, activations stay fp32.

`checkpoint_format` says whether a folder is one (and which layers it keeps in float); `tensors` wraps
the loader's tensor stream: a weight whose Linear takes its fp8 values as they are (`keeps`) comes
through as float8 followed by its scale expanded to one per row, anything else dequantized to fp32,
so an explicit other format still sees the checkpoint's values. Block-wise fp8 (weight_block_size,
2-D scales) is refused with the layouts that load.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ridgeline.errors import ModelLoadError
from ridgeline.weights.safetensors_loader import weight_files

SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv")
SUPPORTED = "per-tensor or per-channel weight_scale beside a float8_e4m3fn weight"


def _quant_config(folder: Path) -> dict | None:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    return q if isinstance(q, dict) else None


def _is_float8_group(group: dict) -> bool:
    w = group.get("weights") or {}
    return w.get("type") == "float" and w.get("num_bits") == 8


def is_fp8_checkpoint(folder: Path) -> bool:
    """True for an fp8 checkpoint this loader keeps; ModelLoadError for an fp8 layout it cannot load."""
    q = _quant_config(folder)
    if q is None:
        return False
    method = q.get("quant_method")
    if method == "fp8":
        if q.get("weight_block_size"):
            raise ModelLoadError(f"{folder}: block-wise fp8 (weight_block_size {q['weight_block_size']}) is not "
                                 f"supported; fp8 checkpoints load with a {SUPPORTED}")
        return True
    if method == "compressed-tensors":
        groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
        fp8 = [g for g in groups if _is_float8_group(g)]
        for g in fp8:
            strategy = (g.get("weights") or {}).get("strategy", "tensor")
            if strategy not in ("tensor", "channel"):
                raise ModelLoadError(f"{folder}: compressed-tensors float8 with strategy {strategy!r} is not "
                                     f"supported; fp8 checkpoints load with a {SUPPORTED}")
        return bool(fp8)
    return False


def checkpoint_formats(folder: Path, dense: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """For an fp8 checkpoint loaded without an explicit quantization: the format every Linear takes
    ("fp8") and the rules keeping the layers the checkpoint has in float (`dense`); None otherwise."""
    if not is_fp8_checkpoint(folder):
        return None
    return "fp8", tuple((name, dense) for name in float_linears(folder))


def float_linears(folder: Path) -> list[str]:
    """Names (as in the checkpoint, without `.weight`) of the LM head when the checkpoint keeps it in float."""
    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            if "lm_head.weight" in f.keys():
                return [] if f.get_slice("lm_head.weight").get_dtype().startswith("F8") else ["lm_head"]
    return ["lm_head"]  # tied to the (float) embedding


def _scales(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                for suffix in SCALE_SUFFIXES:
                    if name.endswith(suffix):
                        out[name[:-len(suffix)]] = f.get_tensor(name).float()
    return out


def _per_row(scale: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    if scale.numel() == 1:
        return scale.reshape(1).expand(rows).contiguous()
    if scale.numel() == rows and (scale.dim() == 1 or scale.shape[1:].numel() == 1):
        return scale.reshape(rows).contiguous()
    raise ModelLoadError(f"{name}: scale of shape {tuple(scale.shape)} for {rows} rows; fp8 checkpoints load "
                         f"with a {SUPPORTED}")


def tensors(folder: Path, stream: Iterator[tuple[str, torch.Tensor]],
            keeps: Callable[[str, torch.dtype], bool]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with fp8 weights kept (and their scales after them) or dequantized."""
    scales = _scales(folder)
    for name, t in stream:
        if name.endswith(SCALE_SUFFIXES) or name.endswith(".input_scale"):
            continue
        if not (name.endswith(".weight") and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):
            yield name, t
            continue
        prefix = name[:-len(".weight")]
        if prefix not in scales:
            raise ModelLoadError(f"{name} is {t.dtype} but the checkpoint has no {prefix}.weight_scale")
        scale = _per_row(scales[prefix], t.shape[0], name)
        if keeps(name, t.dtype):
            yield name, t
            yield prefix + ".weight_scale", scale
        else:
            yield name, t.float() * scale[:, None]
