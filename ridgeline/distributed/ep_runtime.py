"""Expert parallelism with its own ranks (`--expert-parallel-size N`): launched, joined and led exactly
as tensor parallelism's ranks are (distributed/runtime.py: one machine, rank 0 starts ranks 1..N-1
pinned to their share of the cores; torchrun, every rank a process; rank 0 schedules and publishes
each step's plan; a dead rank fails the requests in flight and ends the server), but no layer is
split: attention, norms, routers, shared experts and the LM head are whole on every rank, and each
sparse layer's experts are placed over the N ranks (distributed/expert_placement.py).

Everything that can be refused is refused here, before a rank starts: a dense model, fewer experts
than ranks (an expert count the ranks do not divide places unevenly, expert_placement.py), more
ranks than cores (pinned), a torchrun WORLD_SIZE that is not the size."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ridgeline.distributed.group import RankContext, torchrun_env
from ridgeline.distributed.runtime import TPRuntime
from ridgeline.engine.parallel_runtime import register_runtime
from ridgeline.errors import InvalidRequestError
from ridgeline.distributed.expert_placement import expert_blocks

LABEL = "expert-parallel"  # how a dead rank is named in the errors requests get


def check_experts(arch, size: int) -> None:
    """The model can place its experts over `size` ranks (contiguous blocks, at least one expert each)."""
    if arch.moe is None:
        raise InvalidRequestError(f"expert_parallel_size {size} needs a mixture-of-experts model; "
                                  f"{arch.architecture} has no experts", "expert_parallel_size")
    expert_blocks(arch.moe.num_experts, size)


def check_launch(size: int, pin_cores: bool) -> None:
    """Rank 0 of a launch: torchrun started as many processes as the size; on one machine each rank has a core."""
    env = torchrun_env()
    if env is not None:
        if env[1] != size:
            raise InvalidRequestError(f"WORLD_SIZE is {env[1]} but expert_parallel_size is {size}; start one "
                                      "process per rank (torchrun --nproc-per-node x --nnodes = the size)",
                                      "expert_parallel_size")
        return
    cores = len(os.sched_getaffinity(0))
    if pin_cores and size > cores:
        raise InvalidRequestError(f"expert_parallel_size {size} is larger than the {cores} CPU cores this process "
                                  "may use (one rank per core at least; --no-pin-cores to share them)",
                                  "expert_parallel_size")


@register_runtime("expert")
class EPRuntime(TPRuntime):
    """TPRuntime's launch, plan channel, followers and failure path over N whole-model ranks: `shard`,
    `comm` and `slicer` are None (nothing splits), `arch` is the model's own."""

    param, what = "expert_parallel_size", f"{LABEL} rank"

    def __init__(self, config, arch, device: torch.device, rank: RankContext | None = None):
        pc = config.parallel
        size = pc.expert_parallel_size
        check_experts(arch, size)
        if rank is None:
            check_launch(size, pc.pin_cores)
        self._join(config, size, device, rank, arch)
        self.shard = self.comm = self.slicer = None
        self.arch = arch

    def info(self, model, kv, pool_bytes: int) -> "EPInfo":
        """Every rank's experts and resident bytes (gathered: one collective, on every rank at start-up)."""
        from ridgeline.distributed.memory import resident_weight_bytes
        from ridgeline.distributed.expert_load import sparse_layers
        layers = sparse_layers(model)
        held = [e for e, _ in layers[0].expert_items()]
        mine = (held[0], held[-1] + 1, resident_weight_bytes(model), pool_bytes)
        return EPInfo(self.ctx.size, layers[0].num_experts, len(layers), tuple(self.gather(mine)),
                      tuple(self.workers.pids) if self.workers else ())


@dataclass(frozen=True)
class EPInfo:
    size: int
    num_experts: int
    sparse_layers: int
    ranks: tuple[tuple[int, int, int, int], ...]  # per rank: (first expert, stop, resident weight bytes, KV bytes)
    worker_pids: tuple[int, ...] = ()  # ranks 1.. when this process started them

    def weight_bytes(self, rank: int) -> int:
        return self.ranks[rank][2]

    def describe(self) -> list[str]:
        lines = [f"expert parallel over {self.size} ranks: experts placed in contiguous blocks in each of "
                 f"{self.sparse_layers} sparse layers; attention, routers, shared experts and dense layers whole "
                 "on every rank"]
        for r, (a, b, w, kv) in enumerate(self.ranks):
            pid = f", pid {self.worker_pids[r - 1]}" if 0 < r <= len(self.worker_pids) else ""
            lines.append(f"rank {r}/{self.size}: experts {a}..{b - 1} of {self.num_experts}; weights {w / 1e6:.1f} MB, "
                         f"KV {kv / 2**20:.0f} MiB{pid}")
        return lines
