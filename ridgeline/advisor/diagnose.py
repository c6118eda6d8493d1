"""Which wall binds: capacity, network, bandwidth, compute, or SLO contention (checked in that order)."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.advisor.parallel import TP_NETWORK_LIMIT
from ridgeline.advisor.roofline import decode_step, prefill
from ridgeline.advisor.scenario import Scenario
from ridgeline.advisor.units import fmt_time


@dataclass(frozen=True)
class Wall:
    name: str  # capacity | network | bandwidth | compute | slo-contention
    reason: str
    ttft_ok: bool
    tpot_ok: bool

    def json(self) -> dict:
        return dict(self.__dict__)


def diagnose(s: Scenario) -> Wall:
    sv, w, C = s.serving, s.w, s.concurrency
    ttft_ok, tpot_ok = sv.ttft <= w.ttft_slo, sv.tpot_contended <= w.tpot_slo
    dstep = decode_step(s.pl, C, w.mean_decode_context)
    pstep = prefill(s.pl, w.prompt_len)
    ridge = f"{s.ridge:.0f}" if s.ridge else "none (KV reads keep decode bandwidth-bound)"

    def wall(name: str, reason: str) -> Wall:
        return Wall(name, reason, ttft_ok, tpot_ok)

    if not s.fits:
        return wall("capacity", f"weights + KV for {C:g} requests need {s.needed} x {s.hw.name}; the deployment has "
                                f"{s.layout.devices}")
    if sv.overloaded:
        return wall("capacity", f"at {w.rate:g} requests/s the traffic needs more requests in flight than the "
                                f"{s.max_conc:.0f} the KV room holds at context {w.context}: the rate cannot be "
                                "sustained")
    if C > s.max_conc + 1e-9:
        return wall("capacity", f"the KV room holds {s.max_conc:.0f} requests at context {w.context}, the traffic "
                                f"needs {C:g}")
    busy = max(dstep.memory, dstep.compute)
    if dstep.network > TP_NETWORK_LIMIT * busy:
        return wall("network", f"collectives take {fmt_time(dstep.network)} of each {fmt_time(dstep.total)} decode "
                               f"step over {s.hw.link}")
    if sv.tpot > w.tpot_slo:
        return wall(dstep.bound, f"a decode step at batch {C:g} takes {fmt_time(sv.tpot)} > TPOT SLO "
                                 f"{fmt_time(w.tpot_slo)}; it is {dstep.bound}-bound (ridge batch {ridge})")
    if sv.ttft > w.ttft_slo:
        return wall(pstep.bound, f"prefill of {w.prompt_len} tokens takes {fmt_time(sv.prefill_s)} "
                                 f"({pstep.bound}-bound): TTFT {fmt_time(sv.ttft)} > SLO {fmt_time(w.ttft_slo)}")
    if not tpot_ok:
        return wall("slo-contention", f"decode alone meets TPOT ({fmt_time(sv.tpot)} <= {fmt_time(w.tpot_slo)}) but "
                                      f"{C:g} interleaved prefills of {fmt_time(sv.prefill_s)} each push it to "
                                      f"{fmt_time(sv.tpot_contended)}")
    pre_share = sv.prefill_s / (sv.prefill_s + w.output_len * sv.step_s / C)
    head = (f"SLOs met (TTFT {fmt_time(sv.ttft)} of {fmt_time(w.ttft_slo)}, TPOT {fmt_time(sv.tpot_contended)} of "
            f"{fmt_time(w.tpot_slo)}); prefill is {pre_share:.0%} of device time")
    if pre_share > 0.5:
        return wall(pstep.bound, f"{head}, and it is {pstep.bound}-bound")
    return wall(dstep.bound, f"{head}; decode at batch {C:g} is {dstep.bound}-bound (ridge batch {ridge})")
