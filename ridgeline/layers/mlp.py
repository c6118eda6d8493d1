"""The gated MLP: down(act(gate(x)) * up(x)), gate and up fused in one Linear; act is SiLU (Llama,
Qwen, Phi-3) or the tanh approximation of GELU (Gemma)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_ops
from ridgeline.layers.linear import Linear
from ridgeline.layers.build_options import BuildOptions


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, opts: BuildOptions, prefix: str, activation: str = "silu"):
        super().__init__()
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"unknown MLP activation {activation!r}")
        self.activation = activation
        self.gate_up_proj = Linear(hidden, 2 * inter, opts.format_for(f"{prefix}.gate_up_proj"),
                                   act_dtype=opts.act_dtype, shard_sizes=[inter, inter], prefix=f"{prefix}.gate_up_proj")
        self.down_proj = Linear(inter, hidden, opts.format_for(f"{prefix}.down_proj"),
                                act_dtype=opts.act_dtype, prefix=f"{prefix}.down_proj")
        self.fused = opts.plan.fused_ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        gelu = self.activation == "gelu_tanh"
        if self.fused and gate_up.dtype == torch.float32 and gate_up.is_contiguous():
            return self.down_proj(cpu_ops.gelu_tanh_mul(gate_up) if gelu else cpu_ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj((F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up)
