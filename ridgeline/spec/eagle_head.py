"""The EAGLE-style draft head (EAGLE-1): for position j, fc over [embedding of token j+1, the target's
hidden state at j] -> one decoder layer (causal attention over the head's own past positions) ->
a feature f_j that stands in for the target's hidden state at j+1; the target's own LM head (or the
rows of it for a reduced vocabulary of frequent tokens, as FR-Spec) turns f_j into logits for token
j+2. Drafting a chain feeds f_j back as the hidden state of position j+1.

"Hidden state" is the target's last layer after its final norm: what its LM head reads.

Plain torch, the same code for training (whole sequences, `forward`) and drafting (a few new
positions per request against a per-request K/V cache, `step`). Shapes: H hidden, h/hkv heads/KV
heads of size d, I the MLP width. K/V caches hold rotated keys: [positions, hkv, d]."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float

    def to_dict(self) -> dict:
        return asdict(self)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] rotated by position (halves layout); cos, sin [T, 1, d/2]."""
    d = x.shape[-1]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        H, h, hkv, d, I = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        self.fc = nn.Linear(2 * H, H)
        self.attn_norm = nn.RMSNorm(H, eps=cfg.rms_norm_eps)
        self.qkv = nn.Linear(H, (h + 2 * hkv) * d, bias=False)
        self.o = nn.Linear(h * d, H, bias=False)
        self.mlp_norm = nn.RMSNorm(H, eps=cfg.rms_norm_eps)
        self.gate_up = nn.Linear(H, 2 * I, bias=False)
        self.down = nn.Linear(I, H, bias=False)
        # not saved: a function of the config
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        c = self.cfg
        q, k, v = self.qkv(self.attn_norm(x)).split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                                                      c.num_kv_heads * c.head_dim], -1)
        T = x.shape[0]
        ang = (positions.float()[:, None] * self.inv_freq[None])[:, None]  # [T, 1, d/2]
        cos, sin = ang.cos(), ang.sin()
        q = _rope(q.view(T, c.num_heads, c.head_dim), cos, sin)
        k = _rope(k.view(T, c.num_kv_heads, c.head_dim), cos, sin)
        return q, k, v.view(T, c.num_kv_heads, c.head_dim)

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + self.o(attn.reshape(x.shape[0], -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)

    def _attend(self, q, k, v, causal_offset: int) -> torch.Tensor:
        """q [n, h, d] at the last n of the m key positions k, v [m, hkv, d] -> [n, h, d]."""
        n, m = q.shape[0], k.shape[0]
        # one query (a drafting step) sees every key: no mask to build
        mask = None if n == 1 else torch.ones(n, m, dtype=torch.bool, device=q.device).tril(causal_offset)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=mask, enable_gqa=True)
        return out.transpose(0, 1)

    def forward(self, hidden: torch.Tensor, next_emb: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One sequence, whole (training): hidden, next_emb [T, H] (the target's hidden at j, the
        embedding of token j+1), positions [T] -> features [T, H] (f_j ~ hidden at j+1)."""
        x = self.fc(torch.cat([next_emb, hidden], -1))
        q, k, v = self._qkv(x, positions)
        return self._finish(x, self._attend(q, k, v, 0))

    def step(self, hidden: torch.Tensor, next_emb: torch.Tensor, positions: torch.Tensor,
             caches: list[tuple[torch.Tensor, torch.Tensor]], counts: list[int]) -> tuple[torch.Tensor, list]:
        """Drafting: new positions of several requests, concatenated (counts[i] rows of request i, in
        order, after its cache caches[i] = (K, V)). Returns (features [sum(counts), H], the caches
        with the new positions appended)."""
        x = self.fc(torch.cat([next_emb, hidden], -1))
        q, k, v = self._qkv(x, positions)
        outs, new_caches, row = [], [], 0
        for (ck, cv), n in zip(caches, counts):
            kk, vv = torch.cat([ck, k[row:row + n]]), torch.cat([cv, v[row:row + n]])
            outs.append(self._attend(q[row:row + n], kk, vv, kk.shape[0] - n))
            new_caches.append((kk, vv))
            row += n
        return self._finish(x, torch.cat(outs)), new_caches

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        z = torch.empty(0, c.num_kv_heads, c.head_dim, dtype=self.fc.weight.dtype, device=self.fc.weight.device)
        return z, z
