"""This machine's measured engine costs scaled to a chosen device table, for `advise disagg --simulate`.

`ridgeline bench disagg` measures the engine's prefill of P tokens and its decode step (batch 1 at
context c) here and stores them in the local profile. Against this machine's roofline (the local
profile's matrix rate and memory bandwidth) they give two efficiencies:
- prefill (compute-bound): roofline FLOPs / matrix rate, over the measured prefill time;
- decode (bandwidth-bound): roofline bytes / memory bandwidth, over the measured step time.
The chosen device's roofline is then priced with its matrix rates x the prefill efficiency and its
bandwidth x the decode efficiency (capped at 1: never faster than the device's own roofline).
Without a measurement the plain roofline is used, and the caller says so. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ridgeline.advisor.hardware import HardwareSpec
from ridgeline.advisor.model_spec import ModelSpec
from ridgeline.advisor.roofline import Platform, decode_step, prefill
from ridgeline.advisor.units import fmt_bytes, fmt_rate, fmt_time


@dataclass(frozen=True)
class Calibration:
    prefill_eff: float
    decode_eff: float
    lines: tuple[str, ...]  # the arithmetic, for the user


def _eff(roofline_s: float, measured_s: float) -> float:
    return min(1.0, roofline_s / measured_s) if measured_s > 0 else 1.0


def calibrate(measured: dict, local: HardwareSpec, spec: ModelSpec) -> Calibration:
    """Efficiencies of the engine measured on `local` (its model `spec`) against `local`'s roofline."""
    pl = Platform(spec, local, measured["weights"], measured["kv"])
    p, d = measured["prefill"], measured["decode"]
    pre = prefill(pl, p["tokens"])
    step = decode_step(pl, d["batch"], d["context"])
    rate, bw = local.rate_at(measured["weights"], p["tokens"]), local.bandwidth
    eff_p, eff_d = _eff(pre.compute, p["wall_s"]), _eff(step.memory, d["wall_s"])
    lines = (
        f"engine measured on this machine: {measured['model']}, {measured['weights']} weights, "
        f"{measured['threads']} threads ({measured.get('measured_at', 'unknown date')}); "
        f"local roofline: {local.name}",
        f"  prefill {p['tokens']} tokens: measured {fmt_time(p['wall_s'])}; local roofline (compute-bound) "
        f"{pre.flops / 1e9:.3g} GFLOP / {fmt_rate(rate, 'FLOP/s')} = {fmt_time(pre.compute)}; "
        f"efficiency {_pct(eff_p)}",
        f"  decode step (batch {d['batch']}, context {d['context']}): measured {fmt_time(d['wall_s'])}; local "
        f"roofline (bandwidth-bound) {fmt_bytes(step.bytes)} / {fmt_rate(bw, 'B/s')} = {fmt_time(step.memory)}; "
        f"efficiency {_pct(eff_d)}")
    return Calibration(eff_p, eff_d, lines)


def _pct(x: float) -> str:
    return f"{x:.1%}" + (" (capped at 100%)" if x >= 1.0 else "")


def scaled_hardware(hw: HardwareSpec, cal: Calibration) -> HardwareSpec:
    """`hw` with its matrix rates x the prefill efficiency and its memory bandwidth x the decode one."""
    p, d = cal.prefill_eff, cal.decode_eff
    return replace(hw, name=f"{hw.name}, scaled", bandwidth=hw.bandwidth * d,
                   flops={k: v * p for k, v in hw.flops.items()},
                   gemm_curve={k: {m: r * p for m, r in c.items()} for k, c in hw.gemm_curve.items()},
                   weight_stream_bw={k: v * d for k, v in hw.weight_stream_bw.items()})


def scaling_lines(pl: Platform, scaled: Platform, cal: Calibration, prompt: int, context: float) -> list[str]:
    """The device's roofline before and after scaling, on the trace's mean prompt and decode context."""
    hw, w = pl.hw, pl.weights
    return [f"  {hw.name}: matrix rate {fmt_rate(hw.rate(w), 'FLOP/s')} x {cal.prefill_eff:.1%} = "
            f"{fmt_rate(scaled.hw.rate(w), 'FLOP/s')}; bandwidth {fmt_rate(hw.bandwidth, 'B/s')} x "
            f"{cal.decode_eff:.1%} = {fmt_rate(scaled.hw.bandwidth, 'B/s')}",
            f"  prefill {prompt} tokens: device roofline {fmt_time(prefill(pl, prompt).total)} -> scaled "
            f"{fmt_time(prefill(scaled, prompt).total)}; decode step (batch 1, context {context:.0f}): "
            f"{fmt_time(decode_step(pl, 1, context).total)} -> {fmt_time(decode_step(scaled, 1, context).total)}"]


def _local_hardware(threads: int) -> HardwareSpec:
    """The local profile at the thread count the engine was measured with (measured once if not cached)."""
    import torch

    from ridgeline.advisor.local_profile import local_hardware

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return local_hardware()
    finally:
        torch.set_num_threads(before)


def calibrated_platform(pl: Platform, measured: dict | None, prompt: int, context: float) -> tuple[Platform, list[str]]:
    """(`pl` on its device scaled by this machine's engine efficiencies, the arithmetic); `pl` itself and a
    note when the engine was not measured here."""
    from ridgeline.advisor.model_config import resolve_spec
    from ridgeline.errors import RidgelineError

    plain = f"priced with {pl.hw.name}'s plain roofline"
    if not measured:
        return pl, [f"engine costs: not measured on this machine, so prefill and decode are {plain} "
                    "(`ridgeline bench disagg` measures them and stores them in the local profile)"]
    try:
        spec = resolve_spec(measured["model"])
    except RidgelineError as e:
        return pl, [f"engine costs: the measured model {measured['model']} cannot be read ({e.message}), so "
                    f"prefill and decode are {plain}"]
    cal = calibrate(measured, _local_hardware(measured["threads"]), spec)
    scaled = pl.with_(hw=scaled_hardware(pl.hw, cal))
    return scaled, [*cal.lines, *scaling_lines(pl, scaled, cal, prompt, context)]
