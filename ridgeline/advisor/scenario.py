"""Everything the report needs, computed once: the deployment, its capacity, and the serving estimate."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.hardware import HardwareSpec
from ridgeline.advisor.memory import max_concurrency, min_devices
from ridgeline.advisor.model_spec import ModelSpec
from ridgeline.advisor.parallel import Layout, check_fits, choose_layout, does_not_fit, pipeline_layout
from ridgeline.advisor.roofline import Platform, ridge_batch
from ridgeline.advisor.serving import Serving, at_rate, estimate
from ridgeline.advisor.workload import Workload


@dataclass(frozen=True)
class SpecDecode:
    alpha: float = 0.7  # per-token acceptance rate of the draft
    k: int = 4  # draft tokens per pass
    cost: float = 0.05  # draft step time / target step time


@dataclass(frozen=True)
class Scenario:
    spec: ModelSpec
    hw: HardwareSpec
    w: Workload
    layout: Layout
    pl: Platform
    needed: int  # devices capacity alone requires
    max_conc: float  # requests the KV capacity of this deployment holds
    serving: Serving
    ridge: float | None  # decode batch where compute catches up with bandwidth
    sd: SpecDecode
    chunk: int  # chunked-prefill tokens per step

    @property
    def concurrency(self) -> float:
        return self.serving.concurrency

    @property
    def fits(self) -> bool:
        return self.layout.devices >= self.needed


def build(spec: ModelSpec, hw: HardwareSpec, w: Workload, gpus: int | None = None, ops_per_step: int | None = None,
          sd: SpecDecode = SpecDecode(), chunk: int = 512, pp: int | None = None) -> Scenario:
    """pp: pipeline stages asked for (None: the advisor chooses the layout)."""
    w.check_fits(spec.max_context, spec.name)
    if chunk < 1:
        raise AdvisorError(f"chunk size must be positive, got {chunk}", "chunk")
    # with a request rate, size for at most the KV a full-context request set would need at concurrency 1
    conc = w.concurrency if w.rate is None else 1
    needed = check_fits(spec, hw, w, conc)
    if gpus is not None:
        if gpus < 1:
            raise AdvisorError(f"--gpus must be positive, got {gpus}", "gpus")
        if gpus > hw.max_devices:
            raise AdvisorError(f"--gpus {gpus} is more than {hw.name} deployments the advisor plans "
                               f"({hw.max_devices})", "gpus")
    if pp is not None:
        layout = pipeline_layout(spec, gpus or pp * -(-needed // pp), pp)
    else:
        layout = choose_layout(spec, hw, w, gpus or needed, conc)
    pl = Platform(spec, hw, w.weight_precision, w.kv_precision, tp=layout.tp, pp=layout.pp,
                  ops_per_step=ops_per_step)
    cap = max_concurrency(spec, hw, w, layout.devices)
    if w.rate is None:
        serving = estimate(pl, w, w.concurrency)
    else:
        serving = at_rate(pl, w, w.rate, max(cap, 1))
        conc = serving.concurrency
        needed = max(needed, min_devices(spec, hw, w, conc))
    if layout.devices < needed:
        layout = replace(layout, reason=does_not_fit(spec, hw, w, layout, needed, conc))
    elif gpus is not None and layout.devices != gpus:
        layout = replace(layout, reason=f"{layout.reason} (--gpus {gpus} asked; this layout uses {layout.devices})")
    return Scenario(spec, hw, w, layout, pl, needed, cap, serving, ridge_batch(pl, w.mean_decode_context), sd, chunk)
