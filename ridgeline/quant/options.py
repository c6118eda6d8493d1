"""The `quantization` engine option (torch-free: the config validates it once, at the entry point).

    none   weights in --dtype, as loaded
    int8   per-output-channel symmetric int8, weight-only (round-to-nearest)
    int4   group-wise int4, weight-only (round-to-nearest); groups of 32 (default), 64 or 128 consecutive
           input columns; asymmetric (scale and minimum per group, GGUF Q4_1's grid) unless symmetric

Every Linear takes the format, the LM head included (a tied embedding stays a float table for the
lookup; the head gets its own quantized copy), except that under int4 the LM head is int8: on the
default model a 4-bit head alone costs ~6% perplexity and a fifth of greedy top-1 agreement, an
8-bit one almost nothing, for 13% more bytes per token (as llama.cpp keeps its Q4 files' output
tensor at 6-8 bits). `layer_formats` rules win over both for the layers they match.
"""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError

QUANTIZATIONS = ("none", "int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 32


def check(quantization: str, group_size: int | None, symmetric: bool) -> None:
    """Raise InvalidRequestError for a value no format takes (the per-layer shape check comes at build time)."""
    if quantization not in QUANTIZATIONS:
        raise InvalidRequestError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}",
                                  "quantization")
    if group_size is not None:
        if quantization != "int4":
            raise InvalidRequestError(f"quant_group_size applies to int4 only (quantization is {quantization})",
                                      "quant_group_size")
        if isinstance(group_size, bool) or group_size not in INT4_GROUP_SIZES:
            raise InvalidRequestError(f"quant_group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}, "
                                      f"got {group_size!r}", "quant_group_size")
    if symmetric and quantization == "none":
        raise InvalidRequestError("quant_symmetric needs a quantization (int8 is always symmetric; int4 "
                                  "is asymmetric unless this is set)", "quant_symmetric")


def format_name(quantization: str, group_size: int | None, symmetric: bool) -> str | None:
    """The weight-format registry name every Linear takes, or None (dense in the engine dtype)."""
    if quantization == "int8":
        return "int8"
    if quantization == "int4":
        group = group_size or DEFAULT_GROUP_SIZE
        return "int4" + ("-sym" if symmetric else "") + ("" if group == 32 else f"-g{group}")
    return None


def implied_rules(quantization: str) -> tuple[tuple[str, str], ...]:
    """(glob, format) rules the quantization adds after the user's layer_formats (which match first)."""
    return (("lm_head", "int8"),) if quantization == "int4" else ()
