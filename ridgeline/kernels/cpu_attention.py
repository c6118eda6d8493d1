"""Attention over the paged KV cache without gathering it (kernels/paged_attention.c)."""
from __future__ import annotations

import torch

from ridgeline.kernels import cpu


def available() -> bool:
    return cpu.lib() is not None


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 key_lens: torch.Tensor, scale: float, window: int | None,
                 row_seq: torch.Tensor | None = None, kv_format: int | None = None,
                 k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                 tiled: bool = True, tile_len: torch.Tensor | None = None,
                 k0_offset: torch.Tensor | None = None, softcap: float | None = None,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [R, H, D]; caches [NB, bs, Hkv, units] stored as kv_format = K code | V code << 8
    (layers/kv_cache.py C_KV_FORMATS; default: fp32 or bf16 from their dtypes), quantized ones with
    their fp16 scales [NB, bs, Hkv, n]; block_tables [S, nb] int64; key_lens [R] int64
    -> [R, H*D] fp32. Row r attends to the first key_lens[r] cached positions of sequence
    row_seq[r] (default r): decode rows, or the rows of prefill chunks with key_lens = position + 1.
    tiled: prefill rows (row_seq given) go through the tiled kernel (paged_prefill.c) where it applies;
    False: every row through the per-row kernel (paged_attention.c). tile_len [S] int64 (prompt
    lengths): only rows with key_lens <= tile_len[row_seq] are tiled, the others take the per-row kernel.
    k0_offset [Hkv, D] fp32 contiguous: added to the dequantized key at position 0 of every sequence
    (a centered K stores that key minus a center of its own, layers/kv_cache.py). softcap: scores ->
    softcap * tanh(scores / softcap) before the softmax (Gemma 2). sinks [H] fp32 contiguous: one learned
    logit per query head that joins its softmax as a key with no value (GPT-OSS's attention sinks)."""
    if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous() or sinks.numel() != q.shape[1]):
        raise ValueError(f"sinks must be fp32 contiguous [{q.shape[1]}], got {sinks.dtype} {tuple(sinks.shape)}")
    B, H, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    qf = q.to(torch.float32).contiguous()
    if kv_format is None:
        kv_format = int(k_cache.dtype == torch.bfloat16) | int(v_cache.dtype == torch.bfloat16) << 8
    out = torch.empty(B, H * D, dtype=torch.float32)
    lib = cpu.lib()
    tables, rows, lens = block_tables.data_ptr(), _ptr(row_seq), key_lens.data_ptr()
    if tiled:
        rc = lib.ridgeline_paged_attention(qf.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _ptr(k_scale),
                                           _ptr(v_scale), _ptr(k0_offset), kv_format, tables, rows, lens,
                                           _ptr(tile_len), out.data_ptr(), B, H, Hkv, D, bs, block_tables.shape[1],
                                           window or 0, scale, softcap or 0.0, _ptr(sinks), torch.get_num_threads())
    else:
        rc = lib.ridgeline_paged_decode(qf.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _ptr(k_scale),
                                        _ptr(v_scale), _ptr(k0_offset), kv_format, tables, rows, lens, out.data_ptr(),
                                        B, H, Hkv, D, bs, block_tables.shape[1], window or 0, scale,
                                        softcap or 0.0, _ptr(sinks), torch.get_num_threads())
    if rc == -2:
        raise ValueError(f"paged_decode: unknown KV format code {kv_format}")
    if rc:
        raise MemoryError("paged_decode: could not allocate its buffers")
    return out


def decode_query_as_read(q: torch.Tensor, kv_format: int) -> torch.Tensor:
    """q [..., D] fp32 as the decode kernel's scores see it for this KV format: unchanged, rounded to
    bf16 (bf16 K and V: vdpbf16ps), or rounded to int16 codes with a power-of-two scale per query head
    (int8 K and V: K codes dotted in int32), so a reference over the same blocks can match it to fp32
    rounding."""
    how = cpu.lib().ridgeline_paged_decode_q_rounding(kv_format, q.shape[-1])
    if how == 1:
        return q.to(torch.bfloat16).float()
    if how == 2:
        _, x = torch.frexp(q.abs().amax(-1, keepdim=True))  # max|q| < 2^x
        e = (15 - x).clamp(-100, 100)
        return torch.ldexp(torch.round(torch.ldexp(q, e)).clamp(-32768, 32767), -e)
    return q


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
