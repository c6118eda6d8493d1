"""Zeroed anonymous memory backed by transparent huge pages where the kernel allows them.

The KV cache is read in scattered blocks; with 4 KiB pages nearly every block access misses the TLB
and software prefetches into it are dropped, so attention reads at a fraction of the memory
bandwidth. With THP in "madvise" mode (common) huge pages must be asked for.
"""
from __future__ import annotations

import mmap

import numpy as np


def zeroed(nbytes: int) -> np.ndarray:
    """A uint8 array of nbytes zeros, mapped lazily (pages appear on first touch), huge-page backed
    when the kernel grants MADV_HUGEPAGE; plain zero pages otherwise."""
    if nbytes <= 0:
        return np.zeros(0, np.uint8)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:
            pass
    return np.frombuffer(m, dtype=np.uint8)  # the array keeps the mapping alive
