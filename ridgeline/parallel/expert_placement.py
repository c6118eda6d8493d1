"""Which rank owns which experts: contiguous blocks of E / N experts per rank, in rank order (rank r
owns experts [r E/N, (r + 1) E/N)). Every rank holds the router and any shared expert whole.
Contiguous blocks keep each rank's rows in expert order after the exchange, so a rank's expert
calls see the same rows, in the same order, as the single-process layer does."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError


@dataclass(frozen=True)
class ExpertPlacement:
    num_experts: int
    world: int
    rank: int

    def __post_init__(self):
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise InvalidRequestError(f"rank {self.rank} is outside a group of {self.world}", "expert_parallel")
        if self.num_experts % self.world:
            raise InvalidRequestError(
                f"{self.num_experts} experts do not divide over {self.world} expert-parallel ranks (each rank "
                f"owns a contiguous block of experts); use a rank count that divides {self.num_experts}",
                "expert_parallel")

    @property
    def per_rank(self) -> int:
        return self.num_experts // self.world

    @property
    def first(self) -> int:
        return self.rank * self.per_rank

    @property
    def local(self) -> range:
        """Global ids of this rank's experts."""
        return range(self.first, self.first + self.per_rank)

    def owner(self, expert: int) -> int:
        return expert // self.per_rank

    def owns(self, expert: int) -> bool:
        return self.owner(expert) == self.rank

    @classmethod
    def for_group(cls, num_experts: int, group) -> "ExpertPlacement":
        import torch.distributed as dist
        return cls(num_experts, dist.get_world_size(group), dist.get_rank(group))
