"""The decode engine's side of a transfer: a request that arrives with its prompt's KV (a payload)
starts decoding from it instead of computing its prompt.

At add, the payload is checked once (pool layout, prompt tokens, one choice, nothing that needs the
prompt's logits); a payload that cannot be used is released and the request is computed as usual
(recompute: same output, only slower). A usable one waits here, outside the scheduler's queues,
until the pool has room for its blocks (above the admission watermark, under max_num_seqs); then,
before the step's plan is made, its blocks are allocated, the payload's bytes written into them,
its prompt counted as computed, and its first token appended as if this engine had sampled it.
Its blocks (and those it fills later) enter the prefix cache only when the payload came over an
authenticated connector (`KVPayload.authenticated`): KV from anywhere else serves its own request,
never another's. A
payload whose bytes cannot be written (they do not fit its blocks) is dropped there and then, its
blocks freed, and its request computed as usual: no other request is touched. The copying is on the step thread, between two steps: it is bounded to
max_num_batched_tokens prompt tokens a step (one payload at least), as a prefill chunk is, so a
burst of arrivals spreads over steps instead of stalling the decodes in flight. A seeded request's generator continues from the prefill's state, so
sampled output matches a co-located engine's too. The request then decodes as any other.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ridgeline.disagg.blocks import scatter
from ridgeline.disagg.payload import KVPayload, spec_key, unusable
from ridgeline.engine.request import Request, Status
from ridgeline.engine.kv_tier import store_now
from ridgeline.runner.kv_store import KVStoreError

log = logging.getLogger(__name__)


@dataclass
class TransferStats:
    adopted: int = 0  # requests that started from a transferred prompt KV
    recomputed: int = 0  # requests whose payload could not be used: computed here
    tokens: int = 0  # prompt tokens adopted


class Adoptions:
    def __init__(self, engine):
        self.engine = engine
        self.pending: dict[str, tuple[Request, KVPayload]] = {}  # FIFO
        self.stats = TransferStats()

    def offer(self, request_id: str, payload: KVPayload) -> None:
        """Right after the engine added request_id (in its waiting queue): take it out to adopt later,
        or leave it to be computed."""
        group = self.engine.groups[request_id]
        req = group.members[0]
        why = self._why_not(group, req, payload)
        if why is not None:
            payload.release()
            self.stats.recomputed += 1
            log.info("%s: computing the prompt here: the transferred KV is not usable (%s)", request_id, why)
            return
        self.engine.scheduler.waiting.remove(req)
        self.pending[req.request_id] = (req, payload)

    def _why_not(self, group, req: Request, payload: KVPayload) -> str | None:
        if len(group.members) != 1:
            return "n > 1"
        p = req.params
        if p.prompt_logprobs is not None or p.logprobs is not None:
            return "logprobs need the prompt's logits"
        if req.max_tokens < 1:
            return "max_tokens 0"
        if not 0 <= payload.header.first_token < self.engine.arch.vocab_size:
            return "its first token is outside the vocabulary"
        if len(req.prompt_token_ids) > self.engine.max_model_len:
            return "its prompt is over max_model_len"
        spec = self.engine.kv_spec
        return unusable(payload, spec_key(spec), req.prompt_token_ids, spec.block_size, spec.bytes_per_block)

    def drop(self, request_id: str) -> None:
        item = self.pending.pop(request_id, None)
        if item is not None:
            item[1].release()

    def close(self) -> None:
        for rid in list(self.pending):
            self.drop(rid)

    def run(self) -> set[str]:
        """Adopt pending requests in order while the pool has room and this step's copy budget lasts;
        returns the groups that got a token."""
        eng = self.engine
        sched, kv = eng.scheduler, eng.kv
        touched: set[str] = set()
        budget, copied = sched.config.max_num_batched_tokens, 0
        for rid, (req, payload) in list(self.pending.items()):
            n = payload.num_tokens
            if touched and copied + n > budget:
                break  # bounded per step like a prefill chunk; the rest wait for the next steps, in order
            room = len(sched.running) < sched.config.max_num_seqs
            if payload.released or not (room and kv.allocate(rid, n, reserve=sched.watermark)):
                if sched.running and not payload.released:
                    break  # room comes back as running requests finish
                del self.pending[rid]  # nothing will free blocks: compute it as usual
                payload.release()
                self.stats.recomputed += 1
                sched.add(req)
                continue
            del self.pending[rid]
            copied += n
            try:  # blocks the allocation evicted go to the KV tier before the payload is written over them
                store_now(kv, eng.runner.store)
            except KVStoreError as e:
                eng._lose_tier(None, e)
            if not self._write(req, payload, n):
                kv.free(rid)
                self.stats.recomputed += 1
                sched.add(req)
                continue
            req.num_computed_tokens = n
            req.status = Status.RUNNING
            req.cacheable = payload.authenticated  # the scheduler caches its later blocks only if so
            sched.running.append(req)
            if kv.caching and req.cacheable:
                kv.cache_blocks(rid, req.token_ids, n, req.cache_salt)
            self.stats.adopted += 1
            self.stats.tokens += n
            group = eng.groups[req.group_id]
            eng._append(req, group, payload.header.first_token, time.monotonic())
            touched.add(req.group_id)
        return touched

    def _write(self, req: Request, payload: KVPayload, n: int) -> bool:
        """The payload's bytes into req's blocks (and its generator state); False, with a warning, when
        they do not fit. The payload is released either way."""
        kv = self.engine.kv
        try:
            scatter(self.engine.runner.kv, kv.tables[req.request_id][:kv.blocks_for(n)], payload.data, n)
            self._restore_generator(req, payload)
            return True
        except (ValueError, RuntimeError) as e:
            log.warning("%s: computing the prompt here: its transferred KV could not be written (%s)",
                        req.request_id, e)
            return False
        finally:
            payload.release()

    def _restore_generator(self, req: Request, payload: KVPayload) -> None:
        state = payload.header.rng_state
        if state is None or req.seed is None or req.params.greedy:
            return
        g = torch.Generator(self.engine.runner.device)
        g.set_state(torch.tensor(state, dtype=torch.uint8))
        self.engine.runner.sample.generators[req.request_id] = g
