"""Number formats (bytes per element) and human-readable quantities."""
from __future__ import annotations

import math

from ridgeline.advisor.errors import AdvisorError

BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "e4m3": "fp8",
           "float8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4", "q8_0": "int8", "q4_0": "int4"}
# the compute rate a weight format runs at when the chip has no matrix unit for it
RATE_KEY = {"fp16": "bf16", "int4": "int8"}


def precision(name: str) -> str:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in BYTES:
        raise AdvisorError(f"unknown precision {name!r} (known: {', '.join(BYTES)})", "precision")
    return key


def nbytes(prec: str) -> float:
    return BYTES[precision(prec)]


def fmt_bytes(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "never" if s > 0 else "n/a"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def fmt_num(x: float) -> str:
    """Compact: 70553706496 -> 70.55e9, 1352.4 -> 1,352, 327680 -> 327,680, 3.364 -> 3.36."""
    if not math.isfinite(x):
        return "unbounded" if x > 0 else "n/a"
    if abs(x) >= 1e7:
        exp = 6 if abs(x) < 1e9 else 9 if abs(x) < 1e12 else 12
        return f"{x / 10**exp:.4g}e{exp}"
    if float(x).is_integer() or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def fmt_rate(x: float, unit: str) -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def fmt_ratio(x: float) -> str:
    """A gain or a speed-up, "1.35x"; never "infx" or "nanx": a ratio over zero has no multiplier."""
    if math.isfinite(x):
        return f"{x:.2f}x"
    return "unbounded (from zero)" if x > 0 else "n/a"


SINGULAR = {"devices": "device", "requests": "request", "tokens": "token", "sequences": "sequence"}


def finite_or_none(value):
    """For --json: inf and nan are not JSON; they become null, inside lists and dicts too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def fmt_value(x: float, unit: str) -> str:
    if not math.isfinite(x):
        return fmt_num(x)  # the step's formula and notes say why there is no number
    if unit == "B":
        return fmt_bytes(x)
    if unit == "s":
        return fmt_time(x)
    if unit in ("FLOP/s", "B/s", "FLOP"):
        return fmt_rate(x, unit)
    return f"{fmt_num(x)} {SINGULAR.get(unit, unit) if x == 1 else unit}".rstrip()
