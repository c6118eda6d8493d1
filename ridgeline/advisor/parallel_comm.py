"""Communication of one tensor-parallel step, as the engine makes it (ridgeline/distributed/comm.py)
(and of one pipeline step: pp_step_comm):
an all-reduce of the fp32 hidden state [tokens, hidden] after each layer's attention and MLP (2 per
layer) and after the vocab-parallel embedding, and an all-gather of the sampled rows' fp32 logits.
A ring all-reduce moves 2 (N-1)/N of the message per rank, an all-gather (N-1)/N of the result; each
collective pays the link latency once. Latency and bandwidth come from a measurement of the link
(`TPRuntime.probe` on this machine, or a hardware table), never from the step timings."""
from __future__ import annotations

from dataclasses import dataclass

FP32 = 4


@dataclass(frozen=True)
class Link:
    latency: float  # s per collective
    bandwidth: float  # B/s per rank

    @classmethod
    def from_probe(cls, small_s: float, large_s: float, large_floats: int, size: int) -> "Link":
        """Two all-reduce timings (a 1-float message and a large one) -> latency and bandwidth."""
        moved = 2 * (size - 1) / size * large_floats * FP32
        return cls(small_s, moved / max(large_s - small_s, 1e-9))


def all_reduce_s(nbytes: float, size: int, link: Link) -> float:
    return link.latency + 2 * (size - 1) / size * nbytes / link.bandwidth


def all_gather_s(total_bytes: float, size: int, link: Link) -> float:
    return link.latency + (size - 1) / size * total_bytes / link.bandwidth


def tp_step_comm(layers: int, hidden: int, vocab: int, size: int, tokens: float, sampled: float,
                 link: Link) -> tuple[float, int]:
    """(seconds, collectives) of one step of `tokens` rows, `sampled` of them producing logits."""
    if size == 1:
        return 0.0, 0
    reduces = 2 * layers + 1
    chunk = -(-vocab // size)
    t = reduces * all_reduce_s(tokens * hidden * FP32, size, link)
    t += all_gather_s(sampled * chunk * size * FP32, size, link)
    return t, reduces + 1


def pp_step_comm(hidden: int, stages: int, tokens: float, microbatches: int, link: Link) -> tuple[float, int]:
    """(seconds, messages) of one pipeline step as the engine makes it (ridgeline/distributed/pipeline.py):
    each micro-batch's (hidden, residual) fp32 [rows, hidden] sent across each of the stages - 1
    boundaries (two messages), then the sampled tokens back to stage 0 (one small message)."""
    if stages == 1:
        return 0.0, 0
    from ridgeline.distributed.stages import p2p_bytes_per_step
    n = (stages - 1) * 2 * microbatches + 1
    return n * link.latency + p2p_bytes_per_step(hidden, tokens, stages) / link.bandwidth, n
