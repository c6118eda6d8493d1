"""How a model splits over pipeline stages: the one set of rules the engine loads by and the advisor
plans with (torch-free).

- Stage s of N holds the contiguous layers [start, stop); the layers go out as evenly as possible,
  earlier stages taking one more where N does not divide them. Every stage holds at least one layer.
- The first stage holds the embedding; the last the final norm and the LM head (with tied
  embeddings, the embedding table again: the head's weight is that table).
- A step's rows go through the stages in micro-batches (whole sequences, in plan order); stage s
  sends each micro-batch's (hidden, residual) fp32 [rows, hidden] to stage s + 1; the last stage
  samples and returns the sampled tokens to stage 0, which schedules.
"""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError

FP32 = 4


@dataclass(frozen=True)
class Stage:
    """Stage `index` of `size`: layers [start, stop) of `num_layers`."""
    index: int
    size: int
    start: int
    stop: int
    num_layers: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    @property
    def layers(self) -> range:
        return range(self.start, self.stop)

    def holds(self, layer: int) -> bool:
        return self.start <= layer < self.stop

    def describe(self) -> str:
        parts = ["embedding"] if self.first else []
        parts.append(f"layers {self.start}..{self.stop - 1}")
        if self.last:
            parts.append("final norm + LM head")
        return f"stage {self.index}/{self.size}: {', '.join(parts)}"


def stage_layout(num_layers: int, size: int) -> list[Stage]:
    """The stages of a model of `num_layers` layers over `size` stages."""
    if size < 1:
        raise InvalidRequestError("pipeline_parallel_size must be >= 1", "pipeline_parallel_size")
    if size > num_layers:
        raise InvalidRequestError(f"pipeline_parallel_size {size} is more stages than the model's {num_layers} "
                                  "layers (each stage needs at least one layer)", "pipeline_parallel_size")
    base, extra = divmod(num_layers, size)
    out, a = [], 0
    for s in range(size):
        b = a + base + (s < extra)
        out.append(Stage(s, size, a, b, num_layers))
        a = b
    return out


def microbatch_count(requested: int | None, stages: int, seqs: int) -> int:
    """Micro-batches one step splits into: as asked (default: one per stage), never more than sequences."""
    return max(1, min(requested or stages, seqs))


def split_rows(rows: list[int], count: int) -> list[tuple[int, int]]:
    """Contiguous [a, b) ranges of sequences, `count` of them, each with about the same number of rows
    (tokens); every range holds at least one sequence."""
    n = len(rows)
    count = max(1, min(count, n))
    total = sum(rows)
    out, a, acc = [], 0, 0
    for i in range(1, count):
        target = total * i / count
        b = a + 1  # at least one sequence each
        acc += rows[a]
        while b < n - (count - i) and acc + rows[b] / 2 <= target:
            acc += rows[b]
            b += 1
        out.append((a, b))
        a = b
    out.append((a, n))
    return out


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a stage in a forward-only pipeline of equal micro-batches: (N-1) / (M + N - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def p2p_bytes_per_step(hidden: int, rows: float, stages: int) -> float:
    """Bytes sent between stages in one step: (hidden, residual) fp32 of every row across each of the
    N - 1 boundaries (the sampled token ids sent back to stage 0 are negligible)."""
    return (stages - 1) * 2 * rows * hidden * FP32
