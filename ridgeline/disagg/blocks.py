"""Copies between a request's pool blocks and a flat payload buffer, over the same region views the
offload tier copies through (runner/kv_store.py block_regions): quantized formats travel as stored."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.layers.kv_cache import LayerKV
from ridgeline.runner.kv_store import block_regions


def payload_bytes(layers: list[LayerKV], num_blocks: int) -> int:
    return num_blocks * sum(r.shape[1] for r in block_regions(layers))


@torch.inference_mode()
def gather(layers: list[LayerKV], blocks: list[int], out: np.ndarray | None = None) -> np.ndarray:
    """The bytes of `blocks`, region after region (each region: block after block), into `out`
    (uint8 [payload_bytes], e.g. a shared-memory view) or a new array."""
    regions = block_regions(layers)
    nbytes = len(blocks) * sum(r.shape[1] for r in regions)
    if out is None:
        out = np.empty(nbytes, np.uint8)
    assert out.size == nbytes, f"payload buffer of {out.size} B for {nbytes} B of KV"
    dst = torch.from_numpy(out)
    idx = torch.tensor(blocks, dtype=torch.long, device=regions[0].device)
    off = 0
    for r in regions:
        n = len(blocks) * r.shape[1]
        dst[off:off + n].view(len(blocks), r.shape[1]).copy_(r.index_select(0, idx))
        off += n
    return out


@torch.inference_mode()
def scatter(layers: list[LayerKV], blocks: list[int], data: np.ndarray) -> None:
    """Write a payload's bytes (as `gather` laid them out) into `blocks` of this pool."""
    regions = block_regions(layers)
    src = torch.from_numpy(data)
    idx = torch.tensor(blocks, dtype=torch.long, device=regions[0].device)
    off = 0
    for r in regions:
        n = len(blocks) * r.shape[1]
        r.index_copy_(0, idx, src[off:off + n].view(len(blocks), r.shape[1]).to(r.device))
        off += n
