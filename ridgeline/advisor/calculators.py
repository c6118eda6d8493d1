"""The single-question calculators: `advise kv`, `advise gpus`, `advise spec`, `advise disagg`, `advise quant`."""
from __future__ import annotations

from ridgeline.advisor import speculative as sp
from ridgeline.advisor.calc import Section
from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.memory import kv_bytes_per_token, memory_section, weight_bytes
from ridgeline.advisor.parallel import check_fits, choose_layout
from ridgeline.advisor.quant_estimate import quant
from ridgeline.advisor.pipeline import pipeline_section
from ridgeline.advisor.report import model_section, parallel_section
from ridgeline.advisor.roofline import decode_step, verify_step
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.techniques import chunked_prefill, disaggregation
from ridgeline.advisor.units import fmt_bytes, fmt_ratio, fmt_time
from ridgeline.advisor.workload import Workload

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def kv(s: Scenario):
    sec = Section("kv_by_context", "Maximum concurrency by context length (requests that fit in the KV room)")
    free = s.layout.devices * s.hw.usable_memory - weight_bytes(s.spec, s.w.weight_precision)
    precs = [p for p in ("bf16", "fp8", "int4") if p != s.w.kv_precision]
    for ctx in (c for c in CONTEXTS if c <= s.spec.max_context):
        cells = []
        for p in (s.w.kv_precision, *precs):
            per = ctx * kv_bytes_per_token(s.spec, p)
            cells.append(f"{p} {max(free, 0) / per:,.1f} ({fmt_bytes(per)} each)")
        sec.note(f"context {ctx:>6}: " + ", ".join(cells))
    return [model_section(s), memory_section(s.spec, s.hw, s.w, s.layout.devices, s.concurrency), sec], None, None


def gpus(s: Scenario):
    sec = Section("gpus_by_precision", f"Devices by weight precision ({s.hw.name})")
    for prec in ("fp32", "bf16", "fp8", "int4"):
        w = Workload(**{**s.w.summary(), "weight_precision": prec})
        try:
            n = check_fits(s.spec, s.hw, w, s.concurrency)
        except AdvisorError:
            sec.note(f"{prec:>5}: weights {fmt_bytes(weight_bytes(s.spec, prec))}: does not fit on any count")
            continue
        layout = choose_layout(s.spec, s.hw, w, n, s.concurrency)
        sec.add(f"min_{prec}", f"{prec}: minimum by capacity, deployed as {layout.describe()}",
                "ceil((weights + KV) / usable memory)", f"ceil(({fmt_bytes(weight_bytes(s.spec, prec))} + KV) / "
                f"{fmt_bytes(s.hw.usable_memory)})", n, "devices")
    sections = [memory_section(s.spec, s.hw, s.w, s.layout.devices, s.concurrency), parallel_section(s),
                pipeline_section(s), sec]
    return [x for x in sections if x is not None], None, None


def spec(s: Scenario):
    a, k, c = s.sd.alpha, s.sd.k, s.sd.cost
    ctx = s.w.mean_decode_context
    sec = Section("speculative", f"Speculative decoding: alpha {a:g}, k {k}, draft cost c {c:g}")
    E = sec.add("expected_tokens", "expected tokens per verification pass", "E = (1 - alpha^(k+1)) / (1 - alpha)",
                f"(1 - {a:g}^{k + 1}) / (1 - {a:g})", sp.expected_tokens(a, k), "tokens")
    sec.add("batch1_gain", "gain when verification costs one step (batch 1, bandwidth-bound)", "E / (1 + c k)",
            f"{E:.3g} / (1 + {c:g} * {k})", sp.batch1_gain(a, k, c), "x")
    be = sp.break_even_batch(s.pl, ctx, a, k, c)
    sec.add("break_even_batch", "largest batch where it still pays", "max B with E t(B) / (t_verify + c k t(B)) >= 1",
            "", be if be is not None else 0, "sequences")
    if be is not None and be >= 1 << 14:
        sec.note("it never collapses here: at this context the KV reads keep plain decode steps bandwidth-bound "
                 "while verification shares each sequence's KV read among k + 1 tokens")
    if s.ridge:
        sec.note(f"ridge batch {s.ridge:.0f}: once B (k+1) = {k + 1} B passes it, verification costs ~k+1 steps")
    for r in spec_curve(s, SPEC_BATCHES):
        sec.note(f"batch {r['batch']:>3}: step {fmt_time(r['step']):>9}, verify {k + 1} tokens/seq "
                 f"{fmt_time(r['verify']):>9}, gain {fmt_ratio(r['gain'])}; best k {r['best_k']} -> "
                 f"{fmt_ratio(r['best_gain'])}")
    return [sec], None, None


SPEC_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def spec_curve(s: Scenario, batches) -> list[dict]:
    """Speculation by batch size: plain step, verification step, gain at k, and the best k."""
    a, k, c, ctx = s.sd.alpha, s.sd.k, s.sd.cost, s.w.mean_decode_context
    rows = []
    for b in batches:
        kb, gb = sp.best_k(s.pl, b, ctx, a, c)
        rows.append({"batch": b, "step": decode_step(s.pl, b, ctx).total, "verify": verify_step(s.pl, b, ctx, k).total,
                     "gain": sp.gain(s.pl, b, ctx, a, k, c), "best_k": kb, "best_gain": gb})
    return rows


def disagg(s: Scenario):
    sv, w = s.serving, s.w
    sec = Section("disagg", "Prefill/decode disaggregation")
    sec.add("prefill", f"prefill of {w.prompt_len} tokens", "roofline", "", sv.prefill_s, "s")
    sec.add("tpot", f"TPOT at concurrency {s.concurrency:g}, decode alone", "decode step", "", sv.tpot, "s")
    sec.add("tpot_contended", "TPOT with prefills interleaved", "step + C * prefill / output",
            f"{fmt_time(sv.step_s)} + {s.concurrency:g} * {fmt_time(sv.prefill_s)} / {w.output_len}",
            sv.tpot_contended, "s")
    d, ch = disaggregation(s), chunked_prefill(s)
    verdict = ("justified" if not d.trap_here else "not justified") + f": {fmt_ratio(d.gain)} TPOT"
    if d.trap_here:
        verdict += "; try chunked prefill first" if not ch.trap_here else ""
    sec.note(f"verdict: {verdict} (TPOT SLO {fmt_time(w.tpot_slo)})")
    from ridgeline.advisor.disagg_advice import measured_sections
    return [sec, *measured_sections(s)], None, [d.json(), ch.json()]


CALCULATORS = {"kv": kv, "gpus": gpus, "spec": spec, "disagg": disagg, "quant": quant}
