import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype = torch.float32, fused: bool = False):
        """fused: the kernel plan runs RMSNorm (+ residual) in C for fp32 activations."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.fused = fused

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H]. With a residual: adds it first and returns (normed, new residual)."""
        if (self.fused and x.dtype == self.weight.dtype == torch.float32 and x.is_contiguous()
                and (residual is None or (residual.dtype == torch.float32 and residual.is_contiguous()))):
            out = cpu_ops.rmsnorm(x, self.weight, self.eps, residual)  # residual += x in place
            return out if residual is None else (out, residual)
        if residual is not None:
            x = residual = x + residual
        out = F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return out if residual is None else (out, residual)
