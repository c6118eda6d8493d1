"""Dense linear layer. On a CPU, its weight is repacked at load time for the C kernel chosen at
start-up (`ridgeline.layers.kernels`), or small batches go to the skinny kernel, where torch's CPU
GEMM is slow."""
from __future__ import annotations

from collections.abc import Callable

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
        self.packed: cpu_gemm.PackedWeight | None = None  # replaces weight after prepack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N]"""
        y = self.packed(x).to(x.dtype) if self.packed is not None else matmul(x, self.weight)
        return y if self.bias is None else y + self.bias

    def prepack(self) -> bool:
        """Swap the weight for its packed form where the chosen kernels want it (once loaded). A weight
        shared with another module (tied embeddings) stays there; this layer keeps the packed copy."""
        if self.packed is None and self.weight is not None and kernels.packs(self.weight):
            self.packed = cpu_gemm.PackedWeight(self.weight)
            self.weight = None
        return self.packed is not None


def prepack(model: nn.Module) -> int:
    """Repack every Linear of a loaded model that the chosen kernels want packed; returns how many."""
    return sum(m.prepack() for m in model.modules() if isinstance(m, Linear))


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T -> [M, N] in x's dtype, for an unpacked weight."""
    if kernels.SKINNY == "c" and x.shape[0] <= kernels.SKINNY_MAX_M:
        return cpu_gemv.gemv(x, w).to(x.dtype)
    if x.dtype == w.dtype:
        return F.linear(x, w)
    return F.linear(x.to(w.dtype), w).to(x.dtype)  # bf16 weights, fp32 activations (CPU): GEMM in bf16


def matmul_fn(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ w^T the way a Linear holding w computes it under the chosen kernels."""
    if kernels.packs(w):
        packed = cpu_gemm.PackedWeight(w)
        return lambda x: packed(x).to(x.dtype)
    return lambda x: matmul(x, w)
