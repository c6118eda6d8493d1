"""Counters of speculation: tokens drafted and accepted, overall and by draft position (the
acceptance curve), verification steps and the time spent drafting. One per engine (the run) and
one per request (reported in its output and in the server's `usage`)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    steps: int = 0  # sequence-steps that carried proposals (verification passes)
    proposed: int = 0  # drafted tokens verified
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # [j]: proposals kept at position j (0-based)
    proposed_at: list[int] = field(default_factory=list)
    draft_time: float = 0.0  # seconds spent proposing (a batch's time shared equally by its requests)

    def record(self, sampled) -> None:
        """sampled: the runner's SampledSeq for one sequence this step."""
        k = sampled.proposed
        if not k:
            return
        self.steps += 1
        self.proposed += k
        self.accepted += sampled.accepted
        while len(self.proposed_at) < k:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for j in range(k):
            self.proposed_at[j] += 1
            self.accepted_at[j] += j < sampled.accepted

    def add(self, other: SpecStats) -> SpecStats:
        """In place: this plus other's counts (several choices or requests as one)."""
        self.steps += other.steps
        self.proposed += other.proposed
        self.accepted += other.accepted
        for mine, theirs in ((self.accepted_at, other.accepted_at), (self.proposed_at, other.proposed_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for j, n in enumerate(theirs):
                mine[j] += n
        self.draft_time += other.draft_time
        return self

    def copy(self) -> SpecStats:
        return SpecStats().add(self)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a sequence-step with proposals emitted (accepted + 1): the mean accepted length."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    def summary(self) -> dict:
        """The reported form (offline outputs' `speculative`, the server's usage.speculative)."""
        return {"drafted_tokens": self.proposed, "accepted_tokens": self.accepted,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "acceptance_by_position": [round(x, 4) for x in self.acceptance_by_position],
                "verify_steps": self.steps, "mean_accepted_length": round(self.tokens_per_step, 4),
                "draft_time_s": round(self.draft_time, 6)}
