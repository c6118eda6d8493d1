"""Packed-weight matmul y = x @ W^T on AVX-512 CPUs (kernels/gemm_packed.c), for fp32 and bf16 W.

W [N, K] is repacked once, at load time, into groups of NC output columns laid out k-major, so a
group streams contiguously and its columns sit along vector lanes. One kernel serves every batch
size, from single-token decode (weight streaming) to prefill chunks (compute), and a row's result
does not depend on the other rows in the batch.
"""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def available(dtype: torch.dtype) -> bool:
    """The library built and the CPU runs the packed kernel for weights of this dtype."""
    lib = cpu.lib()
    return dtype in _DTYPES and lib is not None and bool(lib.ridgeline_packed_available(_DTYPES[dtype]))


class PackedWeight:
    """A [N, K] fp32 or bf16 CPU weight in the packed layout; calling it computes x @ W^T in fp32."""

    def __init__(self, w: torch.Tensor):
        if w.dim() != 2 or w.dtype not in _DTYPES or w.device.type != "cpu":
            raise ValueError(f"packed matmul: want a 2-D fp32/bf16 CPU weight, got {w.dtype} {tuple(w.shape)} "
                             f"on {w.device}")
        lib = cpu.lib()
        self.N, self.K = w.shape
        self.dtype = w.dtype
        nc = lib.ridgeline_packed_cols()
        groups = -(-self.N // nc)
        w = w.contiguous()
        if w.dtype == torch.float32:
            self.data = torch.empty(groups * self.K * nc)
            lib.ridgeline_pack_f32(w.data_ptr(), self.data.data_ptr(), self.N, self.K)
            self._gemm = lib.ridgeline_gemm_f32p
        else:
            self.data = torch.empty(groups * ((self.K + 1) // 2) * nc * 2, dtype=torch.bfloat16)
            lib.ridgeline_pack_bf16(w.data_ptr(), self.data.data_ptr(), self.N, self.K)
            self._gemm = lib.ridgeline_gemm_bf16p

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def __call__(self, x: torch.Tensor, threads: int | None = None) -> torch.Tensor:
        """x [M, K] (any float dtype; rounded to bf16 for bf16 W) -> [M, N] fp32."""
        return call_matmul(x, self.N, self.K, "packed matmul", threads,
                           lambda xf, y, M, nt: self._gemm(self.data.data_ptr(), xf.data_ptr(), y.data_ptr(), M,
                                                           self.N, self.K, nt))


def call_matmul(x: torch.Tensor, N: int, K: int, what: str, threads: int | None, gemm) -> torch.Tensor:
    """What every packed-weight matmul does around its kernel: x [M, K] -> y [M, N] fp32, with
    gemm(x fp32 contiguous, y, M, threads) -> 0 or an error code."""
    M, k = x.shape
    if k != K:
        raise ValueError(f"{what}: x has {k} columns, W has {K}")
    xf = x.to(torch.float32).contiguous()
    y = torch.empty(M, N, dtype=torch.float32)
    if M:
        rc = gemm(xf, y, M, threads or torch.get_num_threads())
        if rc:
            raise RuntimeError(f"{what} failed ({rc}): M={M} N={N} K={K}")
    return y
