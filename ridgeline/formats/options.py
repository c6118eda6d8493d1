"""The `quantization` engine option (torch-free: the config validates it once, at the entry point).

    none   weights in --dtype, as loaded
    int8   per-output-channel symmetric int8, weight-only (round-to-nearest)
    int4   group-wise int4, weight-only (round-to-nearest); groups of 32 (default), 64 or 128 consecutive
           input columns; asymmetric (scale and minimum per group, GGUF Q4_1's grid) unless symmetric
    w8a8   int8's weights, and each linear layer's input quantized to int8 per row and block of 32 (integer
           dot products)
    w4a8   int4's weights (the same group sizes and grids), the input quantized to int8 per row and group
    fp8    E4M3 with a scale per output channel, weight-only (fp8-e5m2, fp8-tensor, fp8-e5m2-tensor: registered
           formats for layer_formats); an fp8 checkpoint loads into it as it is (weights/fp8_checkpoint.py)
    mxfp8  E4M3 in blocks of 32 with a power-of-two (E8M0) scale, weight-only
    mxfp4  E2M1 in blocks of 32, E8M0 scale; each linear's input quantized to int8 per row and block of 32
    nvfp4  E2M1 in blocks of 16, E4M3 scale and a fp32 tensor scale; the input int8 per row and block of 16
    gguf   a GGUF model's quantized blocks kept as the file stores them (gguf/kept.py)
    gguf-a8  a GGUF model's blocks against int8 activations (integer dot products): Q4_0 / Q4_1 as stored and
           Q4_K (its scale products in fp16) on w4a8's kernel, Q8_0 / Q5_0 as stored and every other type
           re-rounded on w8a8-g32's, MXFP4 on its own (gguf/kept.py)
    auto   gguf for a GGUF model, none for anything else (the default)
    gptq, awq   a folder already quantized that way (its config.json's quantization_config says so and
           gives the group size and grid; such a folder loads so under auto too)

Every Linear takes the format, the LM head included (a tied embedding stays a float table for the
lookup; the head gets its own quantized copy), except that under int4 the LM head is int8: on the
default model a 4-bit head alone costs ~6% perplexity and a fifth of greedy top-1 agreement, an
8-bit one almost nothing, for 13% more bytes per token (as llama.cpp keeps its Q4 files' output
tensor at 6-8 bits); likewise mxfp4 keeps an mxfp8 head and nvfp4 an fp8 one. `layer_formats` rules
win over both for the layers they match.
"""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError

QUANTIZATIONS = ("auto", "none", "int8", "int4", "w8a8", "w4a8", "fp8", "mxfp8", "mxfp4", "nvfp4", "gguf", "gguf-a8")
GGUF_ONLY = ("gguf", "gguf-a8")  # keep a GGUF file's blocks: a GGUF model only
FLOAT_FORMATS = ("fp8", "mxfp8", "mxfp4", "nvfp4")  # each the name of its registered format
GROUPED = ("int4", "w4a8")  # take --quant-group-size and --quant-symmetric
PREQUANTIZED = ("gptq", "awq")  # folders quantized that way: their quantization_config gives group size and grid
QUANTIZATIONS += PREQUANTIZED
INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 32


def check(quantization: str, group_size: int | None, symmetric: bool) -> None:
    """Raise InvalidRequestError for a value no format takes (the per-layer shape check comes at build time)."""
    if quantization not in QUANTIZATIONS:
        raise InvalidRequestError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}",
                                  "quantization")
    if group_size is not None:
        if quantization not in GROUPED:
            raise InvalidRequestError(f"quant_group_size applies to {' and '.join(GROUPED)} only (quantization is "
                                      f"{quantization})", "quant_group_size")
        if isinstance(group_size, bool) or group_size not in INT4_GROUP_SIZES:
            raise InvalidRequestError(f"quant_group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}, "
                                      f"got {group_size!r}", "quant_group_size")
    if symmetric and quantization in FLOAT_FORMATS:
        raise InvalidRequestError(f"quant_symmetric applies to {' and '.join(GROUPED)} only ({quantization} "
                                  "is a floating-point format: symmetric, no zero point)", "quant_symmetric")
    if symmetric and quantization in ("auto", "none") + GGUF_ONLY:
        raise InvalidRequestError("quant_symmetric needs a quantization (int8 and w8a8 are always symmetric; int4 "
                                  "and w4a8 are asymmetric unless this is set; gguf keeps the file's grids)",
                                  "quant_symmetric")


def format_name(quantization: str, group_size: int | None, symmetric: bool) -> str | None:
    """The weight-format registry name every Linear takes, or None (dense in the engine dtype)."""
    if quantization in ("int8", "w8a8") + FLOAT_FORMATS:
        return quantization
    if quantization in GROUPED + PREQUANTIZED:
        group = group_size or DEFAULT_GROUP_SIZE
        return quantization + ("-sym" if symmetric else "") + ("" if group == 32 else f"-g{group}")
    return None


HEADS = {"int4": "int8", "w4a8": "w8a8-g32", "mxfp4": "mxfp8", "nvfp4": "fp8"}  # the LM head's format where it differs from the other layers'
HEADS.update({q: "int8" for q in PREQUANTIZED})  # the float head of a GPTQ / AWQ folder: int8, as under int4


def implied_rules(quantization: str) -> tuple[tuple[str, str], ...]:
    """(glob, format) rules the quantization adds after the user's layer_formats (which match first)."""
    return (("lm_head", HEADS[quantization]),) if quantization in HEADS else ()


def resolve(quantization: str, gguf_file) -> str:
    """The quantization a model gets: auto -> gguf for a GGUF model (gguf_file: the file, or None), else none."""
    if quantization == "auto":
        return "gguf" if gguf_file is not None else "none"
    if quantization in GGUF_ONLY and gguf_file is None:
        raise InvalidRequestError(f"quantization {quantization} keeps a GGUF file's blocks, and this model is not a "
                                  f".gguf file (use {', '.join(q for q in QUANTIZATIONS if q not in GGUF_ONLY)})",
                                  "quantization")
    return quantization
