"""Rank 0 schedules; the other ranks follow. Each runner call that reaches the model (a step, or a
whole-prompt forward) is first published by rank 0 as (method, arguments) on the plan channel
(plan_channel.py: authenticated, wire.py's codec, every index checked), plain data only (a StepPlan
holds no live references); every follower runs the same call on its own shard, so all ranks reach
the same collectives in the same order."""
from __future__ import annotations

import logging

from ridgeline.distributed.plan_channel import PlanFollower
from ridgeline.distributed.plan_check import Limits

log = logging.getLogger(__name__)
STOP = ("stop", ())


def limits_of(runner, max_len: int) -> Limits:
    """What this rank holds: every index a call may carry must fall inside it."""
    store = runner.store
    return Limits(runner.arch.vocab_size, runner.kv[0].k.shape[0], runner.block_size, max_len,
                  store.num_slots if store is not None else 0)


def follow(runner, channel: PlanFollower, max_len: int) -> None:
    """A follower's loop: run rank 0's calls until it says stop (or the channel breaks, or a call fails
    its checks: then raise, and this rank exits)."""
    limits = limits_of(runner, max_len)
    while True:
        method, args = channel.recv(limits)
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
        getattr(runner, method)(*args)
