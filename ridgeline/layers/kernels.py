"""Process-wide kernel choices, decided once at engine start (measured or detected), then read-only."""
from __future__ import annotations

import time

import torch

GEMV = "linear"  # "linear" (F.linear) or "mulsum" ((W * x).sum(-1)) for one-token batches


def choose_gemv(device: torch.device, dtype: torch.dtype, shape=(1536, 576), reps: int = 20) -> str:
    """Time both formulations on a weight-sized matrix; keep the faster. Returns a description."""
    global GEMV
    if device.type != "cpu":
        GEMV = "linear"
        return "linear (accelerator)"
    w = torch.randn(*shape, dtype=dtype)
    ws = [w.clone() for _ in range(16)]  # more bytes than the caches hold, as in a real step
    x = torch.randn(1, shape[1], dtype=dtype)
    cands = {"linear": lambda w: torch.nn.functional.linear(x, w), "mulsum": lambda w: (w * x).sum(-1)}
    times = {}
    for name, fn in cands.items():
        for w in ws[:4]:
            fn(w)
        t = time.perf_counter()
        for i in range(reps):
            fn(ws[i % len(ws)])
        times[name] = (time.perf_counter() - t) / reps
    GEMV = min(times, key=times.get)
    return f"{GEMV} ({', '.join(f'{k} {v * 1e6:.0f} us' for k, v in times.items())} per {shape[0]}x{shape[1]})"
