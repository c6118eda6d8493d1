"""The process group sparse layers spread their experts over (`--expert-parallel`). A launcher that
runs the ranks (tensor parallelism's, or torchrun) initialises torch.distributed and may name a
group with `use_group`; otherwise the whole world is the expert-parallel group. The engine reaches
`expert_sharding` through the parallel-runtime registry (engine/parallel_runtime.py)."""
from __future__ import annotations

from ridgeline.engine.parallel_runtime import register_runtime
from ridgeline.errors import InvalidRequestError
from ridgeline.layers.expert_sharding import ExpertSharding

_group = None


def use_group(group) -> None:
    """The group the next engines build their sparse layers over (None: the default world)."""
    global _group
    _group = group


class GroupSharding(ExpertSharding):
    """Every sparse layer's experts in contiguous blocks over one process group's ranks."""

    def __init__(self, group):
        self.group = group

    def exchange(self, num_experts: int):
        from ridgeline.distributed.expert_dispatch import ExpertParallel
        from ridgeline.distributed.expert_placement import ExpertPlacement
        return ExpertParallel(self.group, ExpertPlacement.for_group(num_experts, self.group))


@register_runtime("expert-sharding")
def expert_sharding(enabled: bool) -> GroupSharding | None:
    """The sharding of the experts for expert parallelism, or None when it is off; a clear error when
    it is asked for without a distributed launch."""
    if not enabled:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidRequestError(
            "--expert-parallel spreads experts over the ranks of a distributed launch, but torch.distributed "
            "is not initialised: give --expert-parallel-size N (the engine starts or joins its ranks)",
            "expert_parallel")
    return GroupSharding(_group if _group is not None else dist.group.WORLD)
