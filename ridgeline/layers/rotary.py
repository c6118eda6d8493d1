"""Rotary position embedding (scaled as layers/rope_scaling.py says), applied as a complex multiply.

Layout: q/k heads are stored with rotary pairs interleaved (dims 2i, 2i+1), the GGUF/Meta layout;
`interleave_rows` converts HF's rotate-half weight rows to it at load time. Attention scores are
unchanged by this (q and k are permuted alike).

Partial rotary (rotary_dim < head_dim, Phi-4-mini): only a head's first rotary_dim dims rotate; the
table's other pairs have angle 0 and magnitude 1, so every kernel that rotates by the table leaves
them exactly as they are (x * 1 - y * 0 = x).
"""
from __future__ import annotations

import torch
from torch import nn

from ridgeline.layers.rope_scaling import inv_freq


def interleave_rows(w: torch.Tensor, head_dim: int, rotary_dim: int = 0) -> torch.Tensor:
    """Rows of a q/k projection (weight [heads*D, K] or bias [heads*D]) from rotate-half order
    (i, i + R/2) to interleaved pairs (2i, 2i + 1) over each head's first R = rotary_dim (0: all D)
    rows; the rest stay where they are."""
    half = (rotary_dim or head_dim) // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
    perm = torch.cat([perm, torch.arange(2 * half, head_dim)])
    shape = w.shape
    return w.reshape(-1, head_dim, *shape[1:])[:, perm].reshape(shape)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None, rotary_dim: int = 0):
        super().__init__()
        self.args = (head_dim, max_positions, theta, scaling, rotary_dim or head_dim)
        self.cis = torch.empty(0)  # [P, D/2] complex64
        self.cos_sin = torch.empty(0)  # the same memory as [P, D/2, 2] float32 (cos, sin)
        self._positions: torch.Tensor | None = None
        self._step_cis: torch.Tensor | None = None

    def init_tables(self, device: torch.device) -> None:
        head_dim, max_positions, theta, scaling, rot = self.args
        inv, att = inv_freq(rot, theta, scaling, max_positions)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64, device="cpu"), inv)
        # |cis| = the attention factor (YaRN: q and k both scaled by it, as transformers does)
        mag = torch.full_like(freqs, att)
        if rot < head_dim:  # the pairs that do not rotate: angle 0, magnitude 1
            pad = torch.zeros(max_positions, (head_dim - rot) // 2, dtype=torch.float64)
            freqs, mag = torch.cat([freqs, pad], dim=1), torch.cat([mag, pad + 1.0], dim=1)
        self.cis = torch.polar(mag, freqs).to(torch.complex64).to(device)
        self.cos_sin = torch.view_as_real(self.cis)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [T]; q [T, H, D], k [T, Hkv, D] (pairs interleaved) -> rotated, same dtype."""
        if positions is not self._positions:  # every layer of a step shares one positions tensor
            self._positions, self._step_cis = positions, self.cis[positions].unsqueeze(1)  # [T, 1, D/2]
        return _rotate(q, self._step_cis), _rotate(k, self._step_cis)


def _rotate(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    T, H, D = x.shape
    xc = torch.view_as_complex(x.float().reshape(T, H, D // 2, 2))
    return torch.view_as_real(xc * cis).reshape(T, H, D).to(x.dtype)
