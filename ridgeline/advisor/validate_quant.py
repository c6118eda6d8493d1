"""`ridgeline advise --validate`: predicted vs measured batch-1 decode speed-up of int8 and int4 weights.

Each quantized engine is loaded after the main checks, alone, and timed as the main sweep times
batch-1 decode (its torch calls counted, not timed). The prediction is the same roofline step with
the weight precision changed: every weight at 1 or 0.5 bytes. The engine stores a little more (int8:
an fp32 scale per channel; int4: fp16 scales and minimums per 32, 0.625 B, and an int8 LM head), and
its kernels may not reach the bandwidth the profile measured: both show up as the error.
"""
from __future__ import annotations

import gc

from ridgeline.advisor.roofline import Platform, decode_step

FORMATS = ("int8", "int4")


def quant_rows(make_engine, pl: Platform, base_step: float, base_calls: int, ctx: int, steps: int, clock,
               decode) -> list[tuple]:
    """(label, predicted, measured, note) rows; make_engine(quantization) -> LLMEngine; decode: validate._decode;
    base_step / base_calls: the unquantized engine's measured batch-1 step and its torch calls; ctx: the
    context length the sweep decodes at."""
    base_pred = decode_step(pl.with_(ops_per_step=base_calls), 1, ctx).total
    rows = []
    for q in FORMATS:
        engine = make_engine(q)
        try:
            dt, calls, _ = decode(engine, 1, steps, 900 + FORMATS.index(q), clock)
            bytes_w = engine.info.weight_bytes
        finally:
            del engine
            gc.collect()
        pred = decode_step(pl.with_(weights=q, ops_per_step=calls), 1, ctx).total
        rows.append((f"batch-1 decode speed-up, {q} (x)", base_pred / pred, base_step / dt,
                     f"{bytes_w / 1e6:.0f} MB of linear weights stored; predicted at "
                     f"{1 if q == 'int8' else 0.5} B a weight"))
    return rows
