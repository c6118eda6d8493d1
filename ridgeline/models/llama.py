"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2): one class, differences come from
ArchConfig (qkv bias, tied embeddings, sliding window via the attention mask, rope scaling)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_ops
from ridgeline.kernels.cpu_stack import DecoderStack
from ridgeline.layers import kernels
from ridgeline.layers.attention import Attention
from ridgeline.layers.linear import Linear
from ridgeline.layers.norm import RMSNorm
from ridgeline.layers.rotary import Rotary, interleave_rows
from ridgeline.runner.forward_context import get_forward_context
from ridgeline.weights.hf_config import ArchConfig


class SelfAttention(nn.Module):
    def __init__(self, cfg: ArchConfig, rotary: Rotary, backend: str):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, (self.h + 2 * self.hkv) * self.d, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.h * self.d, cfg.hidden_size, bias=cfg.o_bias)
        self.rotary = rotary
        self.attn = Attention(self.h, self.hkv, self.d, backend, cfg.sliding_window)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        if (kernels.FUSED_OPS and qkv.dtype == torch.float32 and qkv.is_contiguous()
                and self.attn.k_cache.dtype in (torch.float32, torch.bfloat16)):
            cpu_ops.rope_kv(qkv, positions, self.rotary.cos_sin, get_forward_context().slot_mapping,
                            self.attn.k_cache, self.attn.v_cache, self.h, self.hkv, self.d)
            return self.o_proj(self.attn.attend(qkv[:, :self.h * self.d].view(T, self.h, self.d)))
        q, k, v = qkv.split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k = self.rotary(positions, q.view(T, self.h, self.d), k.view(T, self.hkv, self.d))
        return self.o_proj(self.attn(q, k, v.view(T, self.hkv, self.d)))


class MLP(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if kernels.FUSED_OPS and gate_up.dtype == torch.float32 and gate_up.is_contiguous():
            return self.down_proj(cpu_ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, rotary: Rotary, backend: str):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, rotary, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, positions, x, residual):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Model(nn.Module):
    def __init__(self, cfg: ArchConfig, max_positions: int, backend: str):
        super().__init__()
        rotary = Rotary(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling_dict)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary, backend) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.act_dtype = torch.float32
        self.stack: DecoderStack | None = None  # the same layers in one C call, where supported

    def bind_stack(self) -> bool:
        """Once weights are packed and KV caches bound: run the layers through the C stack if it can."""
        self.stack = DecoderStack(self) if DecoderStack.supported(self) else None
        return self.stack is not None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden] (before the last norm's residual)."""
        x, residual = self.embed_tokens(input_ids).to(self.act_dtype), None
        if self.stack is not None:
            ctx = get_forward_context()
            if self.stack.serves(x, ctx):
                return self.stack(x, positions, ctx)
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    # HF checkpoint name -> (our parameter, shard index) for the fused projections
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, cfg: ArchConfig, max_positions: int, backend: str = "auto"):
        super().__init__()
        self.cfg = cfg
        self.model = Model(cfg, max_positions, backend)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    @property
    def act_dtype(self) -> torch.dtype:
        return self.model.act_dtype

    @act_dtype.setter
    def act_dtype(self, value: torch.dtype) -> None:
        self.model.act_dtype = value

    def transform_weight(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Checkpoint tensor -> our layout: q/k rows to interleaved rotary pairs."""
        if ".q_proj." in name or ".k_proj." in name:
            return interleave_rows(tensor, self.cfg.head_dim)
        return tensor

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] (only the rows that sample) -> logits [S, V] float32."""
        return self.lm_head(hidden).float()

    def shard_sizes(self, fused: str) -> list[int]:
        c = self.cfg
        if fused == "qkv_proj":
            return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        return [c.intermediate_size, c.intermediate_size]
