"""Skinny matmul y = x @ W^T for 1-8 token batches (kernels/gemv.c)."""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu

MAX_M = 8


def available() -> bool:
    return cpu.lib() is not None


def unavailable_reason() -> str | None:
    return cpu.unavailable_reason()


def gemv(x: torch.Tensor, w: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """x [M, K] (any float dtype, M <= 8), w [N, K] contiguous bf16 or fp32 on the CPU -> [M, N] fp32."""
    M, K = x.shape
    N = w.shape[0]
    xf = x.to(torch.float32).contiguous()
    y = torch.empty(M, N, dtype=torch.float32)
    rc = cpu.lib().ridgeline_gemv(w.data_ptr(), int(w.dtype == torch.bfloat16), xf.data_ptr(), y.data_ptr(),
                                  M, N, K, threads or torch.get_num_threads())
    if rc:
        raise ValueError(f"gemv: M={M} out of range 1..{MAX_M}")
    return y
