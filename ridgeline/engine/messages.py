"""Typed messages across the engine boundary (what an API server, a router or another process
sends an engine). Requests in: EngineRequest; control: AbortRequest, Shutdown. Outputs come back
as RequestOutput deltas (ridgeline/engine/outputs.py). Plain data: no live engine state."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ridgeline.sampling_params import SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt: str | list[int]  # text (tokenized by the engine) or token ids
    params: SamplingParams
    prompt_text: str | None = None  # the prompt as text for outputs, when `prompt` is token ids
    cache_salt: str | None = None  # prefix-cache isolation: only requests with the same salt share KV blocks
    # disaggregation: the prompt's KV and first token computed by a prefill engine (a disagg KVPayload);
    # the engine starts decoding after them, or computes the prompt itself if it cannot use them
    kv: Any = None


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class Shutdown:
    pass
