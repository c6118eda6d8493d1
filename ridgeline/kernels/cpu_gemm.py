"""bf16-weight matmul for batched decode, y = x @ W^T on AVX512-BF16 (kernels/gemm_bf16.c)."""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu


def available() -> bool:
    """The library built and the CPU has AVX512-BF16 dot products."""
    lib = cpu.lib()
    return lib is not None and bool(lib.ridgeline_gemm_bf16_available())


def gemm_bf16(x: torch.Tensor, w: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """x [M, K] (any float dtype, rounded to bf16), w [N, K] contiguous bf16 on the CPU -> [M, N] fp32."""
    M, K = x.shape
    N = w.shape[0]
    if w.dtype != torch.bfloat16 or w.shape[1] != K:
        raise ValueError(f"gemm_bf16: want bf16 weights [N, {K}], got {w.dtype} {tuple(w.shape)}")
    xf = x.to(torch.float32).contiguous()
    y = torch.empty(M, N, dtype=torch.float32)
    rc = cpu.lib().ridgeline_gemm_bf16(w.data_ptr(), xf.data_ptr(), y.data_ptr(), M, N, K,
                                       threads or torch.get_num_threads())
    if rc:
        raise RuntimeError(f"gemm_bf16 failed ({rc}): M={M} N={N} K={K}")
    return y
