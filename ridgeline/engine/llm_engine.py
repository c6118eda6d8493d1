"""LLMEngine: owns the loop. add_request() -> step() -> RequestOutputs, until nothing is left."""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import replace

import torch

from ridgeline.config import EngineConfig
from ridgeline.engine.cache_namespace import cache_namespace
from ridgeline.engine.constraints import EngineConstraints
from ridgeline.engine.build import (build_model, build_runner, build_scheduler, build_speculation, context_of,
                                    plan_kv, resolve_source, start_parallel)
from ridgeline.engine.detokenizer import Detokenizer
from ridgeline.engine.group import RequestGroup
from ridgeline.engine.info import EngineInfo
from ridgeline.engine.kv_eviction import describe_eviction
from ridgeline.engine.kv_tier import store_now
from ridgeline.engine.messages import EngineRequest
from ridgeline.engine.outputs import RequestOutput, TokenLogprob
from ridgeline.engine.request import Request, Status
from ridgeline.engine.startup import spec_line
from ridgeline.engine.step_clock import StepClock
from ridgeline.engine.tier_steps import drop_tier, observe_step
from ridgeline.errors import InvalidRequestError, PromptTooLongError
from ridgeline.inputs import check_text
from ridgeline.kv_spec import KVCacheSpec
from ridgeline.layers.linear import weight_summary
from ridgeline.layers.moe import unread_expert_bytes
from ridgeline.engine.kv_centers import calibrate_k_centers
from ridgeline.runner.kv_store import KVStoreError
from ridgeline.sampling_params import SamplingParams
from ridgeline.engine.spec_stats import SpecStats
from ridgeline.step_plan import ScheduledSeq
from ridgeline.weights.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, rank=None):
        """rank: a follower's distributed.group.RankContext (its process was started for it); None: rank 0,
        which with tensor_parallel_size > 1 starts or joins the other ranks. The parts are built by
        engine/build.py's builders, in order; a failure after the other ranks started stops them."""
        t0 = time.perf_counter()
        self.config = config
        src = resolve_source(config)
        self.arch = src.arch
        self.parallel = par = start_parallel(config, src, rank)
        self.group = par.group  # the distributed runtime this process is part of, if any
        # a collected engine (or the process's exit) stops its ranks, unpins this process, leaves the group
        self._release = weakref.finalize(self, par.group.close) if par.group is not None else None
        try:
            self._build(config, src, par, t0)
        except BaseException:
            self.close()
            raise

    @property
    def tp(self):
        """The runtime of ranks that each hold a slice of every layer (tensor parallelism), or None."""
        return self.parallel.tp if self.group is not None else None

    @property
    def pp(self):
        return self.parallel.pp if self.group is not None else None

    @property
    def ep(self):
        return self.parallel.ep if self.group is not None else None

    def _build(self, config: EngineConfig, src, par, t0: float) -> None:
        self.tokenizer = Tokenizer(src.folder)
        model, plan, quantization = build_model(config, src, par, context_of(config, src))
        kv = plan_kv(config, src, par, context_of(config, src))
        self.max_model_len = kv.max_len
        tok_eos = (self.tokenizer.eos_id,) if self.tokenizer.eos_id is not None else ()
        eos = tuple(dict.fromkeys(src.arch.eos_token_ids + tok_eos))
        self.eos_ids = set(eos)
        self.runner, tier, offload_line = build_runner(config, src, par, model, kv, eos)
        self.kv, self.scheduler = build_scheduler(config, src, kv, tier)
        calibrate_k_centers(self)  # centered K formats (int4): before any block is kept
        self.spec, proposer = build_speculation(config, src, kv, self.runner, self.kv, self.scheduler, eos)
        self.runner.keep_hidden = getattr(proposer, "wants_hidden", False)
        self.groups: dict[str, RequestGroup] = {}
        # disaggregation: prompt KV computed by another engine arrives through the scheduler's external
        # KV source (engine/external_kv.py); a prefill worker sets this hook to ship a request's prompt
        # KV when its first token is sampled
        self.kv_export = None  # (request, first token) -> None, on the step thread, blocks still held
        self.step_clock = StepClock()  # where the time between busy steps goes (engine/step_clock.py)
        self.kv_usage = [0, 0]
        self.requests: dict[str, Request] = {}
        # structured outputs (engine/constraints.py): the backend is built on first use
        self.structured = EngineConstraints(self.tokenizer, self.arch.vocab_size, self.eos_ids, par.group is not None)
        self.info = self._describe(config, src, par, model, plan, quantization, kv, eos, proposer, offload_line,
                                   time.perf_counter() - t0)

    def _describe(self, config, src, par, model, plan, quantization, kv, eos, proposer, offload_line,
                  seconds: float) -> EngineInfo:
        cc = config.cache
        evict = cc.kv_eviction != "none"
        pool_bytes = kv.num_blocks * kv.spec.bytes_per_block
        formats, weight_bytes = weight_summary(model)
        per_token = weight_bytes - unread_expert_bytes(model)
        return EngineInfo(
            model_folder=src.folder, architecture=src.arch.architecture, device=src.device, dtype=src.dtype,
            dtype_reason=src.dtype_reason, kv_spec=kv.spec, kernel_plan=plan,
            layer_paths=tuple(self.runner.layer_paths), max_model_len=kv.max_len, num_kv_blocks=kv.num_blocks,
            kv_bytes=(kv.num_blocks - 1) * kv.spec.bytes_per_block, eos_token_ids=eos, load_seconds=seconds,
            prefix_caching=self.kv.caching, weight_formats=formats, weight_bytes=weight_bytes,
            weight_bytes_per_token=per_token,
            speculative=spec_line(config, proposer), quantization=quantization, kv_window=src.arch.kv_window,
            kv_budget=cc.kv_eviction_budget if evict else None, kv_one_table=kv.one_table,
            kv_eviction=describe_eviction(cc) if evict else None, offload=offload_line,
            tensor_parallel=par.tp and par.tp.info(model, kv, pool_bytes),
            pipeline_parallel=par.pp and par.pp.info(model, kv, pool_bytes),
            expert_parallel=par.ep and par.ep.info(model, kv, pool_bytes))

    def follow(self) -> None:
        """A follower rank: run rank 0's calls until it stops the group."""
        try:
            self.group.follow(self.runner, self.max_model_len)
        finally:
            if self.pp is not None:
                log.info("pipeline %s", self.runner.pipeline.stats.line())
            self.group.close()

    def close(self) -> None:
        """Stop the other tensor-parallel ranks or pipeline stages, give back this process's CPU pin and
        leave the group (nothing to do in one process). Idempotent."""
        if self.group is not None:
            if self.pp is not None and not self.group.closed and hasattr(self, "runner"):
                try:
                    for st in self.runner.pipeline_stats():
                        log.info("pipeline %s", st.line())
                except Exception:  # noqa: BLE001  a broken group: the counters are not worth a hang
                    log.debug("pipeline counters not gathered", exc_info=True)
            self._release()  # group.close, once
            self.group = None

    def on_rank_failure(self, callback) -> None:
        """callback(message) runs when another rank dies, before this process exits (the server fails
        its requests in flight there)."""
        if self.group is not None:
            self.group.on_failure(callback)

    @property
    def kv_spec(self) -> KVCacheSpec:
        return self.info.kv_spec

    @property
    def proposer(self):
        return None if self.spec is None else self.spec.proposer

    @property
    def spec_stats(self) -> SpecStats | None:
        """Speculation counters of this engine's life (None when speculation is off)."""
        return None if self.spec is None else self.spec.stats

    # ---- requests in -------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """Text (special tokens in it are parsed: raw prompts may hand-build a template) or token ids."""
        vocab = self.arch.vocab_size
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            ids = self.tokenizer.encode(prompt) if prompt else []
            if ids and max(ids) >= vocab:  # a tokenizer may know more tokens than the model embeds
                raise InvalidRequestError(f"the prompt encodes to token {max(ids)}, outside this model's vocabulary "
                                          f"[0, {vocab}) (its tokenizer has tokens the model has no embedding for)",
                                          "prompt")
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})", "prompt")
        else:
            raise InvalidRequestError(f"prompt must be a string or a list of token ids, not {type(prompt).__name__}",
                                      "prompt")
        if not ids:
            raise InvalidRequestError("prompt is empty: give at least one token", "prompt")
        return ids

    def add(self, request: EngineRequest) -> None:
        if request.kv is None:
            self.add_request(request.request_id, request.prompt, request.params, request.prompt_text,
                             request.cache_salt)
            return
        try:
            if self.scheduler.external is None:
                raise InvalidRequestError("this engine takes no prompt KV from elsewhere (no KV connector is "
                                          "attached)")
            self.add_request(request.request_id, request.prompt, request.params, request.prompt_text,
                             request.cache_salt, request.kv)
        except BaseException:
            request.kv.release()
            raise

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    prompt_text: str | None = None, cache_salt: str | None = None, kv=None,
                    adapter: str | None = None) -> None:
        """cache_salt: requests share prefix-cache blocks only with requests of the same salt. kv: the
        prompt's KV computed elsewhere, offered to the scheduler's external KV source (refused: computed
        here). adapter: a LoRA adapter registered with the runner's deltas; its blocks are keyed in that adapter's
        namespace (engine/cache_namespace.py): with no cache_salt the engine derives it, a caller that gives one
        (a tenant's) must have composed the adapter into it."""
        if request_id in self.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in flight")
        if adapter is not None:
            deltas = self.runner.deltas
            if deltas is None or not deltas.knows(adapter):
                raise InvalidRequestError(f"LoRA adapter {adapter!r} is not loaded", "lora_request")
            if kv is not None:
                raise InvalidRequestError("a LoRA request takes no prompt KV from elsewhere", "lora_request")
            if cache_salt is None:
                cache_salt = cache_namespace(adapter=adapter)
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidRequestError("cache_salt must be a non-empty string", "cache_salt")
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be a SamplingParams, not {type(params).__name__}",
                                      "sampling_params")
        vocab = self.arch.vocab_size
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:  # sorted by id
            raise InvalidRequestError(f"logit_bias: token id {params.logit_bias[-1][0]} is outside this model's "
                                      f"vocabulary [0, {vocab})", "logit_bias")
        if params.top_k >= vocab:  # keeps every token: the same as no top_k, and cheaper to sample
            params = replace(params, top_k=0)
        ids = self.encode_prompt(prompt)
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len)
        ev = self.scheduler.evictor
        peak = self.kv.peak_pages(len(ids) + 1, self.config.scheduler.max_num_batched_tokens, ev and ev.budget)
        if peak > self.kv.num_usable_blocks:
            raise InvalidRequestError(
                f"prompt is {len(ids)} tokens but the KV cache holds only {self.info.kv_capacity_tokens}; "
                "raise --kv-cache-memory", "prompt")
        room = self.max_model_len - len(ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        constraints = self.structured.for_choices(params)
        members: list[Request] = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            members.append(Request(rid, ids, params, max_tokens, seed=seed, group_id=request_id, index=i,
                                   share_from=members[0] if i else None, cache_salt=cache_salt,
                                   spec_stats=SpecStats() if self.spec is not None else None,
                                   constraint=constraints[i], adapter=adapter))
        text = prompt if isinstance(prompt, str) else prompt_text
        self.groups[request_id] = RequestGroup(text, ids, members, [Detokenizer(self.tokenizer, ids, params)
                                                              for _ in members],
                                         [[] if params.logprobs is not None else None for _ in members],
                                         [None] * len(ids) if params.prompt_logprobs is not None else None)
        if kv is not None:
            self.scheduler.external.offer(members[0], kv)
        for r in members:
            self.requests[r.request_id] = r
            self.scheduler.add(r)

    def prompt_logits(self, prompt: list[int]) -> torch.Tensor:
        """Next-token logits [len(prompt), vocab] fp32 after each prompt token, in one forward outside
        the scheduler (for evaluation: KL divergence needs whole distributions). The prompt's KV blocks
        are taken from the free pool and given back; requests in flight are not disturbed."""
        return self._whole_prompt(prompt, self.runner.all_logits)

    def prompt_hidden(self, prompt: list[int]) -> torch.Tensor:
        """Final (normed) hidden states [len(prompt), hidden] of each prompt token, as prompt_logits
        computes them (training data for an EAGLE head)."""
        return self._whole_prompt(prompt, self.runner.all_hidden)

    def _whole_prompt(self, prompt: list[int], forward) -> torch.Tensor:
        ids = self.encode_prompt(prompt)
        if len(ids) > self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len)
        rid = "\0prompt-logits"  # not an id the engine's callers use (theirs are printable)
        if not self.kv.allocate(rid, len(ids)):
            raise InvalidRequestError(f"prompt is {len(ids)} tokens but only {self.kv.num_free_blocks} KV blocks "
                                      "are free; raise --kv-cache-memory", "prompt")
        try:
            table, more = self.kv.seq_tables(rid)
            seq = ScheduledSeq(rid, 0, ids, table, False, SamplingParams(), None, None, len(ids), group_tables=more)
            return forward(seq)
        finally:
            self.kv.free(rid)

    def abort_request(self, request_id: str) -> None:
        group = self.groups.pop(request_id, None)
        if group is None:
            return
        for r in group.members:
            if not r.status.finished:
                self.scheduler.finish(r, Status.FINISHED_ABORTED)
            self.requests.pop(r.request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.groups)

    # ---- the loop ----------------------------------------------------------------------------
    def step(self, emit_unfinished: bool = True) -> list[RequestOutput]:
        """Run one step. Returns a delta (RequestOutput) for every request that changed: new token ids,
        text and logprobs since its last output; with emit_unfinished=False only for requests that
        finished (whole, if never emitted before)."""
        clock = self.step_clock
        clock.begin()
        adopted: set[str] = set()
        if self.scheduler.arriving:  # prompt KV from elsewhere: those requests start before the plan
            clock.mark()
            now = time.monotonic()
            for req, token in self.scheduler.admit_external(self._store_evicted):
                self._append(req, self.groups[req.group_id], token, now)
                adopted.add(req.group_id)
            clock.adopted()
        spec = self.spec
        if spec is not None:
            try:
                spec.propose(self.scheduler.running)
            except KVStoreError as e:  # a proposer's early tier stores (layer-skip): no drafts this step
                self._lose_tier(None, e)
            self.structured.cut_proposals(self.scheduler.running)
        plan = self.scheduler.schedule()
        t0 = time.perf_counter()
        clock.mark()
        try:
            result = self.runner.execute(plan, spec.drafts if spec is not None else None, self.structured.masks(plan, self.requests))
        except KVStoreError as e:
            self._lose_tier(plan, e)
            return []
        except Exception as e:
            if self.group is not None:  # another rank is gone or a collective broke: nothing can step again
                raise self.group.failure(e) from e
            raise
        clock.forwarded(plan)
        observe_step(self.scheduler, plan, result, time.perf_counter() - t0)
        sampled = result.sampled
        if spec is not None:
            if plan.finished_ids:  # first: a new request may reuse a finished one's id in this very step
                spec.forget(plan.finished_ids)
            spec.observe(plan, sampled, self.requests, time.perf_counter() - t0, result.hidden)
        for rid, attention in result.kv_attention.items():
            self.scheduler.evictor.observe(rid, attention)
        self.scheduler.advance({s.req_id: s.accepted for s in sampled if s.accepted})
        self._sample_kv_usage()
        now = time.monotonic()
        touched: dict[str, RequestGroup] = {gid: self.groups[gid] for gid in adopted}
        for rid, pl in result.prompt_logprobs.items():
            store = self.groups[self.requests[rid].group_id].prompt_logprobs
            for i, (t, lp, top) in enumerate(zip(pl.token_ids, pl.logprobs, pl.top)):
                store[pl.start + 1 + i] = TokenLogprob(t, lp, top)
        for s in sampled:
            req = self.requests[s.req_id]
            group = self.groups[req.group_id]
            touched[req.group_id] = group
            if req.max_tokens == 0:  # prompt scoring only: done once the prompt is computed
                req.finish_time = now
                self.scheduler.finish(req, Status.FINISHED_LENGTH)
                continue
            if self.kv_export is not None and req.num_output_tokens == 0:
                self.kv_export(req, s.token_ids[0])  # before _append can finish it and free its blocks
            for i, token in enumerate(s.token_ids):  # one token, or up to k+1 with proposals
                self._append(req, group, token, now)
                if group.logprobs[req.index] is not None and s.logprobs is not None:
                    group.logprobs[req.index].append(TokenLogprob(token, *s.logprobs[i]))
                if req.status.finished:
                    break
        outputs = []
        for gid, group in touched.items():
            done = group.done
            if done or emit_unfinished:
                outputs.append(group.delta(gid))
            if done:
                del self.groups[gid]
                for r in group.members:
                    self.requests.pop(r.request_id, None)
        clock.end(bool(self.groups))
        return outputs

    def _store_evicted(self) -> None:
        """Blocks an allocation evicted go to the KV tier before anything outside a step writes over them."""
        try:
            store_now(self.kv, self.runner.store)
        except KVStoreError as e:
            self._lose_tier(None, e)

    def _lose_tier(self, plan, error: KVStoreError) -> None:
        """The step did not run (plan; None: a copy made before the step's plan failed, nothing loaded):
        go on without the tier, recomputing what depended on it."""
        n = drop_tier(self.scheduler, plan.kv_copies if plan is not None else None)
        self.runner.store = None
        if self.spec is not None and plan is not None and plan.finished_ids:
            self.spec.forget(plan.finished_ids)
        log.warning("%s; the KV offload tier is off from now on, %d request(s) recompute their KV", error, n)

    def _sample_kv_usage(self) -> None:
        """Accumulate (token slots in running requests' blocks, tokens stored in them) once per step."""
        kv, bs = self.kv, self.kv.block_size
        groups = len(kv.windows)  # every KV group's table holds every computed token's slot
        for r in self.scheduler.running:
            held, holes = kv.held_slots(r.request_id)  # blocks a window released: neither slots nor tokens held
            self.kv_usage[0] += (held - holes) * bs
            self.kv_usage[1] += groups * r.num_computed_tokens - holes * bs

    def kv_waste(self) -> float | None:
        """Fraction of allocated KV slots holding no token, averaged over steps since reset_kv_usage()."""
        slots, used = self.kv_usage
        return 1 - used / slots if slots else None

    def reset_kv_usage(self) -> None:
        self.kv_usage = [0, 0]

    def _append(self, req: Request, group: RequestGroup, token: int, now: float) -> None:
        req.token_ids.append(token)
        if req.first_token_time is None:
            req.first_token_time = now
        p = req.params
        status = None
        if token in self.eos_ids and not p.ignore_eos:
            status = Status.FINISHED_STOPPED
        elif token in p.stop_token_ids:
            status, req.stop_reason = Status.FINISHED_STOPPED, token
        elif group.detoks[req.index].add(token):
            status, req.stop_reason = Status.FINISHED_STOPPED, group.detoks[req.index].stopped_by
        if status is None and req.constraint is not None:
            status = self.structured.advance(req, token)
        if status is None and (req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len):
            status = Status.FINISHED_LENGTH
        if status is not None:
            req.finish_time = now
            self.scheduler.finish(req, status)
