"""What the engine does around a step with a second KV tier: feed the swap-or-recompute estimate the
step's measured rates, and, when a copy to or from the tier fails, go on without it (nothing loaded
in that step is trusted and nothing swapped can come back, so the requests concerned recompute).
Torch-free."""
from __future__ import annotations

import logging

from ridgeline.step_plan import TierCopies
from ridgeline.engine.request import Status
from ridgeline.engine.scheduler import Scheduler
from ridgeline.step_plan import StepPlan, StepResult

log = logging.getLogger(__name__)


def observe_step(sched: Scheduler, plan: StepPlan, result: StepResult, seconds: float) -> None:
    """The copy rate and prefill rate of a step that ran; one warning the first time the tier was full."""
    tier = sched.kv.tier
    if tier is None:
        return
    copied, copy_s = result.kv_copy or (0, 0.0)
    tier.costs.observe_copy(copied, copy_s)
    if plan.num_tokens - sum(1 for s in plan.seqs if s.num_new == 1) >= 32:  # a step with prefill chunks
        tier.costs.observe_prefill(plan.num_tokens, seconds - copy_s)
    if not tier.full_warned and (tier.stats.dropped or tier.stats.swap_fallbacks):
        tier.full_warned = True
        log.warning("the %s KV tier is full (%d blocks, all held by swapped-out requests): blocks that do not "
                    "fit are recomputed; raise --kv-offload-size to keep more", tier.name, tier.num_slots)


def drop_tier(sched: Scheduler, copies: TierCopies | None) -> int:
    """Detach the tier from the KV manager; the step that carried `copies` did not run. Every request
    holding a block that step loaded (its content is unknown) and every swapped-out request restart
    from scratch; blocks it loaded leave the prefix cache. Returns how many requests recompute."""
    kv = sched.kv
    tier, kv.tier = kv.tier, None
    sched._last = []  # nothing of that plan was computed
    loaded = {block for _, block in copies.loads} if copies else set()
    if kv.cache is not None:
        for block in loaded:
            if block in kv.cache:
                kv.cache.remove(block)
                kv.evictable.pop(block, None)
                if kv.ref_counts[block] == 0:
                    kv.free_ids.append(block)
    reset = 0
    for req in list(sched.running):
        if loaded.intersection(kv.tables.get(req.request_id, ())):
            sched.running.remove(req)
            kv.free(req.request_id)
            req.status, req.num_computed_tokens = Status.WAITING, 0
            sched.waiting.appendleft(req)
            reset += 1
    for req in sched.waiting:
        if tier is not None and req.request_id in tier.swapped:
            req.num_computed_tokens = 0
            reset += 1
    return reset
