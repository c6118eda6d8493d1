"""A model's shape and what follows from it: parameter counts, bytes read per step, KV bytes, FLOPs.

All counts are derived from the config fields (layers, widths, heads, experts), never typed in.
Assumes the Llama-family block: gated MLP (gate, up, down), RMSNorm before attention and MLP.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention: one compressed latent (plus a shared rope key) is cached."""
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width
    vocab_size: int
    max_context: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    num_experts: int = 0  # routed experts per MoE layer; 0 = dense model
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_experts: int = 0  # each moe_intermediate_size wide (DeepSeek style)
    shared_expert_intermediate: int = 0  # one shared MLP of this width (Qwen-MoE style)
    dense_layers: int = 0  # leading layers of a MoE model that keep a dense MLP
    mla: MLA | None = None

    # ---- per-layer pieces ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def qk_dim(self) -> int:
        return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def v_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    def attn_params(self) -> int:
        h, H = self.hidden_size, self.num_heads
        if self.mla:
            m = self.mla
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * self.qk_dim if m.q_lora_rank \
                else h * H * self.qk_dim
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
                + m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + H * m.v_head_dim * h
        kv = self.num_kv_heads * self.head_dim
        bias = H * self.head_dim + 2 * kv if self.qkv_bias else 0
        return h * H * self.head_dim + 2 * h * kv + H * self.head_dim * h + bias

    def mlp_params(self, width: int) -> int:
        return 3 * self.hidden_size * width

    def expert_params(self) -> int:
        return self.mlp_params(self.moe_intermediate_size)

    def shared_params(self) -> int:
        shared = self.shared_experts * self.expert_params()
        if self.shared_expert_intermediate:
            shared += self.mlp_params(self.shared_expert_intermediate) + self.hidden_size  # + its gate
        return shared

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.is_moe else 0

    def _layers_params(self, experts: float) -> float:
        """All decoder layers when `experts` routed experts per MoE layer are counted."""
        h = self.hidden_size
        common = self.num_layers * (self.attn_params() + 2 * h)
        dense = (self.num_layers - self.moe_layers) * self.mlp_params(self.intermediate_size)
        moe = self.moe_layers * (experts * self.expert_params() + self.shared_params() + self.num_experts * h)
        return common + dense + moe

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    # ---- totals ----
    @property
    def num_params(self) -> int:
        return int(self._layers_params(self.num_experts)) + self.embed_params + self.head_params + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token uses (the published 'active' figure: embeddings included)."""
        k = self.experts_per_token if self.is_moe else 0
        return int(self._layers_params(k)) + self.embed_params + self.head_params + self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters one token multiplies by (the input embedding is a row lookup): FLOPs = 2 x this."""
        lookup = 0 if self.tie_embeddings else self.embed_params
        return self.active_params - lookup

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct routed experts per MoE layer for `tokens` tokens routed uniformly."""
        if not self.is_moe:
            return 0.0
        E, k = self.num_experts, self.experts_per_token
        return E * (1 - (1 - k / E) ** max(tokens, 1))

    def params_read(self, tokens: float) -> float:
        """Weights read by one forward over `tokens` tokens (each weight read once per step)."""
        lookup = 0 if self.tie_embeddings else self.embed_params
        experts = self.experts_touched(tokens) if self.is_moe else 0
        return self._layers_params(experts) + self.embed_params + self.head_params + self.hidden_size - lookup

    # ---- attention ----
    @property
    def kv_elems_per_token(self) -> int:
        """Elements cached per token over all layers: K and V per KV head, or the MLA latent + rope key."""
        if self.mla:
            return self.num_layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def kv_formula(self) -> tuple[str, str]:
        if self.mla:
            m = self.mla
            return ("layers * (kv_lora_rank + rope_dim) * bytes (MLA latent)",
                    f"{self.num_layers} * ({m.kv_lora_rank} + {m.qk_rope_head_dim})")
        return ("2 * layers * kv_heads * head_dim * bytes",
                f"2 * {self.num_layers} * {self.num_kv_heads} * {self.head_dim}")

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs for one query token against one cached token: QK^T and PV, all heads, all layers."""
        return 2 * self.num_layers * self.num_heads * (self.qk_dim + self.v_dim)

    def summary(self) -> dict:
        return {"name": self.name, "params": self.num_params, "active_params": self.active_params,
                "layers": self.num_layers, "hidden": self.hidden_size, "heads": self.num_heads,
                "kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "vocab": self.vocab_size,
                "max_context": self.max_context, "experts": self.num_experts,
                "experts_per_token": self.experts_per_token, "mla": self.mla is not None}
