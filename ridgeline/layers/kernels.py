"""Process-wide kernel choices, decided once at engine start (measured), then read-only."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ridgeline.kernels import cpu_gemv

SKINNY = "linear"  # matmul for batches of <= cpu_gemv.MAX_M tokens: "c" (kernels/gemv.c) or "linear"


def choose_skinny(device: torch.device, dtype: torch.dtype, shape=(1536, 576), reps: int = 24) -> str:
    """Time F.linear against the C kernel on weight-sized matrices at M=1 and keep the faster.
    Returns a description for the start-up summary."""
    global SKINNY
    SKINNY = "linear"
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return "torch (F.linear)"
    if not cpu_gemv.available():
        return f"torch (F.linear); C kernel unavailable: {cpu_gemv.unavailable_reason()}"
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
    return (f"{label[SKINNY]} for <= {cpu_gemv.MAX_M} tokens "
            f"({', '.join(f'{label[k]} {v * 1e6:.0f} us' for k, v in times.items())} per {shape[0]}x{shape[1]})")
