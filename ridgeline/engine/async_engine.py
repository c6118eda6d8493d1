"""AsyncEngine: LLMEngine.step() in a background thread, outputs fed to asyncio streams.

Two threads, one owner each:
- the step thread owns the LLMEngine: only it calls add_request, abort_request and step. Adds and
  aborts from the event loop are queued ops, applied in order between steps.
- the event-loop thread owns the streams and the waiting/running counts. Each step's outputs cross
  over in one loop.call_soon_threadsafe call, so a token reaches its stream the step it is sampled.
The forward releases the GIL, so the event loop keeps serving HTTP while a step runs.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from ridgeline.engine.constraints import StructuredStats
from ridgeline.engine.kv_tier import TierStats
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.messages import AbortRequest, EngineRequest, Shutdown
from ridgeline.engine.outputs import RequestOutput
from ridgeline.errors import RankFailedError, RidgelineError
from ridgeline.engine.spec_stats import SpecStats

log = logging.getLogger(__name__)


class EngineStoppedError(RidgelineError):
    status = 503
    type = "service_unavailable"


class EngineStepError(RidgelineError):
    """A step raised (a bug, not bad input): its requests end with this generic 500. The detail is
    logged once, by the step thread; clients never see it."""
    status = 500
    type = "server_error"
    logged = True

    def __init__(self):
        super().__init__("internal error")


@dataclass(frozen=True)
class EngineStats:
    """Written whole by the step thread after every step and batch of ops; read from any thread."""
    kv_blocks_used: int  # referenced by a request
    kv_blocks_total: int
    num_preemptions: int
    kv_blocks_free: int = 0  # holding nothing reusable
    kv_blocks_cached: int = 0  # prefix-cache blocks no request uses (evictable)
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # tokens served from it
    prefix_cache_evictions: int = 0
    speculative: SpecStats | None = None  # a copy of the engine's counters; None when speculation is off
    kv_tier: str | None = None  # the second KV tier (cpu, disk), None when off
    kv_tier_stats: TierStats | None = None  # a copy of its counters
    kv_tier_block_bytes: int = 0
    num_recomputed_tokens: int = 0  # computed tokens preemption dropped and readmission computed again
    kv_tier_slots: tuple[int, int, int] = (0, 0, 0)  # the second tier's slots: total, cached, free
    # (most requests holding KV blocks at once, the most before the first preemption, how many held blocks at it)
    running_peaks: tuple[int, int, int] = (0, 0, 0)
    structured: StructuredStats | None = None  # structured outputs' counters (a copy)
    prompt_tokens_scheduled: int = 0  # prompt tokens computed (or being computed) so far, recomputation included
    prefill: tuple[int, int, int] = (0, 0, 0)  # requests in their prompt: (how many, tokens computed, prompt tokens)


class RequestStream:
    """Outputs of a set of engine requests, first-come per request. Outputs are deltas: an unread one
    is merged with its successor, so a slow reader gets fewer, larger deltas and never lags."""

    def __init__(self, owner: AsyncEngine, request_ids: list[str], name: str):
        self._owner = owner
        self.name = name  # the HTTP request's id, for the log
        self.unfinished = set(request_ids)
        self._ready: dict[str, RequestOutput] = {}
        self._error: BaseException | None = None
        self._event = asyncio.Event()

    def _put(self, out: RequestOutput) -> None:
        unread = self._ready.get(out.request_id)
        self._ready[out.request_id] = out if unread is None else unread.merge(out)
        self._event.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        while not self._ready:
            if self._error is not None:
                raise self._error
            if not self.unfinished:
                raise StopAsyncIteration
            self._event.clear()
            await self._event.wait()
        out = self._ready.pop(next(iter(self._ready)))
        if out.finished:
            self.unfinished.discard(out.request_id)
        return out

    def abort(self) -> None:
        """Abort whatever has not finished (idempotent); its KV blocks are freed before the next step."""
        for rid in self.unfinished:
            self._owner.abort(rid)
        self.unfinished.clear()


@dataclass(frozen=True)
class _Add:
    """Requests to add atomically; `done` settles on the event loop once the step thread has."""
    requests: list[EngineRequest]
    done: asyncio.Future


@dataclass(frozen=True)
class _Call:
    """fn(engine), run by the step thread between steps (it owns the engine); `done` settles on the event
    loop with what fn returned or raised."""
    fn: Callable
    done: asyncio.Future


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._ops: deque[_Add | _Call | AbortRequest | Shutdown] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._live: set[str] = set()  # step thread: requests added and not yet finished or aborted
        self._streams: dict[str, RequestStream] = {}  # event loop: unfinished request -> its stream
        self._no_token_yet: dict[str, int] = {}  # event loop: subset of _streams still waiting -> its n
        self._adding: set[asyncio.Future] = set()  # event loop: adds the step thread has not applied yet
        self._refusal: BaseException | None = None  # event loop: set by abort_all, raised by add
        # tests: called on the step thread before each step; False holds the step (adds and aborts still
        # apply) until the next op or wake(). Makes "still running when X happens" certain, not raced.
        self.step_gate = None
        self.after_step = None  # called on the step thread after each step (KV event publishing)
        self.stats = self._snapshot()
        engine.on_rank_failure(self._rank_failed)

    # ---- event-loop side ---------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="ridgeline-step", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def num_waiting(self) -> int:
        """Requests accepted that have no token yet (queued, waiting, or in prefill)."""
        return len(self._no_token_yet)

    @property
    def num_waiting_seqs(self) -> int:
        """Sequences (choices: each waiting request's n) accepted that have no token yet."""
        return sum(self._no_token_yet.values())

    @property
    def num_running(self) -> int:
        return len(self._streams) - len(self._no_token_yet)

    async def add(self, requests: list[EngineRequest], name: str | None = None) -> RequestStream:
        """Add requests atomically (one bad request adds none); raises the engine's error."""
        if self._refusal is not None:
            raise self._refusal
        if not self.alive:
            raise EngineStoppedError("the server is shutting down")
        ids = [r.request_id for r in requests]
        stream = RequestStream(self, ids, name or ids[0])
        for r in requests:
            self._streams[r.request_id] = stream
            self._no_token_yet[r.request_id] = r.params.n
        done = self._loop.create_future()
        self._adding.add(done)
        self._post(_Add(requests, done))
        try:
            await done
        except BaseException:  # includes cancellation: the add may still land, so abort after it
            for rid in ids:
                self.abort(rid)
            raise
        finally:
            self._adding.discard(done)
        return stream

    async def call(self, fn: Callable):
        """fn(engine) on the step thread, between two steps (a forward outside the scheduler: embeddings);
        returns its result or raises its error. Refused, like add, once the server is stopping."""
        if self._refusal is not None:
            raise self._refusal
        if not self.alive:
            raise EngineStoppedError("the server is shutting down")
        done = self._loop.create_future()
        self._adding.add(done)  # failed with the adds if the server stops first
        self._post(_Call(fn, done))
        try:
            return await done
        finally:
            self._adding.discard(done)

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._no_token_yet.pop(request_id, None)
        self._post(AbortRequest(request_id))

    def abort_all(self, error: BaseException) -> list[RequestStream]:
        """End every unfinished request with `error` and refuse new ones (the drain deadline). Returns
        the streams failed, one per HTTP request. Does not wait for the step thread, which may be in a
        long step: their readers get `error` now, and the engine drops them before its next step."""
        self._refusal = error
        streams = list(dict.fromkeys(self._streams.values()))
        for rid in list(self._streams):
            self.abort(rid)
        for stream in streams:
            stream._fail(error)
        for done in self._adding:
            if not done.done():
                done.set_exception(error)
        return streams

    async def stop(self, timeout: float = 10.0) -> None:
        """Abort everything left and end the step thread."""
        self._stopping = True
        self._post(Shutdown())
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, timeout)
        error = EngineStoppedError("the server shut down before this request finished")
        for stream in set(self._streams.values()):
            stream._fail(error)
        self._streams.clear()
        self._no_token_yet.clear()
        for done in self._adding:
            if not done.done():
                done.set_exception(error)

    def _rank_failed(self, message: str) -> None:
        """Another tensor-parallel rank died (called on its watchdog thread; the process exits next):
        every request in flight ends now with that reason."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.abort_all, RankFailedError(f"{message}; the server is exiting"))

    def wake(self) -> None:
        """Have the step thread look at its ops and step_gate again."""
        self._wake.set()

    def _post(self, op: _Add | _Call | AbortRequest | Shutdown) -> None:
        self._ops.append(op)
        self._wake.set()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._no_token_yet.pop(out.request_id, None)
            stream = self._streams.pop(out.request_id, None) if out.finished else self._streams.get(out.request_id)
            if stream is not None:
                stream._put(out)

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for rid in request_ids:
            self._no_token_yet.pop(rid, None)
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream._fail(error)

    # ---- step-thread side --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self._apply_ops():
                break
            if not self.engine.has_unfinished() or (self.step_gate is not None and not self.step_gate()):
                self.stats = self._snapshot()
                self._wake.wait()
                continue
            try:
                outputs = self.engine.step()
            except RankFailedError as e:  # another rank is gone: its watchdog ends this process next
                log.error("%s", e)
                self._abort_all(e)
                continue
            except Exception:  # a bug, not bad input: end the requests in flight, keep serving
                # never retried: a retry would advance seeded generators twice
                log.exception("engine step failed; ending the %d request(s) in flight with a 500", len(self._live))
                self._abort_all(EngineStepError())
                continue
            finally:
                if self.after_step is not None:
                    self.after_step()
            for out in outputs:
                if out.finished:
                    self._live.discard(out.request_id)
            self.stats = self._snapshot()
            if outputs:
                self._to_loop(self._dispatch, outputs)
        self._abort_all(EngineStoppedError("the server shut down before this request finished"))

    def _apply_ops(self) -> bool:
        while self._ops:
            op = self._ops.popleft()
            if isinstance(op, _Add):
                self._add(op.requests, op.done)
            elif isinstance(op, _Call):
                try:
                    value, error = op.fn(self.engine), None
                except Exception as e:  # the caller's error (a 400 it raised, or a bug it reports)
                    value, error = None, e
                self._to_loop(_settle_value, op.done, value, error)
            elif isinstance(op, AbortRequest):
                self.engine.abort_request(op.request_id)
                self._live.discard(op.request_id)
            else:
                return False
        self.stats = self._snapshot()
        return True

    def _add(self, requests: list[EngineRequest], done: asyncio.Future) -> None:
        added: list[str] = []
        try:
            for r in requests:
                self.engine.add(r)
                added.append(r.request_id)
        except Exception as e:
            for rid in added:
                self.engine.abort_request(rid)
            self._to_loop(_settle, done, e)
            return
        self._live.update(added)
        self._to_loop(_settle, done, None)

    def _abort_all(self, error: BaseException) -> None:
        ids = list(self._live)
        for rid in ids:
            self.engine.abort_request(rid)
        self._live.clear()
        self.stats = self._snapshot()
        if ids:
            self._to_loop(self._fail, ids, error)

    def _to_loop(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is left to tell
            pass

    def _snapshot(self) -> EngineStats:
        kv = self.engine.kv
        spec = self.engine.spec_stats.copy() if self.engine.proposer is not None else None
        tier, sched = kv.tier, self.engine.scheduler
        return EngineStats(kv.num_used_blocks, kv.num_usable_blocks, self.engine.scheduler.num_preemptions,
                           len(kv.free_ids), kv.num_cached_blocks, kv.stats.queries, kv.stats.hits,
                           kv.stats.evictions, spec, tier and tier.name, tier and replace(tier.stats),
                           tier.block_bytes if tier else 0, self.engine.scheduler.num_recomputed_tokens,
                           (tier.num_slots, len(tier.lru), len(tier.free_slots)) if tier else (0, 0, 0),
                           (sched.peak_running, sched.peak_running_before_preemption,
                            sched.running_at_first_preemption), self.engine.structured.stats,
                           sched.num_prompt_tokens_scheduled, sched.prefill_progress())


def build_off_main_thread(factory):
    """Run `factory()` (build the LLMEngine) in a short-lived thread and return its result.

    Invariant: only the step thread runs OpenMP work. Loading a model runs OpenMP regions; had the
    main thread run them, its libgomp team would stay alive beside the step thread's, and with more
    OpenMP threads than cores libgomp throttles its spin-waits: every parallel region then pays a
    futex wake-up (measured: 35 ms instead of 18 ms per batch-1 decode step). A thread that exits
    takes its team with it."""
    box: dict = {}

    def run():
        try:
            box["value"] = factory()
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="ridgeline-load")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _settle_value(future: asyncio.Future, value, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    _settle_value(future, None, error)
