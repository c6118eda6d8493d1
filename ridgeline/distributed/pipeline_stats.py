"""One pipeline stage's counters (pipeline.py fills them; stage 0 gathers every stage's)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StageStats:
    stage: int
    layers: tuple[int, int]
    steps: int = 0
    microbatches: int = 0
    rows: int = 0
    step_s: float = 0.0  # wall time inside execute, summed
    compute_s: float = 0.0  # embedding, layers, logits and sampling
    recv_s: float = 0.0  # blocked receiving activations or the sampled tokens (bubble + transfer)
    send_s: float = 0.0  # waiting for sends to complete at the end of a step
    # transfer time measured on receipt: the residual follows the hidden state at once, so receiving it
    # takes its transfer alone (no waiting for the sender); counted twice, for both tensors
    transfer_s: float = 0.0
    sent_bytes: int = 0

    @property
    def bubble(self) -> float:
        """Idle share of this stage's step time: blocked in receives and sends."""
        return (self.recv_s + self.send_s) / self.step_s if self.step_s else 0.0

    def line(self) -> str:
        steps = max(self.steps, 1)
        return (f"stage {self.stage} (layers {self.layers[0]}..{self.layers[1] - 1}): {self.steps} steps, "
                f"{self.microbatches / steps:.1f} micro-batches per step, step {1e3 * self.step_s / steps:.2f} ms, "
                f"compute {1e3 * self.compute_s / steps:.2f} ms, blocked {1e3 * (self.recv_s + self.send_s) / steps:.2f} ms, "
                f"bubble {self.bubble:.0%}, sent {self.sent_bytes / steps / 1e3:.1f} kB per step")
