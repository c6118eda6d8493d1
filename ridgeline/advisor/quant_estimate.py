"""`advise quant`: each weight format's memory, predicted decode speed on this scenario, and its measured
quality on the default model (quant_quality.MEASURED, the one table the console shows too)."""
from __future__ import annotations

from ridgeline.advisor.calc import Section
from ridgeline.advisor.memory import weight_bytes
from ridgeline.advisor.quant_quality import HOW, MEASURED, MODEL, REFERENCE_PPL
from ridgeline.advisor.roofline import decode_step
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.units import BYTES, fmt_bytes, fmt_num, fmt_time


def speed_section(s: Scenario) -> Section:
    C, ctx, base = s.concurrency, s.w.mean_decode_context, s.w.weight_precision
    t0 = decode_step(s.pl, C, ctx)
    sec = Section("quant_speed", f"Weight formats on {s.spec.name}, {s.layout.describe()} of {s.hw.name}: "
                                 f"decode at batch {C:g}, context {ctx:g}, against {base}")
    for q in MEASURED:
        p = q.precision
        t = decode_step(s.pl.with_(weights=p), C, ctx)
        sec.add(f"weights_{q.name}", f"{q.name}: weights ({p})", "params * B/param",
                f"{fmt_num(s.spec.num_params)} * {BYTES[p]:g}", weight_bytes(s.spec, p), "B")
        sec.add(f"step_{q.name}", f"{q.name}: decode step ({t.bound}-bound, matmuls at "
                                 f"{s.hw.compute_precision(p)})",
                "max(bytes / BW, FLOPs / F) + host", f"max({fmt_time(t.memory)}, {fmt_time(t.compute)})"
                + (f" + {fmt_time(t.overhead)}" if t.overhead and not t.overlap else "")
                + (f" + network {fmt_time(t.network)}" if t.network else ""), t.total, "s")
        sec.add(f"speedup_{q.name}", f"{q.name}: decode speed vs {base}", f"t({base}) / t({q.name})",
                f"{fmt_time(t0.total)} / {fmt_time(t.total)}", t0.total / t.total, "x")
    sec.note("bytes per parameter ignore the formats' scales (the measured MB below include them); without a "
             "matrix unit for a format the chip dequantizes to bf16 first")
    return sec


def quality_section() -> Section:
    sec = Section("quant_quality", f"Measured quality on {MODEL} ({HOW})")
    for q in MEASURED:
        sec.add(f"ppl_{q.name}", f"{q.name}: perplexity change ({q.note})", "ppl / ppl(bf16) - 1",
                f"{q.perplexity:.3f} / {REFERENCE_PPL:.3f} - 1", q.ppl_change, "%")
        sec.note(f"{q.name:>6}: {fmt_bytes(q.weights_mb * 1e6)} read per token, top-1 agreement {q.agreement:.3f}, "
                 f"KL {q.kl:.4g}")
    sec.note("measured on one small model: the ranking transfers roughly, the numbers do not (this model's "
             "matrices sit on Q4_1's grid, which flatters int4 and gguf)")
    return sec


def quant(s: Scenario):
    return [speed_section(s), quality_section()], None, None
