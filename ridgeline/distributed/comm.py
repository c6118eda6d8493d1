"""The collectives one tensor-parallel step makes, timed: an all-reduce of the fp32 hidden state after
each row-parallel projection (the stack's hooks: attention output and MLP output of every layer), one
after the vocab-parallel embedding, and an all-gather of the logits. `seconds` / `calls` measure the
communication a step costs (waits for a slower rank included)."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ridgeline.distributed.layout import RankShard


class TPComm:
    def __init__(self, shard: RankShard, vocab: int, group=None):
        self.shard, self.vocab, self.group = shard, vocab, group
        self.seconds = 0.0
        self.calls = 0
        self.bytes = 0  # payload handed to collectives by this rank
        self.forwards = 0  # forward passes (one vocab-parallel embedding each)

    @property
    def size(self) -> int:
        return self.shard.size

    def _timed(self, fn, nbytes: int) -> None:
        t0 = time.perf_counter()
        fn()
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.bytes += nbytes

    def all_reduce(self, x: torch.Tensor) -> None:
        """Sum x over the ranks, in place (x contiguous)."""
        self._timed(lambda: dist.all_reduce(x, group=self.group), x.numel() * x.element_size())

    def hook(self, layer: int, where: int, x: torch.Tensor) -> None:
        """The decoder stack's hook: the row-parallel partial sums become the full output."""
        self.all_reduce(x)

    def embed(self, table: torch.nn.Embedding, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Vocab-parallel lookup in `dtype`: rows outside this rank's chunk are zero, so the sum over
        ranks is exact."""
        self.forwards += 1
        a, b = self.shard.vocab
        local = ids - a
        inside = (local >= 0) & (local < b - a)
        out = table(torch.where(inside, local, torch.zeros_like(local))).to(dtype)
        out = (out * inside.unsqueeze(-1).to(dtype)).contiguous()
        self.all_reduce(out)
        return out

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[S, chunk] per rank -> [S, vocab] on every rank (the padding rows trimmed)."""
        logits = logits.contiguous()
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        self._timed(lambda: dist.all_gather(parts, logits, group=self.group),
                    logits.numel() * logits.element_size())
        return torch.cat(parts, dim=-1)[:, :self.vocab]

    def reset(self) -> None:
        self.seconds, self.calls, self.bytes, self.forwards = 0.0, 0, 0, 0


def median_seconds(sizes: tuple[int, ...], reps: int, op) -> list[float]:
    """For each size (floats): the median seconds of op(x) over reps calls on an fp32 tensor x of that
    size, after one warm-up call. op returns the seconds to count, or None for the wall time of the call."""
    out = []
    for n in sizes:
        x = torch.ones(n)
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            got = op(x)
            times.append(time.perf_counter() - t0 if got is None else got)
        times = sorted(times[1:])
        out.append(times[len(times) // 2])
    return out


def probe_link(sizes: tuple[int, ...], reps: int, group=None) -> list[float]:
    """Median seconds of an fp32 all-reduce of each size (floats), every rank calling it together: the
    link's latency (a tiny message) and bandwidth (a large one), measured apart from any model."""
    return median_seconds(sizes, reps, lambda x: dist.all_reduce(x, group=group))
