"""Expert parallelism as a sparse layer sees it: which of its experts this rank holds, and the exchange
that runs the layer across the ranks. The distributed package implements both (distributed/
expert_group.py, distributed/expert_dispatch.py); SparseMoE names no distributed module."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class ExpertExchange(ABC):
    """One sparse layer's experts spread over the ranks. `placement.local`: the global ids of the
    experts this rank holds (contiguous); `placement.world` / `placement.blocks`: the group's size and
    every rank's [first, stop) experts."""
    placement: object

    @abstractmethod
    def forward_replicated(self, compute, x: torch.Tensor, load: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H], the same on every rank -> the layer's output [T, H] on every rank. `compute` routes
        tokens and runs this rank's experts (layers/expert_compute.py); `load` counts pairs per expert."""


class ExpertSharding(ABC):
    """The group a model's sparse layers spread their experts over (BuildOptions.experts)."""

    @abstractmethod
    def exchange(self, num_experts: int) -> ExpertExchange:
        """The exchange for a layer of num_experts experts (each rank a contiguous block)."""
