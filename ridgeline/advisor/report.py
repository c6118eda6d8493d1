"""The report sections, each value with its formula and numbers (text for people, --json for machines)."""
from __future__ import annotations

from ridgeline.advisor.calc import Section
from ridgeline.advisor.diagnose import diagnose
from ridgeline.advisor.memory import memory_section
from ridgeline.advisor.roofline import crossover_len, decode_step, kvb, prefill
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.techniques import ranked
from ridgeline.advisor.units import finite_or_none, fmt_bytes, fmt_num, fmt_rate, fmt_ratio, fmt_time, nbytes

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def model_section(s: Scenario) -> Section:
    m = s.spec
    sec = Section("model", f"Model: {m.name}")
    sec.add("params", "parameters", "layers * (attention + MLP/experts + norms) + embeddings",
            f"{m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size}", m.num_params, "params")
    if m.is_moe:
        sec.add("active_params", "active parameters", f"top-{m.experts_per_token} of {m.num_experts} experts",
                "", m.active_params, "params")
    sec.note(f"layers {m.num_layers}, hidden {m.hidden_size}, heads {m.num_heads}, KV heads {m.num_kv_heads} "
             f"(GQA {m.num_heads // m.num_kv_heads}:1), head dim {m.head_dim}, vocab {m.vocab_size}, "
             f"max context {m.max_context}" + (", MLA latent KV" if m.mla else ""))
    h = s.hw
    sec.note(f"hardware {h.name}: {fmt_bytes(h.memory)}, {fmt_bytes(h.bandwidth)}/s, "
             + ", ".join(f"{k} {fmt_rate(v, 'FLOP/s')}" for k, v in h.flops.items())
             + f"; link {h.link}" + (f" {fmt_bytes(h.link_bw)}/s" if h.link_bw else "") + f" ({h.source})")
    return sec


def parallel_section(s: Scenario) -> Section:
    sec = Section("parallelism", f"Devices: {s.layout.describe()}")
    sec.add("needed", "devices capacity requires", "see memory: ceil((weights + KV) / usable)", "", s.needed, "devices")
    sec.add("deployed", "devices in the layout", "tp * pp", f"{s.layout.tp} * {s.layout.pp}", s.layout.devices,
            "devices")
    sec.note(s.layout.reason)
    return sec


def time_section(s: Scenario) -> Section:
    pl, m, w, C = s.pl, s.spec, s.w, s.concurrency
    ctx = w.mean_decode_context
    F, BW, tp = pl.rate, pl.hw.bandwidth, pl.tp
    sec = Section("time", f"Time: roofline at {s.hw.compute_precision(w.weight_precision)} "
                          f"{fmt_rate(F, 'FLOP/s')}, {fmt_bytes(BW)}/s per device, {tp} device(s) per layer")
    wb = m.params_read(1) * nbytes(w.weight_precision)
    sec.add("weights_read_b1", "weights read per decode step (batch 1)", "params read * bytes",
            f"{fmt_num(m.params_read(1))} * {nbytes(w.weight_precision):g}", wb, "B")
    sec.add("decode_floor_b1", "batch-1 decode floor", "weights / (devices * bandwidth)",
            f"{fmt_bytes(wb)} / ({tp} * {fmt_bytes(BW)}/s)", wb / (tp * BW), "s")
    P2 = 2 * m.matmul_params
    a = m.attn_flops_per_pair
    sec.add("flops_per_token", "FLOPs per decode token", "2 * matmul params + a * context",
            f"2 * {fmt_num(m.matmul_params)} + {fmt_num(a)} * {ctx:g}", P2 + a * ctx, "FLOP")
    denom = (P2 + a * ctx) / F - ctx * kvb(pl) / BW
    sec.add("ridge_batch", "ridge batch size (decode turns compute-bound)",
            "B* = (W / BW) / ((2P + a c) / F - c * KV/token / BW)" + (" [MoE: solved numerically]" if m.is_moe else ""),
            f"({fmt_bytes(wb)} / {fmt_bytes(BW)}/s) / (({fmt_num(P2 + a * ctx)}) / {fmt_rate(F, 'FLOP/s')} - "
            f"{ctx:g} * {fmt_num(kvb(pl))} / {fmt_bytes(BW)}/s)", s.ridge if s.ridge else float("inf"), "sequences")
    if denom <= 0:
        sec.note("at this context every extra sequence adds more KV bytes than FLOPs: decode never leaves the "
                 "bandwidth roof")
    elif not s.ridge:
        sec.note("no batch size up to 2^20 makes decode compute-bound here")
    for b in BATCHES:
        t = decode_step(pl, b, ctx)
        sec.note(f"decode batch {b:>3}: step {fmt_time(t.total):>9} ({t.bound}-bound, memory {fmt_time(t.memory)}, "
                 f"compute {fmt_time(t.compute)}" + (f", network {fmt_time(t.network)}" if t.network else "")
                 + (f", host {fmt_time(t.overhead)}" if t.overhead else "") + f") -> {b / t.total:,.0f} tok/s")
    n = w.prompt_len
    pf = prefill(pl, n)
    sec.add("prefill_flops", f"prefill FLOPs ({n} tokens)", "2 P n + a n^2 / 2",
            f"2 * {fmt_num(m.matmul_params - m.vocab_size * m.hidden_size)} * {n} + {fmt_num(a)} * {n}^2 / 2",
            pf.flops, "FLOP")
    sec.add("prefill_time", f"prefill time ({pf.bound}-bound)", "max(FLOPs / (devices F), bytes / (devices BW))",
            f"max({fmt_num(pf.flops)} / {fmt_rate(tp * F, 'FLOP/s')}, {fmt_bytes(pf.bytes)} / "
            f"{fmt_bytes(tp * BW)}/s)", pf.total, "s")
    sec.add("prefill_tok_s", "prefill tokens/s", "n / prefill time", f"{n} / {fmt_time(pf.total)}",
            n / pf.total, "tok/s")
    sec.add("attn_crossover", "prompt length where attention FLOPs overtake linear", "n* = 4 P / a",
            f"4 * {fmt_num(m.matmul_params - m.vocab_size * m.hidden_size)} / {fmt_num(a)}", crossover_len(m), "tokens")
    sv = s.serving
    conc = f"{C:g}" + (f" (from rate {w.rate:g}/s by Little's law)" if w.rate else "")
    sec.add("ttft", f"TTFT ({'ok' if sv.ttft <= w.ttft_slo else 'MISSES'} SLO {fmt_time(w.ttft_slo)})",
            "prefill + one decode step in flight", f"{fmt_time(sv.prefill_s)} + {fmt_time(sv.step_s)}", sv.ttft, "s")
    sec.add("tpot", f"TPOT alone at concurrency {conc}", "decode step at batch C", "", sv.tpot, "s")
    sec.add("tpot_contended", f"TPOT with prefills interleaved "
                              f"({'ok' if sv.tpot_contended <= w.tpot_slo else 'MISSES'} SLO {fmt_time(w.tpot_slo)})",
            "step + C * prefill / output", f"{fmt_time(sv.step_s)} + {C:g} * {fmt_time(sv.prefill_s)} / "
            f"{w.output_len}", sv.tpot_contended, "s")
    sec.add("throughput", "output throughput", "C * output / (TTFT + output * TPOT)",
            f"{C:g} * {w.output_len} / {fmt_time(sv.request_s)}", sv.throughput, "tok/s")
    return sec


def full_report(s: Scenario) -> tuple[list[Section], dict, list]:
    from ridgeline.advisor.pipeline import pipeline_section
    sections = [model_section(s), memory_section(s.spec, s.hw, s.w, s.layout.devices, s.concurrency),
                parallel_section(s), pipeline_section(s), time_section(s)]
    return [x for x in sections if x is not None], diagnose(s).json(), [t.json() for t in ranked(s)]


def render(sections: list[Section], wall: dict | None = None, techniques: list | None = None) -> str:
    out = [sec.text() for sec in sections]
    if wall:
        out.append(f"== Binding wall: {wall['name'].upper()} ==\n  {wall['reason']}")
    if techniques:
        lines = ["== Techniques, ranked by predicted gain (traps for this workload last) =="]
        for i, t in enumerate(techniques, 1):
            tag = "  TRAP HERE" if t["trap_here"] else ""
            lines.append(f"  {i}. {t['name']}: {fmt_ratio(t['gain'])} {t['metric']}{tag}")
            lines.append(f"     {t['arithmetic']}")
            if t["advice"]:
                lines.append(f"     suggestion: {t['advice']}")
            lines.append(f"     a trap when: {t['trap']}")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def as_json(s: Scenario, sections: list[Section], wall: dict | None, techniques: list | None) -> dict:
    return finite_or_none({
        "model": s.spec.summary(), "hardware": s.hw.summary(), "workload": s.w.summary(),
        "layout": {"tp": s.layout.tp, "pp": s.layout.pp, "ep": s.layout.ep, "devices": s.layout.devices,
                   "reason": s.layout.reason},
        "sections": {sec.key: sec.json() for sec in sections}, "wall": wall, "techniques": techniques})
