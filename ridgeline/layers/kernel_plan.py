"""Kernel choices as a value: decided once per engine at start-up (detected or measured), frozen,
recorded in EngineInfo and handed to model construction. Nothing here is process-global, so two
engines in one process (say an fp32 and a bf16 one) each run exactly the kernels chosen for them.

On AVX-512 CPUs, fp32 weights (and bf16 ones with AVX512-BF16) are repacked at load time for the
packed-weight kernel (kernels/gemm_packed.c), which serves every batch size; a row's result then
does not depend on the batch it shares. Elsewhere, batches of up to `skinny_max_m` tokens go to
the skinny kernel (kernels/gemv.c) where it beats F.linear (timed once per process and dtype),
F.linear otherwise. Measured on an EPYC Zen 4 (2 cores), SmolLM2 shapes, cold weights, packed
kernel vs F.linear: fp32 27 vs 13 GB/s of weights at 1 row, 216 vs 146-165 GFLOP/s at 256 rows;
bf16 30 vs 13 GB/s at 1 row, 300 vs 140 GFLOP/s at 16 rows, 370-420 vs 260-370 at 64-256 rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ridgeline.kernels import cpu, cpu_gemm, cpu_gemv, cpu_quant, triton_quant


@dataclass(frozen=True)
class KernelPlan:
    device_type: str = "cpu"
    packed: frozenset = frozenset()  # weight dtypes repacked for kernels/gemm_packed.c
    skinny: str = "linear"  # for unpacked weights at <= skinny_max_m rows: "c" (kernels/gemv.c) or "linear"
    skinny_max_m: int = cpu_gemv.MAX_M
    fused_ops: bool = False  # RMSNorm + residual, SiLU * up, rotary + KV write through kernels/ops.c
    c_attention: bool = False  # paged attention in C (kernels/paged_attention.c) over fp32/bf16 CPU caches
    c_stack: bool = False  # whole layers in one C call (kernels/decoder_stack.c) where every part is in C
    quant: frozenset = frozenset()  # quantized kinds (cpu_quant.KINDS: int8, int4, w8a8, w4a8) with a C kernel
    matmul_summary: str = "torch (F.linear)"

    def packs(self, w: torch.Tensor) -> bool:
        """Whether this plan wants the weight repacked for the packed kernel."""
        return w.device.type == "cpu" and w.dtype in self.packed and w.dim() == 2

    @property
    def summary(self) -> str:
        parts = [f"matmul: {self.matmul_summary}"]
        if self.fused_ops:
            parts.append("fused RMSNorm, SiLU*up, rotary + KV write (C)")
        if self.c_attention:
            parts.append("paged attention (C)")
        return "; ".join(parts)


TORCH_ONLY = KernelPlan()
_skinny_timings: dict[torch.dtype, tuple[str, str]] = {}  # per process: measured once per dtype


def choose_kernels(device: torch.device, weight_dtype: torch.dtype, act_dtype: torch.dtype) -> KernelPlan:
    """The kernels an engine with these dtypes runs on this device."""
    if device.type != "cpu":
        why = triton_quant.unavailable_reason(device)
        quant = ("quantized weights: Triton kernel (kernels/triton_quant.py)" if why is None
                 else f"quantized weights dequantized per call ({why})")
        return KernelPlan(device_type=device.type, matmul_summary=f"torch (F.linear); {quant}")
    if cpu.lib() is None:
        return KernelPlan(matmul_summary=f"torch (F.linear); C kernels unavailable: {cpu.unavailable_reason()}")
    fused = act_dtype == torch.float32
    common = dict(fused_ops=fused, c_attention=True, c_stack=fused,
                  quant=frozenset(k for k in cpu_quant.KINDS if cpu_quant.available(k)))
    if weight_dtype in (torch.float32, torch.bfloat16) and cpu_gemm.available(weight_dtype):
        isa = "AVX512-BF16" if weight_dtype == torch.bfloat16 else "AVX-512"
        packed = frozenset(d for d in (torch.float32, torch.bfloat16) if cpu_gemm.available(d))  # any mix of layers
        return KernelPlan(packed=packed, matmul_summary=f"packed-weight C GEMM ({isa}) at every batch size", **common)
    if weight_dtype not in (torch.float32, torch.bfloat16):
        return KernelPlan(matmul_summary="torch (F.linear)", **{**common, "c_stack": False})
    if weight_dtype not in _skinny_timings:
        _skinny_timings[weight_dtype] = _time_skinny(weight_dtype)
    skinny, line = _skinny_timings[weight_dtype]
    return KernelPlan(skinny=skinny, matmul_summary=line, **{**common, "c_stack": False})


def _time_skinny(dtype: torch.dtype, shape=(1536, 576), reps: int = 24) -> tuple[str, str]:
    """Time F.linear against the C skinny kernel on weight-sized matrices at M=1; keep the faster."""
    ws = [torch.randn(*shape).to(dtype) for _ in range(24)]  # more bytes than the caches hold
    x = torch.randn(1, shape[1]).to(dtype)
    cands = {"linear": lambda w: F.linear(x, w), "c": lambda w: cpu_gemv.gemv(x, w)}
    times = {name: float("inf") for name in cands}
    for _ in range(3):  # interleaved rounds, best of each: robust to a noisy neighbour
        for name, fn in cands.items():
            t = time.perf_counter()
            for i in range(reps):
                fn(ws[i % len(ws)])
            times[name] = min(times[name], (time.perf_counter() - t) / reps)
    best = min(times, key=times.get)
    label = {"c": "C kernel", "linear": "F.linear"}
    return best, (f"{label[best]} for <= {cpu_gemv.MAX_M} tokens "
                  f"({', '.join(f'{label[k]} {v * 1e6:.0f} us' for k, v in times.items())} per {shape[0]}x{shape[1]})")
