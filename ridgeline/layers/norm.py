import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H]. With a residual: adds it first and returns (normed, new residual)."""
        if residual is not None:
            x = residual = x + residual
        out = F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return out if residual is None else (out, residual)
