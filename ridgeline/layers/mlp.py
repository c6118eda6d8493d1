"""The gated MLP: down(act(gate(x)) * up(x)), gate and up fused in one Linear; act is SiLU (Llama,
Qwen, Phi-3) or the tanh approximation of GELU (Gemma). GPT-OSS's experts: biases on both projections
and the clamped SwiGLU, g = min(gate, limit), u = clamp(up, -limit, limit), g sigmoid(alpha g) (u + 1)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_ops
from ridgeline.layers.linear import Linear
from ridgeline.layers.build_options import BuildOptions


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, opts: BuildOptions, prefix: str, activation: str = "silu",
                 bias: bool = False, act_params: tuple[float, ...] = ()):
        super().__init__()
        if activation not in ("silu", "gelu_tanh", "swiglu_clamp"):
            raise ValueError(f"unknown MLP activation {activation!r}")
        if activation == "swiglu_clamp" and len(act_params) != 2:
            raise ValueError("the clamped SwiGLU takes (alpha, limit)")
        self.activation = activation
        self.alpha, self.limit = act_params if activation == "swiglu_clamp" else (0.0, 0.0)
        # fp32 [alpha, limit] for the C kernels' descriptors (a plain tensor: not a parameter to load)
        self.act_params = torch.tensor([self.alpha, self.limit], dtype=torch.float32, device="cpu")
        self.gate_up_proj = Linear(hidden, 2 * inter, opts.format_for(f"{prefix}.gate_up_proj"), bias,
                                   act_dtype=opts.act_dtype, shard_sizes=[inter, inter], prefix=f"{prefix}.gate_up_proj")
        self.down_proj = Linear(inter, hidden, opts.format_for(f"{prefix}.down_proj"), bias,
                                act_dtype=opts.act_dtype, prefix=f"{prefix}.down_proj")
        self.fused = opts.plan.fused_ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        act = self.activation
        if self.fused and gate_up.dtype == torch.float32 and gate_up.is_contiguous():
            if act == "swiglu_clamp":
                return self.down_proj(cpu_ops.swiglu_clamp_mul(gate_up, self.alpha, self.limit))
            return self.down_proj(cpu_ops.gelu_tanh_mul(gate_up) if act == "gelu_tanh" else cpu_ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        if act == "swiglu_clamp":
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            return self.down_proj((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))
        return self.down_proj((F.gelu(gate, approximate="tanh") if act == "gelu_tanh" else F.silu(gate)) * up)
