"""Rank 0 schedules; the other ranks follow. Each runner call that reaches the model (a step, or a
whole-prompt forward) is first published by rank 0 as (method, arguments) on the shared store, plain
data only (a StepPlan holds no live references); every follower runs the same call on its own shard,
so all ranks reach the same collectives in the same order. A follower deletes a message once every
follower has read it."""
from __future__ import annotations

import logging
import pickle
from datetime import timedelta

import torch.distributed as dist

log = logging.getLogger(__name__)
# ModelRunner methods that run the model (or, with pipeline parallelism, gather or reset its counters)
CALLS = ("execute", "prefill_only", "all_logits", "all_hidden", "pipeline_stats", "reset_pipeline_stats")
STOP = ("stop", ())


class PlanChannel:
    """Its own connection to rank 0's store, whose timeout is how long a follower waits for a call
    (an idle server is not a failure; a dead rank 0 closes the connection at once)."""

    def __init__(self, addr: str, port: int, rank: int, size: int, timeout: timedelta):
        client = dist.TCPStore(addr, port, size, False, timeout=timeout)
        self.store, self.rank, self.size = dist.PrefixStore("plan", client), rank, size
        self.n = 0

    def send(self, method: str, args: tuple) -> None:
        self.store.set(str(self.n), pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL))
        self.n += 1

    def recv(self) -> tuple[str, tuple]:
        key = str(self.n)
        data = self.store.get(key)  # blocks until rank 0 publishes it
        if self.store.add(f"read{self.n}", 1) == self.size - 1:  # the last reader cleans up
            self.store.delete_key(key)
            self.store.delete_key(f"read{self.n}")
        self.n += 1
        return pickle.loads(data)


def follow(runner, channel: PlanChannel) -> None:
    """A follower's loop: run rank 0's calls until it says stop (or the channel breaks: then raise)."""
    while True:
        method, args = channel.recv()
        if method == "stop":
            return
        if method == "probe":
            from ridgeline.distributed.comm import probe_link
            probe_link(*args)
            continue
        if method == "probe_p2p":
            from ridgeline.distributed.pipeline import probe_p2p
            probe_p2p(*args, channel.rank)
            continue
        if method not in CALLS:
            raise RuntimeError(f"unknown call {method!r} from rank 0 (mismatched versions across ranks?)")
        getattr(runner, method)(*args)
