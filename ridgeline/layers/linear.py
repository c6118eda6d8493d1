"""Dense linear layer. On a CPU, batches of a few tokens (decode) go to the C kernels chosen at
start-up (`ridgeline.layers.kernels`), where torch's CPU GEMM is slow at small M."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_gemm, cpu_gemv
from ridgeline.layers import kernels


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)  # [N, K]
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N]"""
        y = matmul(x, self.weight)
        return y if self.bias is None else y + self.bias


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T -> [M, N] in x's dtype, through the kernel chosen for M."""
    m = x.shape[0]
    if kernels.SKINNY == "c" and m <= kernels.SKINNY_MAX_M:
        return cpu_gemv.gemv(x, w).to(x.dtype)
    if m <= kernels.GEMM_MAX_M and w.dtype == torch.bfloat16:
        return cpu_gemm.gemm_bf16(x, w).to(x.dtype)
    if x.dtype == w.dtype:
        return F.linear(x, w)
    return F.linear(x.to(w.dtype), w).to(x.dtype)  # bf16 weights, fp32 activations (CPU): GEMM in bf16
