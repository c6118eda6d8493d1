"""One layer's view of the paged KV cache, and the one place KV is written from Python.

The cache of all layers is one tensor [layers, 2 (K, V), blocks, block_size, kv_heads, head_dim]
laid out as the engine's KVCacheSpec says (ridgeline/kv_spec.py); each attention layer holds
a LayerKV over its slice. Writes go through `write` (torch) or `write_rope` (rotary + write in one
C pass, kernels/ops.c); the C decoder stack calls that same C function.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.kv_spec import KVCacheSpec
from ridgeline.kernels import cpu_ops

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
C_KV_FORMATS = {"f32": 0, "bf16": 1}  # what the C kernels read (paged_attention.c, ops.c)


def allocate_kv(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> torch.Tensor:
    """The whole cache, zero-filled: never-written slots must hold finite values (a masked key still
    multiplies its V by 0). On a CPU, zero pages mapped on first touch, on huge pages."""
    from ridgeline.utils import hugepages
    shape = spec.shape(num_blocks)
    dtype = TORCH_DTYPES[spec.format.name]
    if device.type == "cpu":
        nbytes = spec.bytes_per_block * num_blocks
        return torch.from_numpy(hugepages.zeroed(nbytes)).view(dtype).view(shape)
    return torch.zeros(shape, dtype=dtype, device=device)


@dataclass
class LayerKV:
    k: torch.Tensor  # [NB, bs, Hkv, D]
    v: torch.Tensor  # [NB, bs, Hkv, D]
    format: str  # a KV_FORMATS name

    @property
    def c_format(self) -> int | None:
        """The C kernels' code for this cache, or None where they cannot read it."""
        ok = self.k.device.type == "cpu" and self.k.is_contiguous() and self.v.is_contiguous()
        return C_KV_FORMATS.get(self.format) if ok else None

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, Hkv, D] into flat slots [T]."""
        Hkv, D = self.k.shape[2:]
        self.k.view(-1, Hkv, D).index_copy_(0, slots, k.to(self.k.dtype))
        self.v.view(-1, Hkv, D).index_copy_(0, slots, v.to(self.v.dtype))

    def write_rope(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, slots: torch.Tensor,
                   H: int, Hkv: int, D: int) -> None:
        """qkv [T, (H + 2 Hkv) D] fp32: q and k rotated in place, k and v written at slots (C)."""
        cpu_ops.rope_kv(qkv, positions, cos_sin, slots, self.k, self.v, H, Hkv, D, self.c_format)
