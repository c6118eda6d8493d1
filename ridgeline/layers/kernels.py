"""Process-wide matmul kernel choices, decided once at engine start, then read-only.

Batches of M tokens go to: with bf16 weights on AVX512-BF16 CPUs, the bf16 dot-product kernel
(kernels/gemm_bf16.c) for M <= GEMM_MAX_M, so a row's result does not depend on the batch it
shares; otherwise the skinny kernel (kernels/gemv.c) for M <= SKINNY_MAX_M where it beats F.linear
(timed at start-up); F.linear for everything else.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ridgeline.kernels import cpu_gemm, cpu_gemv, cpu_ops

SKINNY = "linear"  # "c" (kernels/gemv.c) or "linear"
SKINNY_MAX_M = cpu_gemv.MAX_M
GEMM_MAX_M = 0  # 0: the bf16 dot-product kernel is off
# Measured on an EPYC Zen 4 (2 cores), SmolLM2 shapes, cold weights: gemm_bf16.c streams weights
# as fast as gemv.c at 1-2 rows (26-29 GB/s) and beats it from 3; it beats oneDNN's bf16 GEMM
# 1.5-2x at 8-32 rows, evenly at 48-64; oneDNN wins from ~96 rows.
BF16_GEMM_MAX_M = 64
FUSED_OPS = False  # RMSNorm + residual, SiLU * up, rotary + KV write through kernels/ops.c


def choose_fused_ops(device: torch.device, act_dtype: torch.dtype) -> bool:
    """The fused element-wise kernels serve fp32 activations on a CPU."""
    global FUSED_OPS
    FUSED_OPS = device.type == "cpu" and act_dtype == torch.float32 and cpu_ops.available()
    return FUSED_OPS


def choose_skinny(device: torch.device, dtype: torch.dtype, shape=(1536, 576), reps: int = 24) -> str:
    """Turn the bf16 dot-product kernel on where the CPU has it; otherwise time F.linear against the
    C skinny kernel on weight-sized matrices at M=1 and keep the faster. Returns a line for the
    start-up summary."""
    global SKINNY, SKINNY_MAX_M, GEMM_MAX_M
    SKINNY, SKINNY_MAX_M, GEMM_MAX_M = "linear", cpu_gemv.MAX_M, 0
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return "torch (F.linear)"
    if not cpu_gemv.available():
        return f"torch (F.linear); C kernels unavailable: {cpu_gemv.unavailable_reason()}"
    if dtype == torch.bfloat16 and cpu_gemm.available():
        GEMM_MAX_M, SKINNY, SKINNY_MAX_M = BF16_GEMM_MAX_M, "linear", 0
        return f"bf16 dot-product C kernel (AVX512-BF16) for <= {GEMM_MAX_M} tokens, F.linear above"
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
    SKINNY = min(times, key=times.get)
    label = {"c": "C kernel", "linear": "F.linear"}
    return (f"{label[SKINNY]} for <= {SKINNY_MAX_M} tokens "
            f"({', '.join(f'{label[k]} {v * 1e6:.0f} us' for k, v in times.items())} per {shape[0]}x{shape[1]})")
