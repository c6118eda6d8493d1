"""How many devices, and how to split the model over them: tensor, pipeline or expert parallel."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.hardware import INTER_NODE_BW, HardwareSpec
from ridgeline.advisor.memory import kv_needed, max_concurrency, min_devices, weight_bytes
from ridgeline.advisor.model_spec import ModelSpec
from ridgeline.advisor.roofline import Platform, decode_step
from ridgeline.advisor.units import BYTES, fmt_bytes, fmt_time
from ridgeline.advisor.workload import Workload

from ridgeline.distributed.layout import shard_bytes_fraction, tp_layout  # the engine's own sharding rules
from ridgeline.errors import InvalidRequestError

TP_NETWORK_LIMIT = 0.25  # TP is a trap when its collectives add more than this fraction to a decode step


@dataclass(frozen=True)
class Layout:
    tp: int  # devices splitting each layer (for MoE: the expert-parallel group)
    pp: int
    ep: bool
    reason: str

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    def describe(self) -> str:
        if self.devices == 1:
            return "1 device"
        parts = [f"{'EP' if self.ep else 'TP'}{self.tp}"] + ([f"PP{self.pp}"] if self.pp > 1 else [])
        return f"{self.devices} devices ({' x '.join(parts)})"


def tp_splits(spec: ModelSpec, t: int) -> bool:
    """Whether the engine can split this dense model over t ranks (whole GQA groups, replicated KV heads
    when fewer than t, MLP width divisible): the rule ridgeline.distributed.layout applies at start-up."""
    try:
        tp_layout(spec.num_heads, spec.num_kv_heads, spec.intermediate_size, spec.vocab_size, t)
    except InvalidRequestError:
        return False
    return True


def uneven_note(spec: ModelSpec, t: int) -> str:
    """What an uneven head split costs: the busiest rank's share of the attention weights and KV."""
    q, kv = shard_bytes_fraction(spec.num_heads, spec.num_kv_heads, t)
    if abs(q - 1 / t) < 1e-9:
        return ""
    return (f"; {spec.num_kv_heads} KV-head groups do not divide over {t} devices, so the busiest one holds "
            f"{q:.0%} of the attention weights and {kv:.0%} of the KV cache (not {1 / t:.0%})")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


def check_fits(spec: ModelSpec, hw: HardwareSpec, w: Workload, concurrency: float) -> int:
    n = min_devices(spec, hw, w, concurrency)
    if n > hw.max_devices:
        what = "one host" if hw.kind == "cpu" else f"{hw.max_nodes} nodes x {hw.devices_per_node}"
        raise AdvisorError(
            f"{spec.name} cannot fit on any count of {hw.name}: weights at {w.weight_precision} are "
            f"{fmt_bytes(weight_bytes(spec, w.weight_precision))} plus {fmt_bytes(kv_needed(spec, w, concurrency))} "
            f"of KV for {concurrency:g} requests, and the most the advisor plans is {hw.max_devices} "
            f"({what}) with {fmt_bytes(hw.max_devices * hw.usable_memory)} usable. Use a lower weight precision "
            f"(--weights fp8 / int4), fewer concurrent requests, or a larger device.", "hardware")
    return n


def choose_layout(spec: ModelSpec, hw: HardwareSpec, w: Workload, needed: int, concurrency: float) -> Layout:
    if needed <= 1:
        return Layout(1, 1, False, "fits on one device: no model parallelism; add replicas (data parallel) "
                                   "for more throughput")
    node = hw.devices_per_node
    if spec.is_moe:
        ep = _pow2_at_least(needed)
        while spec.num_experts % ep and ep > 1:
            ep //= 2
        ep = max(ep, 1)
        pp = math.ceil(needed / ep)
        frac = spec.moe_layers * spec.num_experts * spec.expert_params() / spec.num_params
        return Layout(ep, pp, True, (
            f"expert parallel: routed experts are {frac:.0%} of the weights; EP{ep} puts "
            f"{spec.num_experts // ep} whole experts on each device, so a token crosses the network twice per "
            f"MoE layer (all-to-all of hidden x top-{spec.experts_per_token}) instead of TP's two all-reduces "
            f"per layer inside every expert; attention runs tensor-parallel over the same devices"
            + (f"; PP{pp} across nodes" if pp > 1 else "")))
    tps = [t for t in (1, 2, 4, 8, 16) if t <= node and tp_splits(spec, t)]
    tp = next((t for t in tps if t >= needed), tps[-1])
    pp = math.ceil(needed / tp)
    if pp > spec.num_layers:
        raise AdvisorError(f"{spec.name} needs {needed} x {hw.name} but has only {spec.num_layers} layers to "
                           "pipeline over", "hardware")
    tp_pl = Platform(spec, hw, w.weight_precision, w.kv_precision, tp=tp)
    t = decode_step(tp_pl, concurrency, w.mean_decode_context)
    busy = max(t.memory, t.compute)
    if tp > 1 and t.network > TP_NETWORK_LIMIT * busy and needed <= spec.num_layers:  # a stage holds >= 1 layer
        return Layout(1, needed, False, (
            f"pipeline parallel: TP{tp} over {hw.link} would spend {fmt_time(t.network)} per decode step in "
            f"all-reduces (2 per layer) against {fmt_time(busy)} of memory/compute time; PP{needed} passes "
            f"only the activations once per stage boundary. Per-token latency does not drop with PP; "
            f"throughput grows when micro-batches fill the pipeline"))
    reason = (f"tensor parallel: TP{tp} inside a node over {hw.link} ({fmt_bytes(hw.link_bw)}/s): each device "
              f"reads 1/{tp} of the weights per step, so bandwidth-bound decode gets ~{tp}x faster; its 2 "
              f"all-reduces per layer cost {fmt_time(t.network)} per step against {fmt_time(busy)}"
              + uneven_note(spec, tp))
    if pp > 1:
        reason += (f"; PP{pp} across nodes, because between nodes ({fmt_bytes(INTER_NODE_BW)}/s) only "
                   "activations should cross, once per stage")
    return Layout(tp, pp, False, reason)


def pipeline_layout(spec: ModelSpec, devices: int, pp: int) -> Layout:
    """The layout `--pipeline-parallel-size pp` asks for: pp stages, each over devices / pp (TP inside)."""
    if pp < 1 or devices % pp:
        raise AdvisorError(f"--pipeline-parallel-size {pp} must be >= 1 and divide the {devices} devices", "gpus")
    if pp > spec.num_layers:
        raise AdvisorError(f"--pipeline-parallel-size {pp} is more stages than {spec.name}'s {spec.num_layers} "
                           "layers", "pipeline_parallel_size")
    tp = devices // pp
    if tp > 1 and not tp_splits(spec, tp):
        raise AdvisorError(f"{devices} devices in {pp} stages leaves TP{tp} per stage, which the engine cannot "
                           f"split {spec.name} over", "gpus")
    return Layout(tp, pp, False, (
        f"pipeline parallel as asked: PP{pp}" + (f" x TP{tp}" if tp > 1 else "") + "; only the activations "
        "cross between stages, once per stage boundary per micro-batch (see the pipeline section)"))


def does_not_fit(spec: ModelSpec, hw: HardwareSpec, w: Workload, layout: Layout, needed: int,
                 concurrency: float) -> str:
    """The layout's reason when it has fewer devices than capacity needs: the arithmetic, then what would fit."""
    n, usable = layout.devices, hw.usable_memory
    wb, kv = weight_bytes(spec, w.weight_precision), kv_needed(spec, w, concurrency)
    text = (f"does not fit on {n} x {hw.name}: weights ({w.weight_precision}) {fmt_bytes(wb)} + KV for "
            f"{concurrency:g} requests {fmt_bytes(kv)} = {fmt_bytes(wb + kv)} > {n} x {fmt_bytes(usable)} usable "
            f"= {fmt_bytes(n * usable)}; {needed} devices hold it (--gpus {needed})")
    lower = [(p, min_devices(spec, hw, Workload(**{**w.summary(), "weight_precision": p}), concurrency))
             for p in ("fp8", "int4") if BYTES[p] < BYTES[w.weight_precision]]
    text += "".join(f", or {m} at --weights {p}" for p, m in lower if m < needed)
    room = max_concurrency(spec, hw, w, n)
    text += (f"; the weights alone exceed {n} device{'s' if n > 1 else ''}" if wb > n * usable else
             f"; {n} device{'s hold' if n > 1 else ' holds'} {room:.0f} such requests at once")
    return text + (f". Planned anyway as {layout.reason}" if n > 1 else "")
