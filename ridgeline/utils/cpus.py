"""This process's CPU cores and how they split between worker processes (replicas, disaggregation
workers)."""
from __future__ import annotations

import os


def available_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return list(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def core_shares(n: int, cpus: list[int] | None = None) -> list[list[int]]:
    """The cores of each of n workers: contiguous, as equal as they divide; [] each when n > cores."""
    cpus = sorted(cpus if cpus is not None else available_cpus())
    if n > len(cpus):
        return [[] for _ in range(n)]
    base, extra = divmod(len(cpus), n)
    shares, start = [], 0
    for i in range(n):
        size = base + (i < extra)
        shares.append(cpus[start:start + size])
        start += size
    return shares
