"""What a prefill worker ships to a decode worker for one request: the prompt's token ids, the first
sampled token, the KV of every prompt position (all layers, the pool's own bytes: quantized blocks
stay quantized, scales beside them) and, for a seeded request, its sampler's generator state.

`data` holds, for each region of the pool in storage order (per layer: K data, K scales, V data,
V scales), the bytes of the request's blocks 0..num_blocks-1, block after block; the last block's
positions past the prompt are zero. A receiver accepts it only when `spec_key` equals its own
pool's: the same layers, KV heads, head dim, block size and formats.

On the wire (connector.py) a transfer is two frames: the header (`Header.meta`, a JSON object of
sizes, checked against the receiver's `Layout` before anything is allocated) and the body (`tail`:
the transfer id, the prompt ids as int32, the generator state; then the KV bytes, or nothing when
they travel in shared memory). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ridgeline.disagg.wire import Refused, check_transfer_id
from ridgeline.kv_spec import KVCacheSpec

MAX_RNG_BYTES = 64 * 1024  # a generator's state (a CPU torch.Generator's is 5056 bytes)
_IDS = np.dtype("<i4")


def spec_key(spec: KVCacheSpec) -> str:
    """Names a pool's layout: two pools with equal keys hold a block in the same bytes."""
    return (f"layers={spec.num_layers};kv_heads={spec.num_kv_heads};head_dim={spec.head_dim};"
            f"block={spec.block_size};k={spec.format.name};v={spec.v_format.name}")


@dataclass(frozen=True)
class Layout:
    """What a decode worker accepts: its pool's layout and the longest prompt it runs."""
    spec_key: str
    block_size: int
    bytes_per_block: int
    max_model_len: int

    @classmethod
    def of(cls, spec: KVCacheSpec, max_model_len: int) -> Layout:
        return cls(spec_key(spec), spec.block_size, spec.bytes_per_block, max_model_len)


@dataclass(frozen=True)
class Header:
    transfer_id: str  # issued by the decode worker that adopts it (wire.new_transfer_id)
    spec_key: str
    prompt_ids: list[int]
    first_token: int
    num_blocks: int  # blocks covering the prompt: ceil(len(prompt_ids) / block size)
    nbytes: int  # len(data) == num_blocks * bytes per block
    rng_state: list[int] | None = None  # the seeded request's generator state after its first token

    def meta(self) -> dict:
        """The header frame's fields (sizes; the ids and the state go in the body's tail)."""
        return {"transfer_id": self.transfer_id, "spec_key": self.spec_key, "num_tokens": len(self.prompt_ids),
                "first_token": self.first_token, "num_blocks": self.num_blocks, "nbytes": self.nbytes,
                "rng_bytes": -1 if self.rng_state is None else len(self.rng_state)}

    def tail(self) -> bytes:
        """The body's tagged part: the transfer id (binding the body to its header), ids, state."""
        rng = b"" if self.rng_state is None else bytes(self.rng_state)
        return self.transfer_id.encode() + np.asarray(self.prompt_ids, _IDS).tobytes() + rng

    @classmethod
    def from_wire(cls, meta: dict, tail: bytes) -> Header:
        """meta as check_meta returned it; Refused if tail does not belong to it."""
        tid, n, r = meta["transfer_id"], meta["num_tokens"], meta["rng_bytes"]
        if len(tail) != tail_bytes(meta) or tail[:32] != tid.encode():
            raise Refused("the body belongs to another transfer")
        ids = np.frombuffer(tail, _IDS, n, 32).tolist()
        rng = None if r < 0 else list(tail[32 + 4 * n:])
        return cls(tid, meta["spec_key"], ids, meta["first_token"], meta["num_blocks"], meta["nbytes"], rng)


def tail_bytes(meta: dict) -> int:
    return 32 + 4 * meta["num_tokens"] + max(0, meta["rng_bytes"])


def _int(meta: dict, name: str, low: int, high: int) -> int:
    v = meta.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise Refused(f"{name} {str(v)[:40]} is not an integer in [{low}, {high}]")
    return v


def check_meta(meta: dict, layout: Layout) -> dict:
    """A KV header frame's fields, checked against this worker's layout (nothing allocated yet):
    the transfer id's form, the layout, a prompt within max_model_len, and sizes that follow from it."""
    tid = check_transfer_id(meta.get("transfer_id"))
    if meta.get("spec_key") != layout.spec_key:
        raise Refused(f"KV layout {str(meta.get('spec_key'))[:200]!r} differs from this worker's ({layout.spec_key})")
    n = _int(meta, "num_tokens", 1, layout.max_model_len)
    blocks = -(-n // layout.block_size)
    _int(meta, "num_blocks", blocks, blocks)
    _int(meta, "nbytes", blocks * layout.bytes_per_block, blocks * layout.bytes_per_block)
    return {"transfer_id": tid, "spec_key": layout.spec_key, "num_tokens": n,
            "first_token": _int(meta, "first_token", 0, 2**31 - 1), "num_blocks": blocks,
            "nbytes": blocks * layout.bytes_per_block, "rng_bytes": _int(meta, "rng_bytes", -1, MAX_RNG_BYTES)}


@dataclass(eq=False)
class KVPayload:
    header: Header
    data: np.ndarray  # uint8 [nbytes]; may be a view of a shared-memory segment (see release)
    _release: Callable[[], None] | None = field(default=None, repr=False)
    # came over an authenticated connector: only then may its blocks enter the prefix cache
    authenticated: bool = False

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
        """Give back what holds `data` (a shared-memory segment, the inbox's byte budget); idempotent.
        Called once the blocks are written into a pool, or when the payload is dropped."""
        release, self._release = self._release, None
        self.data = np.empty(0, np.uint8)
        if release is not None:
            release()


def unusable(payload: KVPayload, key: str, prompt_ids: list[int], block_size: int, bytes_per_block: int) -> str | None:
    """Why a decode engine with pool layout `key` cannot start `prompt_ids` from this payload, or None."""
    h = payload.header
    if h.spec_key != key:
        return f"its KV layout ({h.spec_key}) differs from this engine's ({key})"
    if h.prompt_ids != list(prompt_ids):
        return "its prompt tokens differ from this request's"
    blocks = -(-len(prompt_ids) // block_size)
    if h.num_blocks != blocks or h.nbytes != blocks * bytes_per_block:
        return f"its header names {h.num_blocks} blocks of {h.nbytes} bytes, not the {blocks} this prompt fills"
    if h.nbytes != payload.data.size:
        return f"it carries {payload.data.size} bytes of KV, not the {h.nbytes} its header names"
    return None
