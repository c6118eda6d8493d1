"""Fused element-wise layer steps on fp32 CPU activations (kernels/ops.c): RMSNorm with the residual
add, SiLU-and-multiply, and rotary + KV-cache write."""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu


def available() -> bool:
    return cpu.lib() is not None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x [T, H] fp32 contiguous; weight [H] fp32. With a residual [T, H]: it becomes residual + x
    (in place) and is normalized. Returns the normalized [T, H]."""
    T, H = x.shape
    out = torch.empty_like(x)
    cpu.lib().ridgeline_rmsnorm(x.data_ptr(), residual.data_ptr() if residual is not None else None,
                                weight.data_ptr(), out.data_ptr(), T, H, eps, torch.get_num_threads())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] fp32 contiguous -> silu(gate) * up [T, I]."""
    T, I2 = gate_up.shape
    out = torch.empty(T, I2 // 2, dtype=torch.float32)
    cpu.lib().ridgeline_silu_mul(gate_up.data_ptr(), out.data_ptr(), T, I2 // 2, torch.get_num_threads())
    return out


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] fp32 contiguous -> gelu_tanh(gate) * up [T, I]."""
    T, I2 = gate_up.shape
    out = torch.empty(T, I2 // 2, dtype=torch.float32)
    cpu.lib().ridgeline_gelu_tanh_mul(gate_up.data_ptr(), out.data_ptr(), T, I2 // 2, torch.get_num_threads())
    return out


def swiglu_clamp_mul(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gate_up [T, 2I] fp32 contiguous -> GPT-OSS's clamped SwiGLU [T, I]: g = min(gate, limit),
    u = clamp(up, -limit, limit), g * sigmoid(alpha * g) * (u + 1)."""
    T, I2 = gate_up.shape
    out = torch.empty(T, I2 // 2, dtype=torch.float32)
    cpu.lib().ridgeline_swiglu_clamp_mul(gate_up.data_ptr(), out.data_ptr(), T, I2 // 2, alpha, limit,
                                         torch.get_num_threads())
    return out


def qk_norm(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, H: int, Hkv: int,
            D: int) -> None:
    """qkv [T, (H + 2 Hkv) D] fp32 contiguous: every q head normed with q_weight [D] and every k head
    with k_weight [D] (fp32), in place."""
    cpu.lib().ridgeline_qk_norm(qkv.data_ptr(), qkv.shape[0], H, Hkv, D, q_weight.data_ptr(), k_weight.data_ptr(),
                                eps, torch.get_num_threads())


def rope_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, slots: torch.Tensor,
            k_cache: torch.Tensor, v_cache: torch.Tensor, H: int, Hkv: int, D: int, kv_format: int,
            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
            k_centers: torch.Tensor | None = None) -> None:
    """qkv [T, (H + 2 Hkv) D] fp32 contiguous: q and k rotated in place (pairs interleaved), k and v
    written to the caches [NB, bs, Hkv, units] at slots [T], stored as kv_format = K code | V code << 8
    (layers/kv_cache.py C_KV_FORMATS), quantized ones with their fp16 scales [NB, bs, Hkv, n].
    cos_sin [P, D/2, 2] fp32; positions and slots int64. k_centers [2 or more, Hkv, D] fp32 contiguous:
    row 0 subtracted from k first, row 1 instead from the k at position 0."""
    rc = cpu.lib().ridgeline_rope_kv(qkv.data_ptr(), qkv.shape[0], H, Hkv, D, positions.data_ptr(),
                                     cos_sin.data_ptr(), slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                     _ptr(k_scale), _ptr(v_scale), kv_format, _ptr(k_centers),
                                     torch.get_num_threads())
    if rc:
        raise ValueError(f"rope_kv: unknown KV format code {kv_format}")


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


EMBED_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # kv_quant.h's codes


def embed(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ids [T] int64 of table [V, H] (contiguous, one of EMBED_FORMATS) as fp32 [T, H]: torch's
    lookup and conversion, in one C call (a step's first tensor op would otherwise walk torch's
    dispatch on caches the previous step's weight stream flushed). IndexError for an id outside."""
    V, H = table.shape
    ids = ids.to(torch.int64).contiguous()  # no copy when it already is
    T = ids.shape[0]
    out = torch.empty(T, H, dtype=torch.float32)
    if cpu.lib().ridgeline_embed(table.data_ptr(), EMBED_FORMATS[table.dtype], ids.data_ptr(), T, V, H,
                                 out.data_ptr()):
        raise IndexError(f"a token id in {ids.tolist()} is outside the embedding table's {V} rows")
    return out
