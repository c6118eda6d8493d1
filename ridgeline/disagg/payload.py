"""What a prefill worker ships to a decode worker for one request: the prompt's token ids, the first
sampled token, the KV of every prompt position (all layers, the pool's own bytes: quantized blocks
stay quantized, scales beside them) and, for a seeded request, its sampler's generator state.

On the wire (connector.py) a payload is a JSON header (`Header`) and `data`: for each region of the
pool in storage order (per layer: K data, K scales, V data, V scales) the bytes of the request's
blocks 0..num_blocks-1, block after block. A receiver accepts it only when `spec_key` equals its own
pool's: the same layers, KV heads, head dim, block size and formats. Torch-free."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ridgeline.kv_spec import KVCacheSpec


def spec_key(spec: KVCacheSpec) -> str:
    """Names a pool's layout: two pools with equal keys hold a block in the same bytes."""
    return (f"layers={spec.num_layers};kv_heads={spec.num_kv_heads};head_dim={spec.head_dim};"
            f"block={spec.block_size};k={spec.format.name};v={spec.v_format.name}")


@dataclass(frozen=True)
class Header:
    transfer_id: str  # chosen by whoever pairs the prefill and the decode of one request
    spec_key: str
    prompt_ids: list[int]
    first_token: int
    num_blocks: int  # blocks covering the prompt: ceil(len(prompt_ids) / block size)
    nbytes: int  # len(data) == num_blocks * bytes per block
    rng_state: list[int] | None = None  # the seeded request's generator state after its first token

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Header:
        d = json.loads(raw)
        return cls(str(d["transfer_id"]), str(d["spec_key"]), [int(t) for t in d["prompt_ids"]],
                   int(d["first_token"]), int(d["num_blocks"]), int(d["nbytes"]),
                   None if d.get("rng_state") is None else [int(b) for b in d["rng_state"]])


@dataclass(eq=False)
class KVPayload:
    header: Header
    data: np.ndarray  # uint8 [nbytes]; may be a view of a shared-memory segment (see release)
    _release: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def transfer_id(self) -> str:
        return self.header.transfer_id

    @property
    def num_tokens(self) -> int:
        return len(self.header.prompt_ids)

    @property
    def released(self) -> bool:
        return self.data.size != self.header.nbytes

    def release(self) -> None:
        """Give back what holds `data` (a shared-memory segment); idempotent. Called once the blocks
        are written into a pool, or when the payload is dropped."""
        release, self._release = self._release, None
        self.data = np.empty(0, np.uint8)
        if release is not None:
            release()


def unusable(payload: KVPayload, key: str, prompt_ids: list[int]) -> str | None:
    """Why a decode engine with pool layout `key` cannot start `prompt_ids` from this payload, or None."""
    h = payload.header
    if h.spec_key != key:
        return f"its KV layout ({h.spec_key}) differs from this engine's ({key})"
    if h.prompt_ids != list(prompt_ids):
        return "its prompt tokens differ from this request's"
    if h.nbytes != payload.data.size:
        return f"it carries {payload.data.size} bytes of KV, not the {h.nbytes} its header names"
    return None
