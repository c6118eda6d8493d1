"""The two int4 checkpoint layouts of the hub, packed and unpacked (w = s * (q - z) per group; q, z 4-bit):

GPTQ (AutoGPTQ / vLLM `gptq`): per linear layer with weight [N, K]
    qweight  [K / 8, N] int32   8 consecutive k of one column n: bits 4j..4j+3 hold q[8i + j, n]
    qzeros   [K / G, N / 8] int32  8 consecutive n of one group: bits 4j.. hold z[g, 8c + j] - 1 (the
                                 "v1" checkpoint format; "gptq_v2" stores z itself)
    scales   [K / G, N] fp16
    g_idx    [K] int32          the group of each input column (i // G unless act-order reordered them)
AWQ GEMM (AutoAWQ `version: gemm`, vLLM `awq`):
    qweight  [K, N / 8] int32   8 consecutive n of one k, in the nibble order AWQ_ORDER: bits 4j..4j+3
                                hold column 8c + AWQ_ORDER[j]
    qzeros   [K / G, N / 8] int32  the same packing of z (no offset)
    scales   [K / G, N] fp16
Unpacked tensors here are the engine's orientation: q [N, K] uint8, scale and zero [N, K / G].
"""
from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(8, dtype=torch.int32) * 4


def pack_nibbles(v: torch.Tensor) -> torch.Tensor:
    """v [..., 8m] integers in [0, 15] -> [..., m] int32, element j of each 8 at bits 4j."""
    v = v.to(torch.int64).reshape(*v.shape[:-1], -1, 8)
    packed = (v << _SHIFTS.to(torch.int64)).sum(-1)
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    """[..., m] int32 -> [..., 8m] uint8 (the inverse of pack_nibbles)."""
    v = (p.to(torch.int32)[..., None] >> _SHIFTS) & 15
    return v.reshape(*p.shape[:-1], -1).to(torch.uint8)


def pack_gptq(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, g_idx: torch.Tensor | None,
              group: int) -> dict[str, torch.Tensor]:
    """q [N, K] uint8, scale [N, K/G] fp16, zero [N, K/G] int in [1, 15] -> the GPTQ v1 tensors."""
    N, K = q.shape
    if bool((zero < 1).any()) or bool((zero > 15).any()):
        raise ValueError("GPTQ's v1 layout stores z - 1: zero points must be in [1, 15]")
    g = torch.arange(K, dtype=torch.int32) // group if g_idx is None else g_idx.to(torch.int32)
    return {"qweight": pack_nibbles(q.t().reshape(K // 8, 8, N).transpose(1, 2)).squeeze(-1),
            "qzeros": pack_nibbles(zero.t().contiguous() - 1), "scales": scale.t().contiguous().to(torch.float16),
            "g_idx": g}


def unpack_gptq(t: dict[str, torch.Tensor], v2: bool = False) -> tuple[torch.Tensor, ...]:
    """GPTQ tensors -> (q [N, K] uint8, scale [N, K/G] fp16, zero [N, K/G] int32, g_idx [K] or None)."""
    qw = t["qweight"]
    K8, N = qw.shape
    q = unpack_nibbles(qw.t().contiguous())  # [N, K]: word i of column n holds k = 8i .. 8i + 7
    zero = unpack_nibbles(t["qzeros"]).to(torch.int32)[:, :N]
    if not v2:
        zero = zero + 1  # v1 stores z - 1 (a stored 15 reads as 16: still exact on the asymmetric grid)
    return q, t["scales"].t().contiguous().to(torch.float16), zero.t().contiguous(), t.get("g_idx")


def pack_awq(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> dict[str, torch.Tensor]:
    """q [N, K] uint8, scale [N, K/G] fp16, zero [N, K/G] int in [0, 15] -> the AWQ GEMM tensors."""
    order = _awq_columns(q.shape[0])
    return {"qweight": pack_nibbles(q.t()[:, order]), "qzeros": pack_nibbles(zero.t()[:, order]),
            "scales": scale.t().contiguous().to(torch.float16)}


def unpack_awq(t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AWQ GEMM tensors -> (q [N, K] uint8, scale [N, K/G] fp16, zero [N, K/G] int32)."""
    q, z = unpack_nibbles(t["qweight"]), unpack_nibbles(t["qzeros"]).to(torch.int32)
    inv = torch.argsort(_awq_columns(q.shape[1]))
    return (q[:, inv].t().contiguous(), t["scales"].t().contiguous().to(torch.float16),
            z[:, inv].t().contiguous())


def _awq_columns(N: int) -> torch.Tensor:
    """Packed position p holds column _awq_columns(N)[p]."""
    base = torch.arange(0, N, 8)[:, None]
    return (base + torch.tensor(AWQ_ORDER)[None, :]).reshape(-1)
