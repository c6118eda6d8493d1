"""Counters of speculation: proposals made and kept, overall and by position (the acceptance curve)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    steps: int = 0  # sequence-steps that carried proposals
    proposed: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # [j]: proposals kept at position j (0-based)
    proposed_at: list[int] = field(default_factory=list)

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

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a sequence-step with proposals emitted (accepted + 1)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0
