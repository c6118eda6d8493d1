"""The KV cache spec: format, bytes per token (scales included), block layout. Owned here, once;
the engine's capacity, the advisor's KV arithmetic and the runner's allocation all read it.
Torch-free (the KV manager and scheduler import it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVFormat:
    name: str
    element_bytes: float  # per K or V element
    scale_bytes: int = 0  # per (token, kv head) and per K or V, for quantized formats


KV_FORMATS = {f.name: f for f in (KVFormat("f32", 4), KVFormat("bf16", 2), KVFormat("f16", 2))}


@dataclass(frozen=True)
class KVCacheSpec:
    format: KVFormat
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    layout: str = "layers x (K, V) x blocks x block_size x kv_heads x head_dim"

    @property
    def bytes_per_token(self) -> int:
        per_head = self.head_dim * self.format.element_bytes + self.format.scale_bytes
        return int(2 * self.num_layers * self.num_kv_heads * per_head)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    def num_blocks(self, kv_bytes: int) -> int:
        """Blocks that kv_bytes hold, plus block 0 (reserved: padded block tables point at it)."""
        return kv_bytes // self.bytes_per_block + 1

    def describe(self) -> str:
        return f"{self.format.name}, {self.bytes_per_token} B/token"
