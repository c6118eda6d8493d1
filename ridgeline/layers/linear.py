"""Dense linear layer with a per-machine choice of matrix-vector kernel for one-token batches.

At M=1 on a CPU, `F.linear` streams fp32 weights at about half the memory bandwidth; a multiply and
row-sum over the same [N, K] weight reads them faster. The choice is made once per process
(`ridgeline.layers.kernels`), never per call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.layers import kernels


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)  # [N, K]
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N]"""
        if x.shape[0] == 1 and kernels.GEMV == "mulsum":
            y = (self.weight * x).sum(-1, keepdim=True).T
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)
