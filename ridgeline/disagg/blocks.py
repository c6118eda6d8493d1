"""Copies between a request's pool blocks and a flat payload buffer, over the same region views the
offload tier copies through (runner/kv_store.py block_regions): quantized formats travel as stored.

A pool block is reused without being cleared, so the positions of a request's last block past its
prompt hold whatever an earlier request left there: `gather` and `scatter` zero them in the buffer
(every region: data and scales), so a payload carries exactly its prompt's KV."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.layers.kv_cache import LayerKV
from ridgeline.runner.kv_store import block_regions


def payload_bytes(layers: list[LayerKV], num_blocks: int) -> int:
    return num_blocks * sum(r.shape[1] for r in block_regions(layers))


def tail_ranges(layers: list[LayerKV], num_blocks: int, num_tokens: int) -> list[tuple[int, int]]:
    """[start, stop) byte ranges of a payload buffer past num_tokens: in each region, the end of the
    last block (a region's block is [block_size positions, bytes per position])."""
    block_size = layers[0].k.shape[1]
    used = num_tokens - (num_blocks - 1) * block_size
    assert 0 < used <= block_size, f"{num_tokens} tokens do not end in block {num_blocks - 1}"
    out, off = [], 0
    for r in block_regions(layers):
        per_block = r.shape[1]
        last = off + (num_blocks - 1) * per_block
        if used < block_size:
            out.append((last + used * (per_block // block_size), last + per_block))
        off += num_blocks * per_block
    return out


def zero_tail(layers: list[LayerKV], data: np.ndarray, num_blocks: int, num_tokens: int) -> None:
    for start, stop in tail_ranges(layers, num_blocks, num_tokens):
        data[start:stop] = 0


@torch.inference_mode()
def gather(layers: list[LayerKV], blocks: list[int], num_tokens: int, out: np.ndarray | None = None) -> np.ndarray:
    """The bytes of `blocks` holding num_tokens positions, region after region (each region: block
    after block), the last block's unused positions zeroed, into `out` (uint8 [payload_bytes], e.g.
    a shared-memory view) or a new array."""
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
    zero_tail(layers, out, len(blocks), num_tokens)
    return out


@torch.inference_mode()
def scatter(layers: list[LayerKV], blocks: list[int], data: np.ndarray, num_tokens: int) -> None:
    """Write a payload's bytes (as `gather` laid them out) into `blocks` of this pool, positions past
    num_tokens as zeros whatever the sender put there."""
    regions = block_regions(layers)
    if data.size != len(blocks) * sum(r.shape[1] for r in regions):
        raise ValueError(f"a payload of {data.size} B for {len(blocks)} blocks")
    zero_tail(layers, data, len(blocks), num_tokens)
    src = torch.from_numpy(data)
    idx = torch.tensor(blocks, dtype=torch.long, device=regions[0].device)
    off = 0
    for r in regions:
        n = len(blocks) * r.shape[1]
        r.index_copy_(0, idx, src[off:off + n].view(len(blocks), r.shape[1]).to(r.device))
        off += n
