"""The engine's side of structured outputs: one Constraint per choice (engine/constraint.py), kept in
step with each request's verified tokens. Before a step, proposals are cut at the first token a
constraint forbids and every sampled row gets its mask; after it, each accepted token advances its
request's constraint, and a complete output ends the request (finish_reason stop)."""
from __future__ import annotations

import logging
import threading

from ridgeline.engine.constraint import ConstraintBackend, create_backend, mask_rows
from ridgeline.engine.request import Request, Status
from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineConstraints:
    def __init__(self, tokenizer, vocab_size: int, eos_ids, parallel: bool):
        self._make = lambda: create_backend(tokenizer, vocab_size, sorted(eos_ids))
        self._backend: ConstraintBackend | None = None  # built on first use
        self._lock = threading.Lock()  # the server's event loop and the step thread may both ask first
        self.parallel = parallel  # masks are built in rank 0's process only

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
        return [self.backend.create(params.structured) for _ in range(params.n)]

    @staticmethod
    def cut_proposals(running) -> None:
        """A request's proposals end before the first token its constraint forbids."""
        for req in running:
            if req.constraint is not None and req.spec_token_ids:
                del req.spec_token_ids[req.constraint.valid_prefix(req.spec_token_ids):]

    @staticmethod
    def masks(plan, requests: dict[str, Request]) -> dict[str, list[bytes]] | None:
        """The allowed-token bitmask of every row each constrained request samples (None: no such row)."""
        masks = None
        for s in plan.seqs:
            c = requests[s.req_id].constraint if s.sample else None
            if c is not None:
                masks = masks or {}
                masks[s.req_id] = mask_rows(c, s.token_ids[len(s.token_ids) - s.num_spec:] if s.num_spec else [])
        return masks

    @staticmethod
    def advance(req: Request, token: int) -> Status | None:
        """The output grew by token: its constraint follows; complete (nothing but EOS may come) ends
        it with finish_reason stop, even on its last allowed token (a complete output is not cut)."""
        if not req.constraint.advance(token):  # the mask forbids it: never sampled, unless a bug
            log.error("request %s: token %d is outside its structured output; ending it", req.request_id, token)
            return Status.FINISHED_STOPPED
        return Status.FINISHED_STOPPED if req.constraint.is_done else None
