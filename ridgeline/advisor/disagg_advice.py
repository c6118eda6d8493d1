"""What `advise disagg` adds from measurements: this machine's KV transfer cost per token (`ridgeline
bench disagg`), the last measured 1P1D vs co-located goodput explained with the step model, and the
--simulate and --validate modes."""
from __future__ import annotations

import argparse
import math

from ridgeline.advisor import transfer_profile as tp
from ridgeline.advisor.calc import Section
from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.memory import kv_bytes_per_token
from ridgeline.advisor.roofline import decode_step, prefill
from ridgeline.advisor.units import fmt_bytes, fmt_time


def add_disagg_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("disaggregation: measured costs")
    g.add_argument("--simulate", default=None, metavar="TRACE",
                   help="replay a JSONL trace (arrival s, prompt_tokens, output_tokens per line) against co-located "
                        "and xPyD deployments on --hardware; name the fewest devices meeting both SLOs (default: none)")
    g.add_argument("--slo-attainment", type=float, default=0.9, metavar="F",
                   help="--simulate: fraction of requests that must meet both SLOs")
    g.add_argument("--max-instances", type=int, default=8, metavar="N", help="--simulate: instances tried at most")
    g.add_argument("--validate", dest="disagg_validate", action="store_true",
                   help="measure KV transfers now and print them beside the profile's prediction")
    g.add_argument("--connector", default=None, choices=["shm", "tcp"],
                   help="the measured connector to use (default: the cheaper one)")


def measured_sections(s, connector: str | None = None) -> list[Section]:
    out = []
    cost = tp.measured_cost(s, connector)
    sec = Section("disagg_transfer", "KV transfer measured on this machine")
    if cost is None:
        sec.note("not measured yet: `ridgeline bench disagg` measures it (shm and tcp, bf16 and int8) and stores it "
                 f"in {tp.profile_path()}")
        return [sec]
    P = s.w.prompt_len
    xfer = tp.seconds(cost, P)
    sec.add("transfer_per_token", f"per token ({cost['connector']}, {s.w.kv_precision} KV, this model's "
            f"{fmt_bytes(kv_bytes_per_token(s.spec, s.w.kv_precision))}/token)", "measured slope, rescaled by bytes",
            "", cost["per_token_s"], "s")
    sec.add("transfer_request", f"one {P}-token prompt", "fixed + per token x P",
            f"{fmt_time(cost['fixed_s'])} + {fmt_time(cost['per_token_s'])} x {P}", xfer, "s")
    pre = s.serving.prefill_s
    sec.note(f"against its prefill ({fmt_time(pre)} on {s.hw.name}): the transfer is {xfer / pre:.1%} of it; "
             + ("cheap enough to pay for itself" if xfer < 0.1 * pre else "a large share: disaggregation loses here"))
    out.append(sec)
    good = (tp.load() or {}).get("goodput")
    if good:
        out.append(goodput_section(s, good, cost))
    return out


def goodput_section(s, g: dict, cost: dict) -> Section:
    """The measured 1P1D vs co-located rows, and the step model's account of them on `s.hw`."""
    sec = Section("disagg_goodput", f"Measured goodput, {g['prompt_len']}-token prompts at {g['request_rate']:g}/s "
                  f"({g['load_note']}, {g['measured_at']})")
    for r in g["rows"]:
        sec.note(f"{r['deployment']:>22}: goodput {r['goodput_rps']:.3f}/s ({r['good']} good), TTFT p50 "
                 f"{r['ttft_p50_s']:.2f}s, TPOT p50 {r['tpot_p50_s'] * 1e3:.0f} ms, p90 {r['tpot_p90_s'] * 1e3:.0f} ms")
    P, O, rate = g["prompt_len"], g["output_len"], g["request_rate"]
    pre = prefill(s.pl, P).total
    step = decode_step(s.pl, 1, P + O / 2).total
    per_replica = rate / 2
    conc = max(1.0, per_replica * (pre + O * step))
    contended = step + conc * pre / O
    sec.note(f"why (step model on {s.hw.name}, per engine): prefill {fmt_time(pre)}, decode step {fmt_time(step)}")
    sec.note(f"co-located: each replica gets {per_replica:g}/s and runs each prefill between its decode steps, so "
             f"TPOT ~ step + C x prefill / O = {fmt_time(step)} + {conc:.2f} x {fmt_time(pre)} / {O} = "
             f"{fmt_time(contended)} (SLO {fmt_time(g['tpot_slo_s'])})")
    busy = rate * pre
    sec.note(f"1P1D: decode never waits for a prefill, TPOT ~ step = {fmt_time(step)}; the one prefill worker is "
             f"busy rate x prefill = {busy:.0%} of the time" + (" (saturated: TTFT grows without bound)" if busy >= 1
                                                                  else "") +
             f", and each request adds a transfer of {fmt_time(tp.seconds(cost, P))} to its TTFT")
    return sec


def run_disagg_extra(args, scenario) -> int:
    if args.disagg_validate:
        return validate(args, scenario)
    return simulate(args, scenario)


def simulate(args, s) -> int:
    from ridgeline.advisor.disagg_sim import Costs, load_trace, search
    from ridgeline.advisor.engine_calibration import calibrated_platform
    from ridgeline.advisor.techniques import _slo_concurrency

    if not 0 < args.slo_attainment <= 1 or args.max_instances < 1:
        raise AdvisorError("--slo-attainment must be in (0, 1] and --max-instances >= 1")
    trace = load_trace(args.simulate)
    cost = tp.measured_cost(s, args.connector)
    fixed = cost["fixed_s"] if cost else 0.0
    kvb = kv_bytes_per_token(s.spec, s.w.kv_precision)
    if s.hw.link_bw:
        per_token, how = kvb / s.hw.link_bw, f"{fmt_bytes(kvb)}/token over {s.hw.link}"
    elif cost:
        per_token, how = cost["per_token_s"], f"this machine's measured {cost['connector']} rate"
    else:
        raise AdvisorError(f"{s.hw.name} has no link and no transfer was measured: run `ridgeline bench disagg`")
    prompt = round(sum(r.prompt for r in trace) / len(trace))
    context = prompt + sum(r.output for r in trace) / len(trace) / 2
    pl, lines = calibrated_platform(s.pl, (tp.load() or {}).get("engine"), prompt, context)
    costs = Costs(lambda p: prefill(pl, p).total, lambda b, c: decode_step(pl, b, c).total,
                  lambda p: fixed + per_token * p, max(1, int(min(_slo_concurrency(s), s.max_conc))))
    outcomes = search(trace, costs, s.layout.devices, args.max_instances)
    ttft, tpot = s.w.ttft_slo, s.w.tpot_slo
    print(f"trace {args.simulate}: {len(trace)} requests over {trace[-1].arrival:.1f}s; {s.hw.name}, each instance "
          f"{s.layout.describe()}; transfer {fmt_time(fixed)} + P x {fmt_time(per_token)} ({how}); SLO TTFT "
          f"{fmt_time(ttft)}, TPOT {fmt_time(tpot)}, attainment >= {args.slo_attainment:.0%}")
    print("\n".join(lines))
    print(f"{'deployment':>14} {'devices':>7} {'TTFT p90':>10} {'TPOT p90':>10} {'good':>6}")
    for o in outcomes:
        print(f"{o.name:>14} {o.devices:>7} {fmt_time(_p90(o.ttft)):>10} {fmt_time(_p90(o.tpot)):>10} "
              f"{o.attainment(ttft, tpot):>6.0%}")
    best = cheapest(outcomes, ttft, tpot, args.slo_attainment)
    if best is None:
        print(f"verdict: no configuration up to {args.max_instances} instances meets the SLOs")
    else:
        print(f"verdict: {best.name} meets both SLOs ({best.attainment(ttft, tpot):.0%} of requests) with the "
              f"fewest devices, {best.devices}")
    return 0


def cheapest(outcomes, ttft: float, tpot: float, attainment: float):
    """The outcome meeting the SLOs with the fewest devices (the higher attainment among equals), or None."""
    ok = [o for o in outcomes if o.attainment(ttft, tpot) >= attainment]
    return min(ok, key=lambda o: (o.devices, -o.attainment(ttft, tpot))) if ok else None


def _p90(xs: list[float]) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, math.ceil(0.9 * len(ys)) - 1)]


def validate(args, s) -> int:
    from ridgeline.measure.kv_transfer import Shape, measure

    cost = tp.measured_cost(s, args.connector)
    if cost is None:
        raise AdvisorError("no measured transfer cost for this KV precision: run `ridgeline bench disagg` first")
    kv = {"bf16": "bf16", "fp16": "bf16", "int8": "int8", "fp8": "fp8", "int4": "int4"}.get(s.w.kv_precision, "bf16")
    shape = Shape(s.spec.num_layers, s.spec.num_kv_heads, s.spec.head_dim)
    lengths = [256, 1024, 4096]
    got = measure(shape, [cost["connector"]], [kv], lengths, reps=3)[cost["connector"]][kv]
    print(f"KV transfer, {cost['connector']}, {kv} KV, {s.spec.name}: predicted from the profile vs measured now")
    for n, measured in got["points"]:
        pred = tp.seconds(cost, n)
        print(f"  {n:>6} tokens: predicted {fmt_time(pred):>9}, measured {fmt_time(measured):>9}, "
              f"ratio {measured / pred:.2f}")
    return 0
