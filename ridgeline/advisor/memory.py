"""Capacity arithmetic: weight bytes, KV bytes per token, KV capacity, minimum device count."""
from __future__ import annotations

import math

from ridgeline.advisor.calc import Section
from ridgeline.advisor.hardware import MEMORY_RESERVE, HardwareSpec
from ridgeline.advisor.model_spec import ModelSpec
from ridgeline.advisor.units import BYTES, fmt_bytes, fmt_num, nbytes
from ridgeline.advisor.workload import Workload


def weight_bytes(spec: ModelSpec, prec: str) -> float:
    return spec.num_params * nbytes(prec)


def kv_bytes_per_token(spec: ModelSpec, prec: str) -> float:
    return spec.kv_elems_per_token * nbytes(prec)


def kv_per_request(spec: ModelSpec, w: Workload) -> float:
    """KV bytes one request adds at its end, with the shared prefix (f * prompt) stored once for all."""
    return ((1 - w.prefix_share) * w.prompt_len + w.output_len) * kv_bytes_per_token(spec, w.kv_precision)


def kv_needed(spec: ModelSpec, w: Workload, concurrency: float) -> float:
    shared = w.prefix_share * w.prompt_len * kv_bytes_per_token(spec, w.kv_precision)
    return concurrency * kv_per_request(spec, w) + shared


def kv_capacity_bytes(spec: ModelSpec, hw: HardwareSpec, prec: str, devices: int) -> float:
    return devices * hw.usable_memory - weight_bytes(spec, prec)


def max_concurrency(spec: ModelSpec, hw: HardwareSpec, w: Workload, devices: int) -> float:
    free = kv_capacity_bytes(spec, hw, w.weight_precision, devices)
    shared = w.prefix_share * w.prompt_len * kv_bytes_per_token(spec, w.kv_precision)
    return max(0.0, (free - shared) / kv_per_request(spec, w))


def min_devices(spec: ModelSpec, hw: HardwareSpec, w: Workload, concurrency: float) -> int:
    """Fewest devices whose usable memory holds the weights plus the KV of `concurrency` requests."""
    need = weight_bytes(spec, w.weight_precision) + kv_needed(spec, w, concurrency)
    return max(1, math.ceil(need / hw.usable_memory))


def memory_section(spec: ModelSpec, hw: HardwareSpec, w: Workload, devices: int, concurrency: float) -> Section:
    s = Section("memory", f"Memory: {spec.name} on {devices} x {hw.name} ({fmt_bytes(hw.memory)} each)")
    P = spec.num_params
    for prec in ("fp32", "bf16", "fp8", "int4"):
        mark = "  <- chosen" if BYTES[prec] == BYTES[w.weight_precision] else ""
        s.add(f"weights_{prec}", f"weights at {prec}{mark}", f"params * {BYTES[prec]:g} B",
              f"{fmt_num(P)} * {BYTES[prec]:g}", P * BYTES[prec], "B")
    if spec.is_moe:
        s.add("active_params", "active parameters per token", "non-expert + (k + shared) experts per MoE layer",
              f"{spec.experts_per_token} of {spec.num_experts} experts + {spec.shared_experts} shared",
              spec.active_params, "params")
    formula, numbers = spec.kv_formula()
    kvb = s.add("kv_bytes_per_token", f"KV bytes per token ({w.kv_precision})", formula,
                f"{numbers} * {nbytes(w.kv_precision):g}", kv_bytes_per_token(spec, w.kv_precision), "B")
    per_req = s.add("kv_per_request", "KV per request at its end", "((1 - f) * prompt + output) * KV/token",
                    f"((1 - {w.prefix_share:g}) * {w.prompt_len} + {w.output_len}) * {fmt_num(kvb)}",
                    kv_per_request(spec, w), "B")
    wb = weight_bytes(spec, w.weight_precision)
    usable = hw.usable_memory
    free = s.add("kv_capacity", "KV capacity", f"devices * memory * (1 - {MEMORY_RESERVE:g}) - weights",
                 f"{devices} * {fmt_bytes(usable)} - {fmt_bytes(wb)}", devices * usable - wb, "B")
    if free < 0:
        s.note(f"the weights need {fmt_bytes(-free)} more than {devices} x {fmt_bytes(usable)} usable: no KV fits")
    s.add("kv_capacity_tokens", "KV capacity in tokens", "KV capacity / KV per token",
          f"{fmt_bytes(max(free, 0))} / {fmt_num(kvb)}", max(free, 0) / kvb, "tokens")
    s.add("max_concurrency", f"max concurrency at context {w.context}",
          "(KV capacity - shared prefix) / KV per request",
          f"{fmt_bytes(max(free, 0))} / {fmt_bytes(per_req)}", max_concurrency(spec, hw, w, devices), "requests")
    s.add("max_context_one_request", "longest single request that fits", "KV capacity / KV per token",
          f"min(model max {spec.max_context}, {fmt_bytes(max(free, 0))} / {fmt_num(kvb)})",
          min(spec.max_context, max(free, 0) / kvb), "tokens")
    need = kv_needed(spec, w, concurrency)
    s.add("kv_needed", f"KV for {fmt_num(concurrency)} concurrent requests", "C * KV per request + shared prefix",
          f"{fmt_num(concurrency)} * {fmt_bytes(per_req)}", need, "B")
    s.add("min_devices", "minimum devices", "ceil((weights + KV needed) / usable memory per device)",
          f"ceil(({fmt_bytes(wb)} + {fmt_bytes(need)}) / {fmt_bytes(usable)})",
          min_devices(spec, hw, w, concurrency), "devices")
    return s
