"""Token-budget scheduler: each step hands out up to max_num_batched_tokens over running requests
(decodes and unfinished prefill chunks) first, then admits waiting ones FCFS. Chunked prefill and
mixed prefill/decode batches fall out of that rule. Out of blocks: preempt the newest running
request (free its blocks; it is recomputed later). Torch-free.
"""
from __future__ import annotations

from collections import deque

from ridgeline.config import SchedulerConfig
from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.request import Request, Status
from ridgeline.engine.step_plan import ScheduledSeq, StepPlan


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._finished_ids: list[str] = []
        self._last: list[tuple[Request, int]] = []
        # admit only while this many blocks stay free, so decodes rarely preempt fresh admissions
        self.watermark = max(1, kv.num_usable_blocks // 100)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request, status: Status) -> None:
        req.status = status
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        self._finished_ids.append(req.request_id)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.status = Status.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self) -> StepPlan:
        plan = StepPlan(finished_ids=self._finished_ids)
        self._finished_ids = []
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        for req in list(self.running):
            if budget == 0:
                break
            if req.status != Status.RUNNING:
                continue  # preempted earlier in this loop
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.allocate(req.request_id, req.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                plan.num_preempted += 1
                if victim is req:
                    break
            if req.status == Status.RUNNING:
                scheduled.append((req, n))
                budget -= n
        if not preempted:
            budget = self._admit(scheduled, budget)
        plan.seqs = self._build(scheduled)
        self._last = scheduled
        return plan

    def _admit(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.popleft()
            src = req.share_from
            if src is not None and req.num_computed_tokens == 0:
                waiting_on_src = src.status == Status.WAITING or (
                    src.status == Status.RUNNING and src.num_computed_tokens < src.num_prompt_tokens - 1)
                if waiting_on_src:
                    skipped.append(req)  # its prompt's blocks are not computed yet
                    continue
                if src.status == Status.RUNNING and not self.kv.tables.get(req.request_id):
                    shared = self.kv.share(src.request_id, req.request_id, req.num_prompt_tokens - 1)
                    req.num_computed_tokens = req.num_cached_tokens = shared
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.kv.allocate(req.request_id, req.num_computed_tokens + n, reserve=self.watermark):
                if self.running or scheduled:
                    self.waiting.appendleft(req)
                    break
                if not self.kv.allocate(req.request_id, req.num_computed_tokens + n):
                    self.waiting.appendleft(req)  # cannot happen for a request that fits max_model_len
                    break
            req.status = Status.RUNNING
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _build(self, scheduled: list[tuple[Request, int]]) -> list[ScheduledSeq]:
        seqs = []
        for req, n in scheduled:
            start = req.num_computed_tokens
            seqs.append(ScheduledSeq(
                req_id=req.request_id, start=start, token_ids=req.token_ids[start:start + n],
                block_table=self.kv.tables[req.request_id], sample=start + n == req.num_tokens,
                params=req.params, seed=req.seed, all_token_ids=req.token_ids,
                num_prompt_tokens=req.num_prompt_tokens))
        seqs.sort(key=lambda s: s.num_new != 1)  # stable: decodes first, then prefill chunks
        return seqs

    def advance(self) -> None:
        """After the runner ran the last plan: its scheduled tokens are now in the KV cache."""
        for req, n in self._last:
            req.num_computed_tokens += n
        self._last = []
