"""What the scheduler hands the runner each step: plain data, no torch, and no live references into
engine state (lists are copies), so a plan can cross a process boundary."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ridgeline.sampling_params import SamplingParams


@dataclass
class TierCopies:
    """One step's copies, in order: stores (pool block -> slot), then loads (slot -> pool block)."""
    stores: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.stores or self.loads)


@dataclass
class ScheduledSeq:
    req_id: str
    start: int  # tokens already in the KV cache; this step computes positions start..start+len(token_ids)
    token_ids: list[int]  # known tokens, then num_spec proposed ones at the end
    block_table: list[int]  # the request's blocks covering positions 0..start+len(token_ids)-1 (a copy)
    sample: bool  # this step reaches the end of the known tokens: sample the next one (and verify proposals)
    params: SamplingParams
    seed: int | None
    history: list[int] | None  # prompt + output so far, copied only when penalties or min_tokens need it
    num_prompt_tokens: int
    num_spec: int = 0  # proposed tokens at the end of token_ids, verified by this step
    score_prompt: bool = False  # prompt_logprobs: score the prompt tokens this chunk predicts
    next_token: int | None = None  # ... the prompt token after this chunk (its last row's target), if any
    # KV eviction: the slots of this request's kept tokens before this step (its new tokens follow
    # them; None: start, slots are positions), and (from, to) flat slots to move before the forward
    cache_start: int | None = None
    kv_moves: list[tuple[int, int]] = field(default_factory=list)
    # KV groups (ridgeline/kv_groups.py): the other groups' tables over the same positions (block_table is
    # group 0's); empty with one table for every layer
    group_tables: list[list[int]] = field(default_factory=list)
    adapter: str | None = None  # the LoRA adapter this request runs under (ridgeline/lora); None: the base model

    @property
    def num_new(self) -> int:
        return len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        """One token past the prompt: the per-row decode kernel. A one-token prompt chunk is not one:
        prompt rows take the prompt kernel whatever chunk they fall in, so a row's bits never depend
        on where the scheduler cut the prompt."""
        return len(self.token_ids) == 1 and self.start >= self.num_prompt_tokens


@dataclass
class StepPlan:
    seqs: list[ScheduledSeq] = field(default_factory=list)  # decodes (is_decode) first, then the rest
    finished_ids: list[str] = field(default_factory=list)  # requests that left since the last plan
    num_preempted: int = 0
    kv_copies: TierCopies | None = None  # second KV tier: blocks to store and load before the forward

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def empty(self) -> bool:
        return not self.seqs


@dataclass
class PromptLogprobs:
    """Logprobs of prompt tokens start+1 .. start+len(token_ids) of one request, computed this step."""
    start: int  # the position predicting the first of them
    token_ids: list[int]  # the prompt tokens scored (the targets)
    logprobs: list[float]
    top: list[list[tuple[int, float]]]


@dataclass
class SampledSeq:
    """What the runner returns per sampling sequence: the tokens it keeps, in order. Without proposals
    that is one token; with k proposals, the first `accepted` of them (they matched what the target
    sampled) and one more sampled token, so 1..k+1 tokens."""
    req_id: str
    token_ids: list[int]
    accepted: int = 0  # proposals kept
    proposed: int = 0  # proposals verified (the sequence's num_spec)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None  # per kept token: (logprob, top)


@dataclass
class StepResult:
    sampled: list[SampledSeq] = field(default_factory=list)
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)  # request id -> this step's
    # KV eviction by attention (h2o): request id -> attention each of its slots received this step
    kv_attention: dict[str, object] = field(default_factory=dict)
    hidden: Any = None  # [tokens, hidden] final hidden state of every row, when the runner keeps them
    kv_copy: tuple[int, float] | None = None  # second KV tier: (bytes copied, seconds) before the forward
