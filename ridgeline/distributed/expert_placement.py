"""Which rank owns which experts: contiguous blocks in rank order, as even as the counts allow: with E
experts over N ranks each rank owns E // N of them and the first E % N ranks one more (Qwen1.5-MoE's
60 experts over 8 ranks: 8 each on ranks 0-3, 7 each on ranks 4-7). Every rank holds the router and
any shared expert whole. Contiguous blocks keep each rank's rows in expert order after the exchange,
so a rank's expert calls see the same rows, in the same order, as the single-process layer does.
With uneven blocks a rank with one more expert does more of the work on average: its share is
ceil(E / N) / E of the routed pairs under uniform routing, and the busiest rank sets the pace."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ridgeline.errors import InvalidRequestError


def expert_blocks(num_experts: int, world: int) -> list[tuple[int, int]]:
    """Every rank's [first, stop) experts; earlier ranks take one more where world does not divide."""
    if world < 1:
        raise InvalidRequestError("expert-parallel ranks must be >= 1", "expert_parallel")
    if num_experts < world:
        raise InvalidRequestError(
            f"{num_experts} experts cannot be placed over {world} expert-parallel ranks: every rank owns at least "
            f"one expert; use at most {num_experts} ranks", "expert_parallel")
    base, extra = divmod(num_experts, world)
    out, first = [], 0
    for r in range(world):
        n = base + (r < extra)
        out.append((first, first + n))
        first += n
    return out


@dataclass(frozen=True)
class ExpertPlacement:
    num_experts: int
    world: int
    rank: int

    def __post_init__(self):
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise InvalidRequestError(f"rank {self.rank} is outside a group of {self.world}", "expert_parallel")
        self.blocks  # counts that cannot place fail here

    @cached_property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        """Every rank's [first, stop) experts."""
        return tuple(expert_blocks(self.num_experts, self.world))

    @property
    def sizes(self) -> list[int]:
        """Experts each rank owns, in rank order."""
        return [b - a for a, b in self.blocks]

    @property
    def per_rank(self) -> int:
        """Experts this rank owns."""
        a, b = self.blocks[self.rank]
        return b - a

    @property
    def first(self) -> int:
        return self.blocks[self.rank][0]

    @property
    def local(self) -> range:
        """Global ids of this rank's experts."""
        return range(*self.blocks[self.rank])

    def owner(self, expert: int) -> int:
        return next(r for r, (a, b) in enumerate(self.blocks) if a <= expert < b)

    def owns(self, expert: int) -> bool:
        return self.owner(expert) == self.rank

    @classmethod
    def for_group(cls, num_experts: int, group) -> "ExpertPlacement":
        import torch.distributed as dist
        return cls(num_experts, dist.get_world_size(group), dist.get_rank(group))
