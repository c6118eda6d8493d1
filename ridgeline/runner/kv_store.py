"""The second KV tier's storage: one preallocated slab of slots, each the bytes of one pool block
(every layer's K data, K scales, V data, V scales exactly as the pool stores them, so quantized
blocks stay quantized), and the copies between pool blocks and slots that a plan's TierCopies name.

- cpu:  host memory (pinned when the pool is on a GPU, so copies can run at the link's rate);
- disk: one file preallocated to its full size (posix_fallocate: a write can never find the disk
        full), memory-mapped, unlinked at once (it goes away with the process).
The KV manager's TierIndex decides what goes where; this file only copies.
"""
from __future__ import annotations

import logging
import mmap
import os
import shutil
import tempfile
import time

import numpy as np
import torch

from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.step_plan import TierCopies
from ridgeline.layers.kv_cache import LayerKV

log = logging.getLogger(__name__)
OFFLOAD_KINDS = ("none", "cpu", "disk")


class KVStoreError(RidgelineError):
    """A copy to or from the offload store failed: the step's loads cannot be trusted."""


class KVStore:
    def __init__(self, kind: str, slab: torch.Tensor, layers: list[LayerKV], where: str):
        self.kind, self.slab, self.where = kind, slab, where  # slab [slots, block bytes] uint8
        self.regions = block_regions(layers)
        if sum(r.shape[1] for r in self.regions) != slab.shape[1]:
            raise ValueError("the offload slot size differs from the pool's block size")

    @property
    def num_slots(self) -> int:
        return self.slab.shape[0]

    def run(self, copies: TierCopies) -> tuple[int, float]:
        """Every store, then every load; returns (bytes moved, seconds). KVStoreError if one fails."""
        t0 = time.perf_counter()
        try:
            if copies.stores:
                self._copy(copies.stores, store=True)
            if copies.loads:
                self._copy([(b, s) for s, b in copies.loads], store=False)
        except Exception as e:  # an I/O error on the mapping, a device error: nothing loaded is valid
            raise KVStoreError(f"KV offload ({self.kind}) copy failed: {e}") from e
        n = (len(copies.stores) + len(copies.loads)) * self.slab.shape[1]
        return n, time.perf_counter() - t0

    def _copy(self, pairs: list[tuple[int, int]], store: bool) -> None:
        blocks = torch.tensor([b for b, _ in pairs], dtype=torch.long)
        slots = torch.tensor([s for _, s in pairs], dtype=torch.long)
        dev_blocks = blocks.to(self.regions[0].device)
        off = 0
        for r in self.regions:
            n = r.shape[1]
            if store:
                self.slab[slots, off:off + n] = r.index_select(0, dev_blocks).to(self.slab.device)
            else:
                r.index_copy_(0, dev_blocks, self.slab[slots, off:off + n].to(r.device, non_blocking=False))
            off += n


def block_regions(layers: list[LayerKV]) -> list[torch.Tensor]:
    """Every region of the pool as [pool blocks, its bytes per block] uint8 views, in storage order
    (per layer: K data, K scales, V data, V scales); a block's bytes over all regions are exactly
    what the pool holds for it, quantized formats with their scales."""
    return [_bytes_view(t) for kv in layers for t in (kv.k, kv.k_scale, kv.v, kv.v_scale) if t is not None]


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).reshape(t.shape[0], -1)


def create_store(kind: str, size: int, block_bytes: int, layers: list[LayerKV], device: torch.device,
                 directory: str | None, free_memory: int) -> KVStore | None:
    """The offload store of `size` bytes (whole blocks), or None where the disk cannot be written (a
    warning; the engine then recomputes as without a tier). A size over the free memory (cpu) or disk
    space (disk) is an InvalidRequestError naming both."""
    slots = size // block_bytes
    if slots < 1:
        raise InvalidRequestError(f"kv_offload_size {size} B holds no KV block ({block_bytes} B each)",
                                  "kv_offload_size")
    nbytes = slots * block_bytes
    if kind == "cpu":
        if nbytes > free_memory:
            raise InvalidRequestError(f"kv_offload_size {nbytes / 2**30:.2f} GiB exceeds the free memory "
                                      f"({free_memory / 2**30:.2f} GiB)", "kv_offload_size")
        slab = torch.empty((slots, block_bytes), dtype=torch.uint8, pin_memory=device.type == "cuda")
        return KVStore(kind, slab, layers, "host memory" + (" (pinned)" if device.type == "cuda" else ""))
    directory = directory or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(directory).free
    except OSError as e:
        log.warning("KV offload disabled: cannot use %s (%s); evicted blocks are recomputed", directory, e)
        return None
    if nbytes > free:
        raise InvalidRequestError(f"kv_offload_size {nbytes / 2**30:.2f} GiB exceeds the free disk space of "
                                  f"{directory} ({free / 2**30:.2f} GiB)", "kv_offload_size")
    try:
        slab = _file_slab(directory, nbytes).view(slots, block_bytes)
    except OSError as e:
        log.warning("KV offload disabled: cannot write a %d B file in %s (%s); evicted blocks are recomputed",
                    nbytes, directory, e)
        return None
    return KVStore(kind, slab, layers, f"a {nbytes / 2**20:.0f} MiB file in {directory}")


def _file_slab(directory: str, nbytes: int) -> torch.Tensor:
    fd, path = tempfile.mkstemp(prefix="ridgeline-kv-", suffix=".slab", dir=directory)
    try:
        os.unlink(path)  # the mapping keeps it; nothing is left behind when the process ends
        os.posix_fallocate(fd, 0, nbytes)
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return torch.from_numpy(np.frombuffer(m, dtype=np.uint8))  # the array keeps the mapping alive
