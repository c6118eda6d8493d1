"""The advisor applied to the running engine: its model, its memory (weights + KV cache), its number
formats and the traffic of its last finished requests, on a chosen hardware (the cached profile of this
machine, or a table entry). Torch-free apart from what the engine already loaded."""
from __future__ import annotations

from dataclasses import replace

from ridgeline.advisor.diagnose import diagnose
from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.hardware import MEMORY_RESERVE, HardwareSpec, lookup_hardware
from ridgeline.advisor.memory import weight_bytes
from ridgeline.advisor.model_config import spec_from_arch
from ridgeline.advisor.model_spec import ModelSpec
from ridgeline.advisor.plot import roofline_points
from ridgeline.advisor.scenario import Scenario, build
from ridgeline.advisor.workload import Workload

# engine weight formats (--quantization, by prefix) -> the advisor's number format for bytes and rates
_WEIGHTS = (("w8a8", "int8"), ("int8", "int8"), ("w4a8", "int4"), ("int4", "int4"), ("gptq", "int4"),
            ("awq", "int4"), ("gguf", "int4"), ("mxfp8", "fp8"), ("fp8", "fp8"), ("mxfp4", "fp4"),
            ("nvfp4", "fp4"))
_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
_KV = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "int8": "int8", "int4": "int4", "fp8_e4m3": "fp8",
       "fp8_e5m2": "fp8"}
NO_PROFILE = ("no measured profile of this machine yet: run `ridgeline advise --hardware local` once (it is "
              "cached), or pick a table hardware")


def precisions(info, spec: ModelSpec | None = None) -> tuple[str, str]:
    """(weights, KV) of the running engine as the advisor's formats. A GGUF's kept blocks are named by the
    bytes the engine holds per weight (Q4_* int4, Q8_0 int8), given the model's spec for its size."""
    from ridgeline.advisor.defaults import precision_of
    q = info.quantization or "none"
    weights = next((p for prefix, p in _WEIGHTS if q.startswith(prefix)), _DTYPES.get(str(info.dtype), "fp32"))
    if q.startswith("gguf") and spec is not None and info.weight_bytes and spec.num_params:
        weights = precision_of(info.weight_bytes / spec.num_params)
    return weights, _KV.get(info.kv_spec.format.name, "bf16")


def served_spec(engine, name: str) -> ModelSpec:
    return spec_from_arch(engine.arch, name)


def hardware(name: str) -> HardwareSpec:
    from ridgeline.advisor.defaults import hardware_name
    name = hardware_name(name)  # auto: the GPU's table entry, else this machine
    if name.lower() == "local":
        from ridgeline.advisor.local_profile import cached_profile, to_spec
        p = cached_profile()
        if p is None:
            raise AdvisorError(NO_PROFILE, "hardware")
        return to_spec(p)
    return lookup_hardware(name)


def engine_hardware(hw: HardwareSpec, spec: ModelSpec, weights: str, kv_bytes: int) -> HardwareSpec:
    """hw with the memory this engine holds: its weights plus its KV cache, so capacity is the engine's."""
    usable = weight_bytes(spec, weights) + kv_bytes
    # max_nodes: traffic over this memory is the capacity wall, not "fits on no count of devices"
    return replace(hw, name=f"{hw.name} (memory: the engine's weights + KV cache)",
                   memory=usable / (1 - MEMORY_RESERVE), max_nodes=1 << 16)


def live_workload(recent, running: int, weights: str, kv: str) -> Workload | None:
    """The traffic of the recent finished requests at today's concurrency; None before any finished."""
    done = [r for r in recent if r.output_tokens > 0]
    if not done:
        return None
    prompt = sum(r.prompt_tokens for r in done)
    share = sum(r.cached_tokens for r in done) / prompt if prompt else 0.0
    return Workload(prompt_len=max(1, round(prompt / len(done))),
                    output_len=max(1, round(sum(r.output_tokens for r in done) / len(done))),
                    concurrency=max(1, running), prefix_share=min(share, 0.99), weight_precision=weights,
                    kv_precision=kv)


def live_scenario(engine, name: str, hardware_name: str, recent, running: int) -> Scenario:
    info = engine.info
    spec = served_spec(engine, name)
    weights, kv = precisions(info, spec)
    w = live_workload(recent, running, weights, kv)
    if w is None:
        raise AdvisorError("no finished request yet: the wall follows from the traffic")
    hw = engine_hardware(hardware(hardware_name), spec, weights, info.kv_bytes)
    return build(spec, hw, w, gpus=1)


def live_wall(engine, name: str, hardware_name: str, recent, running: int) -> dict:
    """The diagnosis on the live numbers, or why there is none yet (never raises on bad traffic)."""
    try:
        s = live_scenario(engine, name, hardware_name, recent, running)
    except AdvisorError as e:
        return {"name": None, "reason": e.message, "hardware": hardware_name}
    return {**diagnose(s).json(), "hardware": s.hw.name, "workload": s.w.summary(),
            "predicted": {"ttft": s.serving.ttft, "tpot": s.serving.tpot_contended}, "roofline": roofline_points(s),
            **slo_verdict(recent, s.w.ttft_slo, s.w.tpot_slo)}


def slo_verdict(recent, ttft_slo: float, tpot_slo: float) -> dict:
    """The SLOs judged by what was measured (the median of the recent finished requests), not by the
    prediction: {"slo": targets, "measured": p50s, "met": True / False, or None where nothing was measured}."""
    import statistics
    measured = {}
    for key in ("ttft", "tpot"):
        values = [getattr(r, key) for r in recent if getattr(r, key) is not None]
        measured[key] = statistics.median(values) if values else None
    slo = {"ttft": ttft_slo, "tpot": tpot_slo}
    return {"slo": slo, "measured": measured,
            "met": {k: None if measured[k] is None else measured[k] <= slo[k] for k in slo}}
