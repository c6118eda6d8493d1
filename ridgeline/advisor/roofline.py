"""Roofline time model of one forward step: max(bytes / bandwidth, FLOPs / rate) + network + host overhead
(on an accelerator the host overhead overlaps the device work instead of adding to it).

A step over T tokens reads the weights once (MoE: the experts those tokens touch), reads or writes the KV
it attends to, and does 2 FLOPs per weight per token plus the attention term (QK^T and PV, per
query-key pair). Logits are computed only for the rows that sample. Devices that split a layer (tensor
or expert parallel) divide bytes and FLOPs; their collectives are added on top.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ridgeline.advisor.hardware import INTER_NODE_BW, INTER_NODE_LATENCY, HardwareSpec
from ridgeline.advisor.model_spec import ModelSpec
from ridgeline.advisor.units import nbytes

ACT_BYTES = 2  # activations on the wire (bf16)
OPS_PER_LAYER = 16  # host-dispatched tensor ops per decoder layer when not counted (validate counts them)


@dataclass(frozen=True)
class Platform:
    spec: ModelSpec
    hw: HardwareSpec
    weights: str = "bf16"
    kv: str = "bf16"
    tp: int = 1  # devices splitting each layer (tensor or expert parallel)
    pp: int = 1  # pipeline stages (one node each when tp fills a node)
    ops_per_step: int | None = None  # host ops per forward; None: OPS_PER_LAYER * layers

    @property
    def rate(self) -> float:
        return self.hw.rate(self.weights)

    @property
    def overhead(self) -> float:
        ops = self.ops_per_step if self.ops_per_step is not None else OPS_PER_LAYER * self.spec.num_layers
        return self.hw.op_overhead * ops

    def with_(self, **kw) -> "Platform":
        return Platform(**{**self.__dict__, **kw})


@dataclass(frozen=True)
class StepTime:
    memory: float  # s to move the bytes
    compute: float  # s for the FLOPs
    network: float
    overhead: float
    bytes: float
    flops: float
    overlap: bool = False  # host work overlaps device work (an accelerator launching asynchronously)

    @property
    def total(self) -> float:
        busy = max(self.memory, self.compute)
        return (max(busy, self.overhead) if self.overlap else busy + self.overhead) + self.network

    @property
    def bound(self) -> str:
        return "compute" if self.compute >= self.memory else "bandwidth"


def network_time(pl: Platform, tokens: float) -> float:
    """Collectives of one step: TP all-reduces (2 per layer), MoE all-to-alls (2 per MoE layer), PP hops."""
    s, hw, t = pl.spec, pl.hw, pl.tp
    msg = tokens * s.hidden_size * ACT_BYTES
    total = 0.0
    if t > 1:
        inside = t <= hw.devices_per_node
        bw, lat = (hw.link_bw, hw.link_latency) if inside else (INTER_NODE_BW, INTER_NODE_LATENCY)
        if s.is_moe:  # attention still all-reduces; tokens go to their experts and back
            total += 2 * s.num_layers * (2 * (t - 1) / t * msg / bw + lat)
            total += 2 * s.moe_layers * ((t - 1) / t * msg * s.experts_per_token / bw + lat)
        else:  # ring all-reduce moves 2 (t-1)/t of the message per device
            total += 2 * s.num_layers * (2 * (t - 1) / t * msg / bw + lat)
    if pl.pp > 1:
        total += (pl.pp - 1) * (msg / INTER_NODE_BW + INTER_NODE_LATENCY)
    return total


def step(pl: Platform, tokens: float, pairs: float, kv_bytes: float, sampled: float) -> StepTime:
    """tokens: query tokens in the step; pairs: query-key pairs attended; kv_bytes: KV read + written."""
    s = pl.spec
    head = s.vocab_size * s.hidden_size
    flops = 2 * (s.matmul_params - head) * tokens + 2 * head * sampled + s.attn_flops_per_pair * pairs
    wbytes = s.params_read(tokens) * nbytes(pl.weights)
    mem = (wbytes + kv_bytes) / (pl.tp * pl.hw.bandwidth)
    rate = pl.hw.rate_at(pl.weights, tokens)  # the peak, or the measured curve at this many rows
    return StepTime(mem, flops / (pl.tp * rate), network_time(pl, tokens), pl.overhead, wbytes + kv_bytes, flops,
                    overlap=pl.hw.kind == "gpu")


def kvb(pl: Platform) -> float:
    return pl.spec.kv_elems_per_token * nbytes(pl.kv)


def decode_step(pl: Platform, batch: float, context: float) -> StepTime:
    """One new token for each of `batch` sequences that attend to `context` cached tokens each."""
    return step(pl, batch, batch * context, batch * (context + 1) * kvb(pl), batch)


def verify_step(pl: Platform, batch: float, context: float, k: int) -> StepTime:
    """Speculative verification: k drafted + 1 token per sequence in one forward, all of them sampled."""
    n = batch * (k + 1)
    return step(pl, n, n * context, batch * (context + k + 1) * kvb(pl), n)


def prefill(pl: Platform, new: float, cached: float = 0) -> StepTime:
    """`new` prompt tokens of one request after `cached` prefix tokens: causal pairs = new*cached + new^2/2."""
    pairs = new * cached + new * new / 2
    return step(pl, new, pairs, (cached + new) * kvb(pl), 1)


def ridge_batch(pl: Platform, context: float, limit: int = 1 << 20) -> float | None:
    """Smallest decode batch at which compute time reaches memory time; None if it never does (the KV
    reads then grow as fast as the FLOPs, so decode stays bandwidth-bound at this context). The
    classic roofline: peak matrix rate, not a measured per-row-count curve (whose small-M points
    already carry the weight-streaming time)."""
    if pl.hw.gemm_curve:
        pl = pl.with_(hw=replace(pl.hw, gemm_curve={}))

    def compute_bound(b: float) -> bool:
        t = decode_step(pl, b, context)
        return t.compute >= t.memory

    if compute_bound(1):
        return 1.0
    if not compute_bound(limit):
        return None
    lo, hi = 1.0, float(limit)
    while hi - lo > 0.01 * lo:
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def crossover_len(spec: ModelSpec) -> float:
    """Prompt length where the attention FLOPs (a n^2 / 2) overtake the linear FLOPs (2 P n), P without the
    output head (prefill computes logits for one row only)."""
    return 4 * (spec.matmul_params - spec.vocab_size * spec.hidden_size) / spec.attn_flops_per_pair
