"""The engine's side of speculative decoding. Before each step: for every decoding request, decide
how many tokens to draft (the controller, from measured goodput; or pinned at the configured k) and
ask the proposer for them. A seeded random request draws its tokens row by row from its own
generator, so its output depends on how many rows each step verifies: under the controller (whose
choices follow measured time) it drafts nothing, and stays reproducible; with k pinned it drafts. After the step: count what was drafted and accepted (per request and per
engine) and feed the controller the step's cost and each request's acceptance.

Whatever the proposer, a request with structured outputs whose grammar forces the next tokens drafts
those (its Constraint's forced_tokens, as the `grammar` proposer does) and the proposer is not asked
for it this step: forced text first, then the chain (proposers already skip requests a chain's earlier
member drafted for, and catch up later)."""
from __future__ import annotations

import time

from ridgeline.config import SpeculativeConfig
from ridgeline.engine.request import Request
from ridgeline.engine.spec_controller import SpecController
from ridgeline.engine.proposal import ProposalRequest, Proposer
from ridgeline.runner.draft import Draft
from ridgeline.engine.spec_stats import SpecStats
from ridgeline.step_plan import SampledSeq, StepPlan


class Speculation:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, vocab_size: int, max_model_len: int):
        self.config = config
        self.proposer = proposer
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.max_k = config.num_speculative_tokens  # the most drafted per request per step (configure())
        self._controller = SpecController(self.max_k) if config.speculative_controller == "on" else None
        self.controller = self._controller  # None: k pinned at max_k
        self.stats = SpecStats()
        self.drafts: dict[str, Draft] = {}  # request id -> this step's Draft that came with its distribution

    def configure(self, k: int, controller: bool) -> None:
        """From now on draft at most k tokens per request per step (0: none, as a plain engine), with
        the goodput controller choosing below k or not. For benchmarks that compare settings on one
        engine; the controller keeps what it has measured."""
        if not 0 <= k <= self.config.num_speculative_tokens:
            raise ValueError(f"k must be in [0, {self.config.num_speculative_tokens}], got {k}")
        self.max_k = k
        if controller and self._controller is None:
            self._controller = SpecController(self.config.num_speculative_tokens)
        self.controller = self._controller if controller else None

    def propose(self, running: list[Request]) -> None:
        """Set spec_token_ids of every running request (empty unless it decodes and drafts this step)."""
        self.drafts = {}
        decoding, caps = [], []
        for req in running:
            req.spec_token_ids = []
            if req.num_computed_tokens != req.num_tokens - 1:
                continue  # prefilling
            if self.controller is not None and req.seed is not None and not req.params.greedy:
                continue  # its draws follow the rows verified per step, which the controller picks by timing
            cap = min(self.max_k, req.max_tokens - req.num_output_tokens - 1, self.max_model_len - req.num_tokens)
            if cap > 0:
                decoding.append(req)
                caps.append(cap)
        if not decoding:
            return
        ks = caps
        if self.controller is not None:
            # rows past a verification's worth (k + 1) are a catch-up the request's first draft pays
            backlog = [max(0, self.proposer.backlog(r.request_id, r.num_tokens) - self.max_k - 1) for r in decoding]
            left = [r.max_tokens - r.num_output_tokens for r in decoding]
            ks = self.controller.choose([r.request_id for r in decoding], caps, len(decoding), backlog, left)
        want = [(req, ProposalRequest(req.request_id, req.token_ids, k, req.params, req.seed, req.num_prompt_tokens,
                                      req.constraint))
                for req, k in zip(decoding, ks) if k > 0]
        if not want:
            return
        t0 = time.perf_counter()
        forced = {req.request_id: f for req, pr in want if req.constraint is not None
                  and (f := req.constraint.forced_tokens()[:pr.k])}
        ask = [pr for req, pr in want if req.request_id not in forced]
        asked = iter(self.proposer.propose(ask) if ask else [])
        proposals = [forced[req.request_id] if req.request_id in forced else next(asked) for req, _ in want]
        elapsed = time.perf_counter() - t0
        self.stats.draft_time += elapsed
        if self.controller is not None:
            self.controller.observe_draft(max(ks), max(0.0, elapsed - self.proposer.setup_time))
            self.controller.charge(self.proposer.setup_time, self.proposer.setup_rows)
        drafted = []
        for (req, pr), got in zip(want, proposals):
            req.spec_stats.draft_time += elapsed / len(want)
            draft = got if isinstance(got, Draft) else None
            tokens = [int(t) for t in (draft.token_ids if draft else got)[:pr.k]]
            if any(not 0 <= t < self.vocab_size for t in tokens):
                raise RuntimeError(f"proposer {self.proposer.name} proposed a token outside the vocabulary")
            req.spec_token_ids = tokens
            drafted.append(len(tokens))
            if draft is not None and draft.probs is not None and tokens:
                self.drafts[req.request_id] = draft
        if self.controller is not None:
            self.controller.observe_use([pr.k for _, pr in want], drafted)

    def observe(self, plan: StepPlan, sampled: list[SampledSeq], requests: dict[str, Request],
                seconds: float, hidden=None) -> None:
        """After the runner ran plan in `seconds`: count drafts, feed the controller, and hand a
        proposer that reads the target's hidden states (`wants_hidden`) this step's."""
        if hidden is not None and (self.max_k or self.controller is not None):
            # (pinned off, configure(0, False), the engine runs as a plain one: a benchmark's "off" pays
            # no head bookkeeping; drafting turned on later starts after a gap, as a dropped backlog does)
            t0 = time.perf_counter()
            self.proposer.observe(plan, sampled, hidden, requests)
            self.stats.draft_time += time.perf_counter() - t0
        for s in sampled:
            if s.proposed:
                self.stats.record(s)
                requests[s.req_id].spec_stats.record(s)
        if self.controller is None:
            return
        for s in sampled:
            if s.proposed:
                self.controller.observe_acceptance(s.req_id, s.proposed, s.accepted)
        if plan.seqs and all(s.sample and s.num_new == s.num_spec + 1 for s in plan.seqs):
            self.controller.observe_step(plan.num_tokens, seconds)  # decodes only: the cost it decides on

    def forget(self, req_ids: list[str]) -> None:
        self.proposer.forget(req_ids)
        if self.controller is not None:
            self.controller.forget(req_ids)
