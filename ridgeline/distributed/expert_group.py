"""The process group sparse layers spread their experts over (`--expert-parallel`). A launcher that
runs the ranks (tensor parallelism's, or torchrun) initialises torch.distributed and may name a
group with `use_group`; otherwise the whole world is the expert-parallel group."""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError

_group = None


def use_group(group) -> None:
    """The group the next engines build their sparse layers over (None: the default world)."""
    global _group
    _group = group


def expert_group(enabled: bool):
    """The process group for expert parallelism, or None when it is off; a clear error when it is
    asked for without a distributed launch."""
    if not enabled:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidRequestError(
            "--expert-parallel spreads experts over the ranks of a distributed launch, but torch.distributed "
            "is not initialised: give --expert-parallel-size N (the engine starts or joins its ranks)",
            "expert_parallel")
    return _group if _group is not None else dist.group.WORLD
