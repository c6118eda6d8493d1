"""Each technique's predicted gain on this scenario, its arithmetic, and when it is a trap."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ridgeline.advisor import speculative as sp
from ridgeline.advisor.memory import max_concurrency
from ridgeline.advisor.roofline import decode_step, kvb, network_time, prefill, step
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.units import BYTES, fmt_bytes, fmt_ratio, fmt_time
from ridgeline.advisor.workload import Workload

PREFILL_BUSY = 0.8  # target utilization of a prefill instance, so TTFT queueing stays bounded


@dataclass(frozen=True)
class Technique:
    name: str
    gain: float  # predicted factor on `metric`, > 1 is better
    metric: str
    arithmetic: str
    trap: str  # when this technique does not pay
    trap_here: bool
    advice: str = ""

    def json(self) -> dict:
        return dict(self.__dict__)


def _lower(prec: str, flops: dict) -> str | None:
    return {"fp32": "bf16", "bf16": "fp8" if "fp8" in flops else "int8", "fp16": "fp8" if "fp8" in flops else "int8",
            "fp8": "fp4" if "fp4" in flops else "int4", "int8": "int4"}.get(prec)


def weight_quant(s: Scenario) -> Technique | None:
    lower = _lower(s.w.weight_precision, s.hw.flops)
    if lower is None:
        return None
    pl2, C, ctx = s.pl.with_(weights=lower), s.concurrency, s.w.mean_decode_context
    t1, t2 = decode_step(s.pl, C, ctx), decode_step(pl2, C, ctx)
    w2 = Workload(**{**s.w.summary(), "weight_precision": lower})
    cap2 = max_concurrency(s.spec, s.hw, w2, s.layout.devices)
    return Technique(
        f"weight quantization {s.w.weight_precision} -> {lower}", t1.total / t2.total, "decode step time",
        f"step at batch {C:g}: {fmt_time(t1.total)} ({t1.bound}-bound) -> {fmt_time(t2.total)}; weights "
        f"{BYTES[s.w.weight_precision]:g} -> {BYTES[lower]:g} B/param; matmuls at {s.hw.compute_precision(lower)}; "
        f"KV room {s.max_conc:.0f} -> {cap2:.0f} requests",
        "compute-bound steps (batch past the ridge, prefill) gain nothing unless the chip multiplies in the lower "
        "format; 4-bit weights cost accuracy; without fused low-bit kernels dequantization eats the gain",
        t1.total / t2.total < 1.1)


def kv_quant(s: Scenario) -> Technique | None:
    lower = {"fp32": "bf16", "bf16": "fp8", "fp16": "fp8", "fp8": "int4", "int8": "int4"}.get(s.w.kv_precision)
    if lower is None:
        return None
    C, ctx = s.concurrency, s.w.mean_decode_context
    t1, t2 = decode_step(s.pl, C, ctx), decode_step(s.pl.with_(kv=lower), C, ctx)
    w2 = Workload(**{**s.w.summary(), "kv_precision": lower})
    cap2 = max_concurrency(s.spec, s.hw, w2, s.layout.devices)
    if s.max_conc > 0:
        cap_gain = cap2 / s.max_conc
    else:  # no request fits now: from none to some has no finite ratio; from none to none is no gain
        cap_gain = float("inf") if cap2 > 0 else 1.0
    bound = C > s.max_conc
    g = cap_gain if bound else t1.total / t2.total
    kv_share = C * ctx * kvb(s.pl) / t1.bytes
    return Technique(
        f"KV cache quantization {s.w.kv_precision} -> {lower}", g,
        "concurrency that fits" if bound else "decode step time",
        f"KV is {kv_share:.0%} of the bytes a decode step reads; step {fmt_time(t1.total)} -> {fmt_time(t2.total)}; "
        f"KV room {s.max_conc:.0f} -> {cap2:.0f} requests at context {s.w.context}"
        + ("; the weights leave no memory for KV at any KV precision" if cap2 == 0 else ""),
        "short contexts, where the KV is a small share of the bytes read next to the weights; low-bit KV costs "
        "accuracy on long-range recall", g < 1.1)


def speculative(s: Scenario) -> Technique:
    a, k, c = s.sd.alpha, s.sd.k, s.sd.cost
    C, ctx = s.concurrency, s.w.mean_decode_context
    E = sp.expected_tokens(a, k)
    g = sp.gain(s.pl, C, ctx, a, k, c)
    be = sp.break_even_batch(s.pl, ctx, a, k, c)
    kb, gb = sp.best_k(s.pl, C, ctx, a, c)
    return Technique(
        f"speculative decoding (alpha {a:g}, k {k}, draft cost {c:g})", g, "decode tokens/s per sequence",
        f"E = (1 - a^(k+1)) / (1 - a) = {E:.2f} tokens/pass; batch 1: E / (1 + c k) = "
        f"{fmt_ratio(sp.batch1_gain(a, k, c))}; at batch {C:g}: E t(B) / (t_verify(B (k+1)) + c k t(B)) = "
        f"{fmt_ratio(g)}; "
        + (f"pays up to batch {be:.0f}" if be else "never pays here"),
        "batches near or past the ridge (verification then costs ~k+1 steps), low acceptance (unlike draft "
        "and target, high temperature)", g < 1.05,
        f"best k at batch {C:g}: {kb} ({fmt_ratio(gb)})")


def prefix_cache(s: Scenario) -> Technique:
    f, P = s.w.prefix_share, s.w.prompt_len
    t1 = prefill(s.pl, P).total
    t2 = prefill(s.pl, (1 - f) * P, f * P).total
    return Technique(
        f"prefix caching (f = {f:g})", t1 / t2, "prefill time (TTFT)",
        f"prefill {P} tokens {fmt_time(t1)} -> new (1 - f) P = {(1 - f) * P:.0f} tokens {fmt_time(t2)}; "
        f"gain ~ 1 / (1 - f) when compute-bound",
        "little shared prefix (f near 0: gain ~ 1); cached blocks compete with running requests for KV room",
        f < 0.1)


def chunked_prefill(s: Scenario) -> Technique:
    C, P, O, S = s.concurrency, s.w.prompt_len, s.w.output_len, s.chunk
    ctx, sv = s.w.mean_decode_context, s.serving
    mixed = step(s.pl, C + S, C * ctx + S * S / 2, C * ctx * kvb(s.pl), C).total
    extra = math.ceil(P / S) * max(0.0, mixed - sv.step_s)  # the chunks ride in decode steps
    tpot2 = sv.step_s + C * extra / O
    return Technique(
        f"chunked prefill ({S}-token chunks)", sv.tpot_contended / tpot2, "TPOT under load",
        f"TPOT {fmt_time(sv.tpot_contended)} (step {fmt_time(sv.step_s)} + C * prefill / O) -> {fmt_time(tpot2)}; "
        f"worst gap between tokens {fmt_time(sv.step_s + sv.prefill_s)} -> {fmt_time(mixed)}; "
        f"TTFT {fmt_time(sv.ttft)} -> ~{fmt_time(math.ceil(P / S) * mixed)}",
        "short prompts (nothing to split) or no TPOT SLO; TTFT grows to ceil(P / chunk) mixed steps",
        P <= S or sv.tpot_contended / tpot2 < 1.1)


def moe(s: Scenario) -> Technique:
    C, spec = s.concurrency, s.spec
    if not spec.is_moe:
        frac = 1 - (1 - 2 / 8) ** C
        return Technique(
            "MoE (a model choice)", 1.0, "n/a for a dense model",
            f"an 8-expert top-2 MoE of the same total size touches 1 - (6/8)^B = {frac:.0%} of its experts per "
            f"step at batch {C:g}", "all experts must be resident (memory of the total size); at large batch every "
            "expert is read each step, so only the FLOPs shrink, not the bytes", frac > 0.9)
    total, read = spec.num_params, spec.params_read(C)
    touched = spec.experts_touched(C)
    return Technique(
        "MoE (this model is one)", total / read, "bytes per decode step vs a dense model of equal size",
        f"batch {C:g} touches E (1 - (1 - k/E)^B) = {touched:.1f} of {spec.num_experts} experts per layer: "
        f"reads {read / 1e9:.1f}e9 of {total / 1e9:.1f}e9 params; FLOPs/token use {spec.active_params / 1e9:.1f}e9",
        "memory holds every expert; at large batch all experts are touched and the byte saving vanishes; "
        "expert parallelism adds two all-to-alls per MoE layer", total / read < 1.5)


def tensor_parallel(s: Scenario) -> Technique | None:
    tp2 = s.pl.tp * 2
    if tp2 > s.hw.devices_per_node or s.spec.num_heads % tp2 or s.hw.kind == "cpu":
        return None
    C, ctx = s.concurrency, s.w.mean_decode_context
    t1, t2 = decode_step(s.pl, C, ctx).total, decode_step(s.pl.with_(tp=tp2), C, ctx).total
    net = network_time(s.pl.with_(tp=tp2), C)
    return Technique(
        f"tensor parallelism TP{s.pl.tp} -> TP{tp2}", t1 / t2, "per-token latency (TPOT)",
        f"step {fmt_time(t1)} -> {fmt_time(t2)} incl. {fmt_time(net)} of all-reduces over {s.hw.link}; "
        f"throughput per device {fmt_ratio(t1 / t2 / 2)}",
        "PCIe-only links, small models (all-reduce latency ~ the step), across nodes; doubles devices for < 2x",
        t1 / t2 < 1.2, "")


def disaggregation(s: Scenario) -> Technique:
    sv, w, C = s.serving, s.w, s.concurrency
    g = sv.tpot_contended / sv.tpot
    kv_req = w.prompt_len * kvb(s.pl)
    rate = C / sv.request_s
    x = max(1, math.ceil(rate * sv.prefill_s / PREFILL_BUSY))
    room = min(_slo_concurrency(s), s.max_conc)
    y = max(1, math.ceil(C / max(1.0, room)))
    measured = _measured_transfer(s)
    if s.hw.link_bw:
        xfer = kv_req / s.hw.link_bw
        moved = f"KV moved per request {fmt_bytes(kv_req)} in {fmt_time(xfer)} over {s.hw.link}"
    elif measured is not None:  # this machine: processes on one host, the cost `bench disagg` measured
        xfer = measured[0]
        moved = f"KV moved per request {fmt_bytes(kv_req)} in {fmt_time(xfer)} ({measured[1]}, measured here)"
    else:  # nothing to move the KV over: disaggregation cannot run here
        xfer = math.inf
        moved = f"KV per request {fmt_bytes(kv_req)}, but {s.hw.name} has no link between devices to move it over"
    trap = g < 1.2 or rate * sv.prefill_s < 0.2 or xfer > sv.prefill_s or room < 1
    advice = (f"{x}P{y}D: {x} prefill instance(s) at <= {PREFILL_BUSY:.0%} busy, {y} decode instance(s) holding "
              f"<= {room:.0f} requests each (TPOT SLO and KV room), each instance {s.layout.describe()}"
              if room >= 1 else f"a decode instance of {s.layout.describe()} holds no request: fix capacity first")
    return Technique(
        "prefill/decode disaggregation", g, "TPOT under load",
        f"decode no longer stalls for prefills: TPOT {fmt_time(sv.tpot_contended)} -> {fmt_time(sv.tpot)}; "
        f"{moved}; prefill load "
        f"rate * t_prefill = {rate:.2f}/s * {fmt_time(sv.prefill_s)} = {rate * sv.prefill_s:.2f} instances",
        "low traffic (prefill instances idle), short prompts (little interference), slow links (KV transfer "
        "costs more than it saves)", trap, advice)


def _measured_transfer(s: Scenario) -> tuple[float, str] | None:
    """(seconds to move one prompt's KV, connector) measured on this machine, for --hardware local only."""
    if not s.hw.name.startswith("local"):
        return None
    from ridgeline.advisor import transfer_profile
    from ridgeline.advisor.transfer_profile import measured_cost
    cost = measured_cost(s)
    return None if cost is None else (transfer_profile.seconds(cost, s.w.prompt_len), cost["connector"])


def _slo_concurrency(s: Scenario) -> float:
    """Largest decode batch whose step meets the TPOT SLO (1 if none does)."""
    lo, hi = 1, 1 << 14
    if decode_step(s.pl, lo, s.w.mean_decode_context).total > s.w.tpot_slo:
        return 1.0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = decode_step(s.pl, mid, s.w.mean_decode_context).total <= s.w.tpot_slo
        lo, hi = (mid, hi) if ok else (lo, mid)
    return float(lo)


def ranked(s: Scenario) -> list[Technique]:
    found = [t(s) for t in (weight_quant, kv_quant, speculative, prefix_cache, chunked_prefill, moe,
                            tensor_parallel, disaggregation)]
    return sorted((t for t in found if t), key=lambda t: (not t.trap_here, t.gain), reverse=True)

