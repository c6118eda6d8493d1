"""Accelerator and CPU specs: memory, bandwidth, dense matrix rates per precision, interconnect.

Table numbers are vendor peak figures for dense math (no 2:4 sparsity), so estimates built on them are
floors on time; `--hardware local` replaces them with rates measured on this machine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.units import precision

INTER_NODE_BW = 50e9  # B/s per GPU between nodes (one 400 Gb/s NIC per GPU)
INTER_NODE_LATENCY = 20e-6
MAX_NODES = 8  # the largest deployment planned; beyond it pipeline bubbles and the network dominate
MEMORY_RESERVE = 0.10  # of each device's memory: activations, runtime, fragmentation


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    kind: str  # "gpu" or "cpu"
    memory: float  # bytes per device
    bandwidth: float  # memory read, B/s per device
    flops: dict[str, float]  # precision -> dense FLOP/s (OP/s for int8) per device
    link: str = "none"
    link_bw: float = 0.0  # B/s per direction per device, inside a node
    link_latency: float = 0.0  # s per small collective
    devices_per_node: int = 1
    max_nodes: int = 1
    # measured on this machine only (`local_profile`): the rate a one-token matmul streams weights at,
    # and the host cost of dispatching one tensor op
    weight_stream_bw: dict[str, float] = field(default_factory=dict)
    op_overhead: float = 0.0
    # measured on this machine only: FLOP/s of the engine's own matmul path at M rows (precision ->
    # {M: rate}), cold weights, so small M carries the weight-streaming time
    gemm_curve: dict[str, dict[int, float]] = field(default_factory=dict)
    source: str = "vendor peak (dense)"

    @property
    def usable_memory(self) -> float:
        return self.memory * (1 - MEMORY_RESERVE)

    @property
    def max_devices(self) -> int:
        return self.devices_per_node * self.max_nodes

    def compute_precision(self, weights: str) -> str:
        """The matrix rate a weight format runs at: its own when the chip has one, else bf16 (weights are
        dequantized on the fly), else fp32."""
        p = precision(weights)
        p = "bf16" if p == "fp16" else p
        for cand in (p, "bf16", "fp32"):
            if self.flops.get(cand):
                return cand
        raise AdvisorError(f"{self.name} has no matrix rate for {weights}")

    def rate(self, weights: str) -> float:
        return self.flops[self.compute_precision(weights)]

    def rate_at(self, weights: str, rows: float) -> float:
        """Matrix rate for a step of `rows` tokens: the measured curve where there is one (log-linear
        between its points, flat past its ends), else the peak."""
        curve = self.gemm_curve.get(self.compute_precision(weights))
        if not curve:
            return self.rate(weights)
        pts = sorted((int(m), r) for m, r in curve.items())
        if rows <= pts[0][0]:
            return pts[0][1]
        for (m0, r0), (m1, r1) in zip(pts, pts[1:]):
            if rows <= m1:
                f = math.log(rows / m0) / math.log(m1 / m0)
                return r0 * (r1 / r0) ** f
        return pts[-1][1]

    def stream_bw(self, weights: str) -> float:
        """Bandwidth at which weights in this format are read by a one-token matmul."""
        return self.weight_stream_bw.get(precision(weights), self.bandwidth)

    def summary(self) -> dict:
        return {"name": self.name, "kind": self.kind, "memory": self.memory, "bandwidth": self.bandwidth,
                "flops": self.flops, "link": self.link, "link_bw": self.link_bw,
                "devices_per_node": self.devices_per_node, "weight_stream_bw": self.weight_stream_bw,
                "op_overhead": self.op_overhead, "gemm_curve": self.gemm_curve, "source": self.source}


T, G = 1e12, 1e9


def _gpu(name, mem_gb, bw_tbs, fp32, bf16, fp8, int8, fp4, link, link_gbs, latency_us):
    flops = {"fp32": fp32 * T, "bf16": bf16 * T, "fp8": fp8 * T, "int8": int8 * T, "fp4": fp4 * T}
    return HardwareSpec(name, "gpu", mem_gb * G, bw_tbs * T, {k: v for k, v in flops.items() if v},
                        link, link_gbs * G, latency_us * 1e-6, devices_per_node=8, max_nodes=MAX_NODES)


def _cpu(name, mem_gb, bw_gbs, fp32, bf16, int8):
    return HardwareSpec(name, "cpu", mem_gb * G, bw_gbs * G, {"fp32": fp32 * T, "bf16": bf16 * T, "int8": int8 * T},
                        source="vendor peak (cores x clock x SIMD/AMX width)")


HARDWARE: dict[str, HardwareSpec] = {h.name: h for h in [
    #    name          GB    TB/s  fp32   bf16    fp8     int8    fp4   link (per direction)
    _gpu("H100-SXM", 80, 3.35, 67, 989, 1979, 1979, 0, "NVLink 4", 450, 8),
    _gpu("H200", 141, 4.8, 67, 989, 1979, 1979, 0, "NVLink 4", 450, 8),
    _gpu("B200", 180, 8.0, 75, 2250, 4500, 4500, 9000, "NVLink 5", 900, 8),
    _gpu("A100-40GB", 40, 1.555, 19.5, 312, 0, 624, 0, "NVLink 3", 300, 10),
    _gpu("A100-80GB", 80, 2.039, 19.5, 312, 0, 624, 0, "NVLink 3", 300, 10),
    _gpu("L4", 24, 0.3, 30.3, 121, 242.5, 242.5, 0, "PCIe 4.0 x16", 32, 25),
    _gpu("L40S", 48, 0.864, 91.6, 362, 733, 733, 0, "PCIe 4.0 x16", 32, 25),
    _gpu("RTX-4090", 24, 1.008, 82.6, 165.2, 330.3, 660.6, 0, "PCIe 4.0 x16", 32, 25),
    _gpu("MI300X", 192, 5.3, 163.4, 1307.4, 2614.9, 2614.9, 0, "Infinity Fabric", 448, 10),
    #    name          GB   GB/s   fp32  bf16   int8
    _cpu("EPYC-9654", 768, 460.8, 7.4, 14.7, 29.5),  # Zen 4, 96 cores, 12 x DDR5-4800
    _cpu("Xeon-8480", 512, 307.2, 7.2, 114.7, 229.4),  # Sapphire Rapids, 56 cores, AMX
    _cpu("Ryzen-7950X", 64, 83.2, 2.3, 4.6, 9.2),  # Zen 4, 16 cores, 2 x DDR5-5200
]}

_ALIASES = {"h100": "H100-SXM", "h100sxm5": "H100-SXM", "a100": "A100-80GB", "4090": "RTX-4090",
            "xeon8480": "Xeon-8480", "xeonplatinum8480": "Xeon-8480", "epyc9654": "EPYC-9654",
            "mi300": "MI300X"}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def lookup_hardware(name: str) -> HardwareSpec:
    key = _norm(name)
    canonical = _ALIASES.get(key) or next((n for n in HARDWARE if _norm(n) == key), None)
    if canonical is None:
        raise AdvisorError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}, or 'local' to measure "
                           "this machine", "hardware")
    return HARDWARE[canonical]
