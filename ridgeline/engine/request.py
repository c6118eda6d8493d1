"""A request's token ids and counters. Owned by the engine; the scheduler moves it between queues."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from ridgeline.sampling_params import SamplingParams
from ridgeline.engine.constraint import Constraint
from ridgeline.engine.spec_stats import SpecStats


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH, Status.FINISHED_ABORTED)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: min(params.max_tokens, max_model_len - prompt length)
    seed: int | None = None
    group_id: str = ""  # the user-visible id; n > 1 makes several requests of one group
    index: int = 0  # choice index within the group
    share_from: Request | None = None  # n > 1: reuse this request's prompt blocks once computed
    cache_salt: str | None = None  # prefix-cache isolation: only requests with the same salt share blocks
    cacheable: bool = True  # False: its blocks never enter the prefix cache (KV from a source nobody vouched for)
    arrival_time: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache / a shared prompt, at first admission
    num_tier_cached_tokens: int = 0  # of those, loaded back from the second KV tier
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    token_ids: list[int] = field(init=False)  # prompt + output, appended in place (verified tokens only)
    spec_token_ids: list[int] = field(default_factory=list)  # proposed for the next step, not yet verified
    spec_stats: SpecStats | None = None  # speculation on: what was drafted and accepted for this request
    # structured outputs: this choice's matcher, advanced with every verified output token (engine/constraint.py)
    constraint: Constraint | None = None
    adapter: str | None = None  # the LoRA adapter it runs under (registered with the runner's deltas); None: base

    def __post_init__(self):
        self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.group_id = self.group_id or self.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]
