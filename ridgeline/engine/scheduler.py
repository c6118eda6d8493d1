"""Token-budget scheduler: each step hands out up to max_num_batched_tokens over running requests
(decodes and unfinished prefill chunks) first, then admits waiting ones FCFS. Chunked prefill and
mixed prefill/decode batches fall out of that rule. Out of blocks: preempt the newest running
request (free its blocks; it is recomputed later, from the prefix cache where its blocks survived,
readmitted once its whole history fits; with a second KV tier, its blocks are swapped out instead
where that is measured to be cheaper, and loaded back when it is readmitted).
Admission first looks the request up in the prefix cache: a hit starts it at num_computed_tokens =
the cached tokens. Multi-token steps: a decoding request with proposed tokens (spec_token_ids)
is scheduled with them appended (they count against the budget); advance() then moves it by the
tokens it knows plus the proposals the runner accepted, and shrinks its table to what it holds.
Sliding windows: after each step, blocks no layer's window reaches any more are released (in each KV
group's table where local and global layers keep their own).
KV eviction (evictor): a request's table holds its kept tokens' slots (engine/kv_eviction.py), and a
scheduled sequence says where its new tokens go (cache_start) and which kept tokens move first.
External KV (engine/external_kv.py: disaggregation's decode side): a request whose prompt's KV a
connector holds waits in `arriving`, and admit_external() starts it from that KV.
Torch-free.
"""
from __future__ import annotations

from collections import deque

from ridgeline.config import SchedulerConfig
from ridgeline.engine.external_kv import ExternalKV
from ridgeline.engine.kv_eviction import Evictor
from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.request import Request, Status
from ridgeline.step_plan import ScheduledSeq, StepPlan


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, evictor: Evictor | None = None):
        self.config = config
        self.kv = kv
        self.evictor = evictor  # KV eviction: a request's KV slots are its kept tokens, not its positions
        self._slots: dict[str, tuple[int, list[tuple[int, int]]]] = {}  # this plan: (slots kept, moves)
        self.waiting: deque[Request] = deque()
        self.external: ExternalKV | None = None  # a KV connector's scheduler side (attach_external)
        self.arriving: deque[Request] = deque()  # requests to start from external KV, in arrival order
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # computed tokens preemption threw away and readmission computed again
        self.num_prompt_tokens_scheduled = 0  # prompt tokens handed to the runner, recomputed ones included
        # concurrency in KV terms: requests holding blocks (running), the most at once, and at the first preemption
        self.peak_running = 0  # after each plan's admissions, since start
        self.peak_running_before_preemption = 0  # peak_running until the first preemption, then frozen
        self.running_at_first_preemption = 0  # len(running) then, the preempted request included; 0 until one
        self._dropped: dict[str, int] = {}  # preempted to recompute: request id -> computed tokens dropped
        self._finished_ids: list[str] = []
        self._last: list[tuple[Request, int, int]] = []  # last plan: (request, tokens scheduled, of them proposals)
        # admit only while this many blocks stay free, so decodes rarely preempt fresh admissions
        self.watermark = max(1, kv.num_usable_blocks // 100)

    def attach_external(self, source: ExternalKV) -> None:
        if self.external is not None and self.external is not source:
            raise ValueError("this scheduler already has an external KV source")
        self.external = source

    def add(self, req: Request) -> None:
        if self.external is not None and self.external.tokens(req):
            self.arriving.append(req)
        else:
            self.waiting.append(req)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.arriving)

    def finish(self, req: Request, status: Status) -> None:
        req.status = status
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.arriving:
            self.arriving.remove(req)
            self.external.discard(req.request_id, recompute=False)
        self.kv.free(req.request_id)
        self.kv.drop_swapped(req.request_id)
        self._dropped.pop(req.request_id, None)
        self._forget(req)
        self._finished_ids.append(req.request_id)

    def _preempt(self, req: Request) -> None:
        if self.num_preemptions == 0:
            self.running_at_first_preemption = len(self.running)
        self.running.remove(req)
        if not self._swap_out(req):
            self._dropped[req.request_id] = req.num_computed_tokens
            req.num_computed_tokens = 0
        self._forget(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _swap_out(self, req: Request) -> bool:
        """Release req's blocks; True if they went to the second tier (it then resumes where it was)."""
        tier, n = self.kv.tier, req.num_computed_tokens
        # under KV eviction or with window holes in its table a request recomputes (its table is not a plain prefix)
        if tier is None or not n or self.evictor is not None or self.kv.holes.get(req.request_id) or \
                not tier.costs.prefer_swap(n, self.kv.blocks_for(n) * tier.block_bytes):
            self.kv.free(req.request_id)
            return False
        return self.kv.swap_out(req.request_id, n)

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
            remaining = req.num_tokens - req.num_computed_tokens
            n = min(remaining + (len(req.spec_token_ids) if remaining == 1 else 0), budget)
            held = req.num_computed_tokens
            if self.evictor is not None:
                n = self.evictor.cap(req.request_id, n)
                held = self._evict(req, n)
            while not self.kv.allocate(req.request_id, held + n):
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
            self.peak_running = max(self.peak_running, len(self.running))
            if not self.num_preemptions:
                self.peak_running_before_preemption = self.peak_running
        plan.seqs = self._build(scheduled)
        if self.kv.tier is not None:
            plan.kv_copies = self.kv.tier.drain()
        self._last = [(r, n, n - min(n, r.num_tokens - r.num_computed_tokens)) for r, n in scheduled]
        return plan

    def _admit(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        """Waiting requests hold no blocks; admission starts each after its reusable prefix (its own
        swapped-out blocks, a prefix-cache hit, or n > 1 sharing with the cache off)."""
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.popleft()
            if self._waits_on_source(req):
                skipped.append(req)  # its prompt's blocks are not computed yet
                continue
            match, reused = self.kv.swapped_match(req.request_id), 0
            if match is not None:
                reused = match.num_tokens
            elif req.params.prompt_logprobs is not None and req.index == 0:
                pass  # its prompt's logits are needed: compute all of it (choices 1.. then reuse it)
            elif self.kv.caching:  # also on readmission after preemption
                match = self.kv.match(req.token_ids, req.cache_salt)
                reused = match.num_tokens
            elif req.share_from is not None and req.share_from.status == Status.RUNNING and self.evictor is None:
                reused = self.kv.share(req.share_from.request_id, req.request_id, req.num_prompt_tokens - 1)
            n = min(req.num_tokens - reused, budget)
            if self.evictor is not None:  # nothing reused: no cache, no sharing
                n = self.evictor.cap(req.request_id, n)
            # a request preempted to recompute comes back only when its whole history fits beside the
            # watermark: readmitted a chunk at a time into a pool that cannot hold it, it is the newest
            # again when the running decodes grow, and each preemption throws its recomputed chunks away
            rest = self.kv.pages_for(req.num_tokens) - self.kv.pages_for(reused + n) \
                if req.request_id in self._dropped else 0
            if not self.kv.allocate(req.request_id, reused + n, reserve=self.watermark + rest, prefix=match):
                alone = not self.running and not scheduled
                if not alone or not self.kv.allocate(req.request_id, reused + n, prefix=match):
                    self.kv.free(req.request_id)  # drop shared blocks: a waiting request holds none
                    if not (alone and reused):
                        self.waiting.appendleft(req)
                        break
                    # alone, what it would reuse (its swapped blocks, a prefix-cache hit: a table
                    # without a sliding window's holes) and its next chunk exceed the whole pool: it
                    # would wait forever, and everything behind it. It starts from its first token.
                    if match is not None and match.swapped:
                        self.kv.drop_swapped(req.request_id)
                        self._dropped[req.request_id] = req.num_computed_tokens
                    match, reused = None, 0  # (never under KV eviction: it reuses nothing)
                    n = min(req.num_tokens, budget)
                    if not self.kv.allocate(req.request_id, n):
                        self.kv.free(req.request_id)
                        self.waiting.appendleft(req)
                        break
            req.num_computed_tokens = reused
            if self._dropped:
                self.num_recomputed_tokens += max(0, self._dropped.pop(req.request_id, 0) - reused)
            if self.evictor is not None:
                self._evict(req, n)
            if req.num_preemptions == 0:
                req.num_cached_tokens = reused
                req.num_tier_cached_tokens = len(match.tier_slots) * self.kv.block_size if match else 0
            req.status = Status.RUNNING
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return budget

    def admit_external(self, before_write=None) -> list[tuple[Request, int]]:
        """Start arriving requests from their external KV, in order, while the pool has room (above the
        watermark, under max_num_seqs) and this step's copy budget (max_num_batched_tokens prompt
        tokens, one request at least) lasts; before the engine's next plan. Returns (request, first
        token) of each started one: the engine appends the token. A request that can never get room
        (nothing running would free blocks), or whose KV cannot be written, is computed as usual.
        before_write(): called once blocks are allocated, before the connector writes into them."""
        src, started = self.external, []
        budget, copied = self.config.max_num_batched_tokens, 0
        while self.arriving:
            req = self.arriving[0]
            n = src.tokens(req)
            if started and copied + n > budget:
                break  # bounded per step like a prefill chunk; the rest wait for the next steps, in order
            room = len(self.running) < self.config.max_num_seqs
            if not n or not (room and self.kv.allocate(req.request_id, n, reserve=self.watermark)):
                if self.running and n:
                    break  # room comes back as running requests finish
                self.arriving.popleft()  # nothing will free blocks (or nothing is held): compute it here
                src.discard(req.request_id, recompute=True)
                self.waiting.append(req)
                continue
            self.arriving.popleft()
            copied += n
            if before_write is not None:
                before_write()
            first = src.load(req, self.kv.tables[req.request_id][:self.kv.blocks_for(n)], n)  # one KV group
            if first is None:
                self.kv.free(req.request_id)
                self.waiting.append(req)
                continue
            req.num_computed_tokens = n
            req.status = Status.RUNNING
            req.cacheable = src.cacheable(req)  # its later blocks are cached (advance) only if so
            self.running.append(req)
            if self.kv.caching and req.cacheable:
                self.kv.cache_blocks(req.request_id, req.token_ids, n, req.cache_salt)
            started.append((req, first))
        return started

    def _evict(self, req: Request, n: int) -> int:
        """Make room for n new tokens under the eviction budget; returns the slots kept before them."""
        held, moves = self.evictor.prepare(req.request_id, req.num_computed_tokens, n)
        self._slots[req.request_id] = (held, moves)
        return held

    def _forget(self, req: Request) -> None:
        if self.evictor is not None:
            self.evictor.forget(req.request_id)
            self._slots.pop(req.request_id, None)

    @staticmethod
    def _waits_on_source(req: Request) -> bool:
        """n > 1: a choice waits until choice 0 has computed its prompt, then reuses those blocks."""
        src = req.share_from
        return src is not None and (src.status == Status.WAITING or (
            src.status == Status.RUNNING and src.num_computed_tokens < src.num_prompt_tokens - 1))

    def _build(self, scheduled: list[tuple[Request, int]]) -> list[ScheduledSeq]:
        seqs = []
        for req, n in scheduled:
            start = req.num_computed_tokens
            self.num_prompt_tokens_scheduled += max(0, min(start + n, req.num_prompt_tokens) - start)
            held, moves = self._slots.pop(req.request_id, (start, ()))
            known = min(n, req.num_tokens - start)
            table, group_tables = self.kv.seq_tables(req.request_id, held + n)
            p = req.params
            score = p.prompt_logprobs is not None and req.index == 0 and start < req.num_prompt_tokens - 1
            history = (list(req.token_ids) if p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty
                       or p.min_tokens else None)
            seqs.append(ScheduledSeq(
                req_id=req.request_id, start=start,
                token_ids=req.token_ids[start:start + known] + req.spec_token_ids[:n - known],
                block_table=table, group_tables=group_tables,
                sample=start + known == req.num_tokens, params=p, seed=req.seed, history=history,
                num_prompt_tokens=req.num_prompt_tokens, num_spec=n - known, score_prompt=score,
                next_token=req.token_ids[start + known] if score and start + known < req.num_prompt_tokens else None,
                cache_start=None if self.evictor is None else held,
                kv_moves=self._physical(req.request_id, moves), adapter=req.adapter))
        seqs.sort(key=lambda s: not s.is_decode)  # stable: decodes first, then the rest
        return seqs

    def prefill_progress(self) -> tuple[int, int, int]:
        """(running requests still in their prompt, prompt tokens they have computed, their prompt tokens)."""
        rows = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        return len(rows), sum(r.num_computed_tokens for r in rows), sum(r.num_prompt_tokens for r in rows)

    def _physical(self, req_id: str, moves) -> list[tuple[int, int]]:
        """Slot indices of a request's table -> flat cache slots."""
        table, bs = self.kv.tables[req_id], self.kv.block_size
        return [(table[a // bs] * bs + a % bs, table[b // bs] * bs + b % bs) for a, b in moves]

    def advance(self, accepted: dict[str, int] | None = None) -> None:
        """After the runner ran the last plan, before the engine appends the tokens it kept: each
        request's known scheduled tokens plus its accepted proposals (accepted[request id]) are now in
        the KV cache. Only tokens already in token_ids (verified) are hashed into the prefix cache;
        accepted proposals follow on the next call, once appended. Blocks held for rejected proposals
        are released."""
        accepted = accepted or {}
        windowed = any(self.kv.windows)
        for req, n, spec in self._last:
            req.num_computed_tokens += n - spec + min(accepted.get(req.request_id, 0), spec)
            if self.kv.caching and req.cacheable:  # blocks full of computed tokens (prompt or output) become cached
                self.kv.cache_blocks(req.request_id, req.token_ids, min(req.num_computed_tokens, req.num_tokens),
                                     req.cache_salt)
            if windowed:  # the next query (at num_computed_tokens) reaches back window - 1 keys
                self.kv.release_behind(req.request_id, req.num_computed_tokens)
            if spec:
                self.kv.shrink(req.request_id, req.num_computed_tokens + 1)
        self._last = []
