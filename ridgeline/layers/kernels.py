"""Process-wide matmul kernel choices, decided once at engine start, then read-only.

On AVX-512 CPUs, fp32 weights (and bf16 ones with AVX512-BF16) are repacked at load time for the
packed-weight kernel (kernels/gemm_packed.c), which serves every batch size; a row's result then
does not depend on the batch it shares. Elsewhere, batches of up to SKINNY_MAX_M tokens go to the
skinny kernel (kernels/gemv.c) where it beats F.linear (timed at start-up), F.linear otherwise.
Measured on an EPYC Zen 4 (2 cores), SmolLM2 shapes, cold weights, packed kernel vs F.linear:
fp32 27 vs 13 GB/s of weights at 1 row, 216 vs 146-165 GFLOP/s at 256 rows; bf16 30 vs 13 GB/s at
1 row, 300 vs 140 GFLOP/s at 16 rows, 370-420 vs 260-370 at 64-256 rows.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ridgeline.kernels import cpu_gemm, cpu_gemv, cpu_ops

PACKED: frozenset = frozenset()  # weight dtypes that Linear.prepack() repacks for kernels/gemm_packed.c
SKINNY = "linear"  # "c" (kernels/gemv.c) or "linear", for unpacked weights
SKINNY_MAX_M = cpu_gemv.MAX_M
FUSED_OPS = False  # RMSNorm + residual, SiLU * up, rotary + KV write through kernels/ops.c


def choose_fused_ops(device: torch.device, act_dtype: torch.dtype) -> bool:
    """The fused element-wise kernels serve fp32 activations on a CPU."""
    global FUSED_OPS
    FUSED_OPS = device.type == "cpu" and act_dtype == torch.float32 and cpu_ops.available()
    return FUSED_OPS


def choose_matmul(device: torch.device, dtype: torch.dtype, shape=(1536, 576), reps: int = 24) -> str:
    """Pack weights where the CPU runs the packed kernel for `dtype`; otherwise time F.linear against the
    C skinny kernel on weight-sized matrices at M=1 and keep the faster. Returns a line for the
    start-up summary."""
    global PACKED, SKINNY
    PACKED, SKINNY = frozenset(), "linear"
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return "torch (F.linear)"
    if not cpu_gemv.available():
        return f"torch (F.linear); C kernels unavailable: {cpu_gemv.unavailable_reason()}"
    if cpu_gemm.available(dtype):
        PACKED = frozenset({dtype})
        isa = "AVX512-BF16" if dtype == torch.bfloat16 else "AVX-512"
        return f"packed-weight C GEMM ({isa}) at every batch size"
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


def packs(w: torch.Tensor) -> bool:
    """Whether the chosen kernels want this weight repacked."""
    return w.device.type == "cpu" and w.dtype in PACKED and w.dim() == 2
