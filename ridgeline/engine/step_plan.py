"""What the scheduler hands the runner each step: plain data, no torch."""
from __future__ import annotations

from dataclasses import dataclass, field

from ridgeline.sampling_params import SamplingParams


@dataclass
class ScheduledSeq:
    req_id: str
    start: int  # tokens already in the KV cache; this step computes positions start..start+len(token_ids)
    token_ids: list[int]
    block_table: list[int]  # the request's table (a live reference; read-only for the runner)
    sample: bool  # this step reaches the end of the known tokens: sample the next one
    params: SamplingParams
    seed: int | None
    all_token_ids: list[int]  # prompt + output so far (live reference), for penalties
    num_prompt_tokens: int

    @property
    def num_new(self) -> int:
        return len(self.token_ids)


@dataclass
class StepPlan:
    seqs: list[ScheduledSeq] = field(default_factory=list)  # decodes (1 new token) first, then prefills
    finished_ids: list[str] = field(default_factory=list)  # requests that left since the last plan
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def empty(self) -> bool:
        return not self.seqs
