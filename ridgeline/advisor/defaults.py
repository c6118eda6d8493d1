"""`--hardware auto` and `--weights auto`: what the advisor assumes when not told, from this machine and the
model's own files, so that `ridgeline advise` on a CPU box describes that box and the format the engine runs.

- hardware: the visible GPU's table entry (its device name matched against the table's names), this
  machine's measured profile (`local`) when no GPU is visible or the GPU is not in the table;
- weights: a GGUF model's bytes per parameter as stored (its blocks are kept: Q4_* reads as int4, Q8_0 as
  int8, F16 as bf16), a quantized folder's own bits (GPTQ / AWQ int4, fp8, MXFP4 as fp4), else bf16.
"""
from __future__ import annotations

from pathlib import Path

from ridgeline.advisor.hardware import HARDWARE, _ALIASES, _norm


def hardware_name(name: str) -> str:
    """`auto` -> a table name or `local`; any other name unchanged."""
    if name.lower() != "auto":
        return name
    try:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # no usable driver: as no GPU
        gpu = None
    return table_match(gpu) if gpu else "local"


def table_match(device_name: str) -> str:
    """The table entry a device name ("NVIDIA H100 80GB HBM3") names, longest name first, else `local`."""
    key = _norm(device_name)
    names = {**{_norm(n): n for n in HARDWARE}, **_ALIASES}
    for short in sorted(names, key=len, reverse=True):
        if short and short in key:
            return names[short]
    return "local"


def precision_of(bytes_per_param: float) -> str:
    """The advisor's precision nearest a stored size per weight (a 4-bit block format with its scales is
    ~0.56-0.63 bytes, Q8_0 ~1.06)."""
    for limit, prec in ((0.75, "int4"), (1.5, "int8"), (3.0, "bf16")):
        if bytes_per_param <= limit:
            return prec
    return "fp32"


def weights_for(weights: str, model: str, params: float) -> str:
    """`auto` -> the precision the engine runs `model` in (params: its parameter count); else unchanged."""
    if weights.lower() != "auto":
        return weights
    path = Path(model).expanduser()
    gguf = path if model.endswith(".gguf") and path.is_file() else _pulled(model)
    if gguf is not None and params > 0:
        return precision_of(_tensor_bytes(gguf) / params)
    if path.is_dir() or (path.name == "config.json" and path.is_file()):
        return _folder_precision(path if path.is_dir() else path.parent)
    return "bf16"


def _pulled(model: str) -> Path | None:
    """A built-in alias's GGUF file, if it has been pulled (never downloads)."""
    from ridgeline.weights.pull import ALIASES, alias_path
    path = alias_path(model) if model in ALIASES else None
    return path if path is not None and path.is_file() else None


def _tensor_bytes(gguf: Path) -> int:
    from ridgeline.gguf.reader import read_gguf
    g = read_gguf(gguf)
    try:
        return sum(i.n_bytes for i in g.tensors.values())
    finally:
        g.close()


def _folder_precision(folder: Path) -> str:
    import json
    try:
        qc = json.loads((folder / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return "bf16"
    method = str(qc.get("quant_method", "")).lower()
    if method in ("gptq", "awq"):  # the engine loads their 4-bit layouts
        return "int4"
    if method in ("fp8", "compressed-tensors"):
        return "fp8"
    if method == "mxfp4":
        return "fp4"
    return "bf16"
