"""The engine's side of structured outputs: one Constraint per choice (engine/constraint.py), kept in
step with each request's verified tokens. Before a step, proposals are cut at the first token a
constraint forbids and every sampled row gets its mask; after it, each accepted token advances its
request's constraint, and a complete output ends the request (finish_reason stop). The counters
(StructuredStats) are the step thread's; the server reads a copy (/metrics)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

from ridgeline.engine.constraint import ConstraintBackend, create_backend, mask_rows
from ridgeline.engine.request import Request, Status
from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class StructuredStats:
    choices: int = 0  # constrained choices started
    mask_rows: int = 0  # mask rows built (one per sampled position of a constrained choice)
    mask_steps: int = 0  # steps that built any
    mask_seconds: float = 0.0  # building them, on the step thread
    tokens: int = 0  # output tokens of constrained choices
    forced_tokens: int = 0  # of those, tokens the grammar forced (what a `grammar` draft proposes)
    compiles: int = 0  # grammars compiled (cache misses): the backend's
    compile_seconds: float = 0.0


class EngineConstraints:
    def __init__(self, tokenizer, vocab_size: int, eos_ids, parallel: bool):
        self._make = lambda: create_backend(tokenizer, vocab_size, sorted(eos_ids))
        self._backend: ConstraintBackend | None = None  # built on first use
        self._lock = threading.Lock()  # the server's event loop and the step thread may both ask first
        self.parallel = parallel  # masks are built in rank 0's process only
        self._stats = StructuredStats()

    @property
    def stats(self) -> StructuredStats:
        """A copy of the counters, the backend's compile counters included."""
        b = self._backend
        return replace(self._stats, compiles=b.compiles if b else 0, compile_seconds=b.compile_seconds if b else 0.0)

    @property
    def backend(self) -> ConstraintBackend:
        with self._lock:
            if self._backend is None:
                self._backend = self._make()
            return self._backend

    def for_choices(self, params: SamplingParams) -> list:
        """One constraint per choice (None each without structured outputs)."""
        if params.structured is None:
            return [None] * params.n
        if self.parallel:
            raise InvalidRequestError("structured outputs are not supported with tensor, pipeline or expert "
                                      "parallelism yet", "structured_outputs", code="unsupported_parameter")
        choices = [self.backend.create(params.structured) for _ in range(params.n)]
        self._stats.choices += params.n
        return choices

    @staticmethod
    def cut_proposals(running) -> None:
        """A request's proposals end before the first token its constraint forbids."""
        for req in running:
            if req.constraint is not None and req.spec_token_ids:
                del req.spec_token_ids[req.constraint.valid_prefix(req.spec_token_ids):]

    def masks(self, plan, requests: dict[str, Request]) -> dict[str, list[bytes]] | None:
        """The allowed-token bitmask of every row each constrained request samples (None: no such row)."""
        masks, t0 = None, 0.0
        for s in plan.seqs:
            c = requests[s.req_id].constraint if s.sample else None
            if c is not None:
                if masks is None:
                    masks, t0 = {}, time.perf_counter()
                masks[s.req_id] = rows = mask_rows(c, s.token_ids[len(s.token_ids) - s.num_spec:] if s.num_spec else [])
                self._stats.mask_rows += len(rows)
        if masks is not None:
            self._stats.mask_steps += 1
            self._stats.mask_seconds += time.perf_counter() - t0
        return masks

    def advance(self, req: Request, token: int) -> Status | None:
        """The output grew by token: its constraint follows; complete (nothing but EOS may come) ends
        it with finish_reason stop, even on its last allowed token (a complete output is not cut)."""
        forced = req.constraint.forced_tokens()
        self._stats.tokens += 1
        self._stats.forced_tokens += bool(forced) and forced[0] == token
        if not req.constraint.advance(token):  # the mask forbids it: never sampled, unless a bug
            log.error("request %s: token %d is outside its structured output; ending it", req.request_id, token)
            return Status.FINISHED_STOPPED
        return Status.FINISHED_STOPPED if req.constraint.is_done else None
