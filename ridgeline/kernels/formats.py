"""The weight-format codes of the C kernels: one table, read by Python and written out for C.

A linear's C descriptor is [code, data, scale, bias] (kernels/stack_linear.c); the code names a row
here: the matmul kernel that runs it and that kernel's parameter (int4 group size, fp8 mode, fp4
block) and symmetry. `kernels/formats.h` is generated from this table (`python -m
ridgeline.kernels.formats` writes it); the build refuses a header that no longer matches, and
stack_linear.c dispatches through the header's table, so Python and C cannot disagree on a code.
A new format on an existing kernel is one row here; a new kernel is a row, a `KERNELS` entry and
its case in stack_linear.c.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# the matmul kernels stack_linear.c dispatches to (C: WK_<NAME>), in their enum order (0 = none)
KERNELS = ("f32", "bf16", "i8", "i8g32", "i4", "w8a8", "w8a8g32", "w4a8", "fp8", "fp4", "i5", "i6", "iq4", "kq", "i4k", "i5k",
           "split")


@dataclass(frozen=True)
class WeightCode:
    code: int  # the descriptor's format field
    name: str  # C: WF_<NAME>
    kernel: str  # one of KERNELS
    param: int = 0  # int4 / w4a8: group size; fp8: mode (gemm_fp8.c); fp4: block
    sym: bool = False  # int4 / w4a8: symmetric (no minimum)


def _int4_rows(base: int, kernel: str) -> list[WeightCode]:
    return [WeightCode(base + 3 * sym + i, f"{kernel}{'_sym' if sym else ''}_g{g}", kernel, g, bool(sym))
            for sym in (0, 1) for i, g in enumerate((32, 64, 128))]


TABLE: tuple[WeightCode, ...] = (
    WeightCode(1, "f32_packed", "f32"),  # fp32, kernels/gemm_packed.c
    WeightCode(2, "bf16_packed", "bf16"),
    WeightCode(3, "i8_packed", "i8"),  # int8 per channel, gemm_int8.c
    *_int4_rows(4, "i4"),  # group-wise int4, gemm_int4.c: codes 4..9
    WeightCode(10, "w8a8", "w8a8"),  # int8 against int8 activations, gemm_a8.c
    *_int4_rows(11, "w4a8"),  # int4 against int8 activations, gemm_a8.c: codes 11..16
    WeightCode(40, "fp8_e4m3", "fp8", 0),  # gemm_fp8.c, its mode order
    WeightCode(41, "fp8_e5m2", "fp8", 1),
    WeightCode(42, "mxfp8", "fp8", 2),
    WeightCode(43, "mxfp4", "fp4", 32),  # gemm_fp4.c: E2M1 in blocks of 32 (E8M0 scales) or 16 (E4M3)
    WeightCode(44, "nvfp4", "fp4", 16),
    WeightCode(45, "i8_g32", "i8g32"),  # int8, an fp16 scale per 32 k (GGUF Q8_0's grid), gemm_int8_g32.c
    WeightCode(46, "w8a8_g32", "w8a8g32"),  # the same grid against int8 activations, gemm_a8.c
    WeightCode(47, "i5_g32", "i5", 32),  # 5-bit, an fp16 scale and minimum per 32 k (Q5_1's grid), gemm_int5.c
    WeightCode(48, "i5_sym_g32", "i5", 32, True),  # 5-bit, an fp16 scale per 32 k, zero 16 (Q5_0's grid)
    WeightCode(49, "i6_q6k", "i6", 16, True),  # 6-bit, zero 32, int8 scales per 16 k by fp16 per 256 (Q6_K), gemm_int6.c
    WeightCode(50, "iq4_nl", "iq4", 32),  # IQ4_NL's table of 16 values, an fp16 scale per 32 k, gemm_iq4.c
    WeightCode(51, "iq4_xs", "iq4", 256),  # the same values, int8 scales per 32 k by fp16 per 256 (IQ4_XS)
    WeightCode(52, "q3_k", "kq", 3),  # Q3_K's grid: 3 bits, int8 scales per 16 k by fp16 per 256, gemm_kq.c
    WeightCode(53, "q2_k", "kq", 2),  # Q2_K's grid: 2 bits, 4-bit scales and minimums per 16 k by fp16 per 256
    WeightCode(54, "i4_k", "i4k", 32),  # Q4_K's grid: 4 bits, 6-bit scales and minimums per 32 k by fp16 per 256
    WeightCode(55, "i5_k", "i5k", 32),  # Q5_K's grid: 5 bits, scales and minimums as Q4_K's (gemm_int5.c)
    # a fused projection whose shards keep different formats (a GGUF file's q/k in Q4_K beside v in Q6_K): data
    # points to [parts, then per part its columns and its own descriptor], each part run by its own row
    WeightCode(56, "split", "split"),
)
BY_NAME = {c.name: c for c in TABLE}


def code_of(kernel: str, param: int = 0, sym: bool = False) -> int:
    """The code of the row that runs `kernel` with this parameter and symmetry."""
    for c in TABLE:
        if (c.kernel, c.param, c.sym) == (kernel, param, sym):
            return c.code
    raise KeyError(f"no weight-format code for kernel {kernel} (param {param}, symmetric {sym})")


def _check(table: tuple[WeightCode, ...]) -> None:
    codes, names = [c.code for c in table], [c.name for c in table]
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise ValueError("weight-format table: a code or a name appears twice")
    if any(not 0 < c.code < 256 or c.kernel not in KERNELS for c in table):
        raise ValueError("weight-format table: codes are 1..255 and kernels come from KERNELS")


HEADER = Path(__file__).with_name("formats.h")


def render_header(table: tuple[WeightCode, ...] = TABLE) -> str:
    """kernels/formats.h: the codes, the kernels and the table stack_linear.c dispatches through."""
    _check(table)
    codes = ",\n".join(f"    WF_{c.name.upper()} = {c.code}" for c in table)
    kernels = ", ".join(f"WK_{k.upper()}" for k in KERNELS)
    rows = "\n".join(f"    [WF_{c.name.upper()}] = {{WK_{c.kernel.upper()}, {c.param}, {int(c.sym)}}},"
                     for c in table)
    return f"""/* Generated by `python -m ridgeline.kernels.formats` from ridgeline/kernels/formats.py: do not
 * edit (the build refuses a header that does not match the table). */
#pragma once
#include <stdint.h>

enum weight_format {{
{codes}
}};
enum weight_kernel {{ WK_NONE, {kernels} }};
#define WF_CODES {max(c.code for c in table) + 1}

/* kernel (WK_NONE: no such code), its parameter (int4 / w4a8 group, fp8 mode, fp4 block), symmetric */
typedef struct {{
    int8_t kernel;
    int16_t param;
    int8_t sym;
}} weight_code;

static const weight_code WF_TABLE[WF_CODES] = {{
{rows}
}};

/* the row of a descriptor's format field, or NULL */
static inline const weight_code *weight_code_of(int64_t format) {{
    return format > 0 && format < WF_CODES && WF_TABLE[format].kernel != WK_NONE ? &WF_TABLE[format] : 0;
}}
"""


def stale_header() -> str | None:
    """Why the checked-in kernels/formats.h is not the table's, or None when it is."""
    try:
        if HEADER.read_text() == render_header():
            return None
    except OSError as e:
        return f"{HEADER} cannot be read ({e})"
    return (f"{HEADER} does not match ridgeline/kernels/formats.py; regenerate it with "
            f"`python -m ridgeline.kernels.formats`")


if __name__ == "__main__":
    HEADER.write_text(render_header())
    print(f"wrote {HEADER}", file=sys.stderr)
