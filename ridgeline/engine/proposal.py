"""The proposer seam: what the core asks of speculative decoding. Proposers guess the next k tokens
of decoding requests; the target verifies them all in one step (runner/step_sampler.py), so a
right guess saves a step and a wrong one costs only the extra rows. A registry, keyed by name
(SpeculativeConfig.method), of classes with one method: the built-in ones (ridgeline/speculative/)
are named here by module and imported on first use; any other package registers with
`register_proposer`.

A proposal is either plain token ids (a deterministic guess: kept while it equals what the target
samples) or a `Draft`: tokens sampled from a draft distribution q, given with q itself, so that
verification can accept each with probability min(1, p/q) and resample from max(p - q, 0) on the
first rejection. Either way the output follows the target's distribution exactly."""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ridgeline.config import SpeculativeConfig
from ridgeline.errors import InvalidRequestError
from ridgeline.runner.draft import Draft
from ridgeline.sampling_params import SamplingParams

PROPOSERS: dict[str, type[Proposer]] = {}
# the sampling of a draft's own forward steps (a model-based draft drafts greedily)
DRAFT_GREEDY = SamplingParams(temperature=0, max_tokens=1 << 30, ignore_eos=True)
# the built-in proposers, by module (imported when a method names them: torch-side modules load only then)
_BUILTIN = {"ngram": "ridgeline.speculative.ngram", "draft": "ridgeline.speculative.draft",
            "layer-skip": "ridgeline.speculative.layer_skip", "eagle": "ridgeline.speculative.eagle",
            "grammar": "ridgeline.structured.grammar_drafts"}
_CASCADE = "ridgeline.speculative.cascade"


def register_proposer(name: str):
    def deco(cls):
        cls.name = name
        PROPOSERS[name] = cls
        return cls
    return deco


@dataclass(frozen=True)
class ProposalRequest:
    req_id: str
    token_ids: Sequence[int]  # prompt + output so far (read-only)
    k: int  # propose at most this many tokens
    params: SamplingParams | None = None  # the request's: a sampling draft applies the same processing
    seed: int | None = None  # the request's seed (None: unseeded); a seeded draft draws reproducibly from it
    num_prompt_tokens: int = 0
    # structured outputs: the request's Constraint (engine/constraint.py), in step with token_ids; read only
    constraint: Any = None


class Proposer:
    name = "?"
    needs_target = False  # True: built with the target's DraftTarget (below)
    # True: the runner keeps every row's final hidden state, and observe(plan, sampled, hidden,
    # requests) is called after each step (an EAGLE head reads them)
    wants_hidden = False
    # seconds of the last propose() that were a one-time cost per request rather than a cost per
    # drafted position (e.g. an EAGLE head catching up on a new request's prompt): the goodput
    # controller leaves them out of the draft cost it prices positions with
    setup_time = 0.0
    setup_rows = 0  # the rows that setup_time caught up on

    def __init__(self, config: SpeculativeConfig, vocab_size: int):
        self.config = config
        self.vocab_size = vocab_size

    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int] | Draft]:
        """Up to r.k token ids for each request (fewer, or none, is fine), or a Draft with them."""
        raise NotImplementedError

    def backlog(self, req_id: str, num_tokens: int) -> int:
        """Rows this proposer would catch up on before drafting for the request (now num_tokens
        long): what the controller prices a restart with. 0: drafting costs the same every step."""
        return 0

    def forget(self, req_ids: Sequence[str]) -> None:
        """These requests finished or were aborted: drop any state kept for them."""

    def summary(self) -> str | None:
        """How it drafts, for the start-up line (e.g. which kernels a draft model runs on); None: nothing to add."""
        return None


def create_proposer(config: SpeculativeConfig, vocab_size: int, target: Any = None) -> Proposer | None:
    """target: what a proposer that runs a model needs of the target engine (DraftTarget);
    handed only to classes that set `needs_target`."""
    if config.method is None:
        return None
    names = config.methods
    members = [_create(name, config, vocab_size, target) for name in names]
    if len(members) == 1:
        return members[0]
    return importlib.import_module(_CASCADE).CascadeProposer(config, vocab_size, members)


def known_methods() -> list[str]:
    return sorted({*PROPOSERS, *_BUILTIN})


def _create(name: str, config: SpeculativeConfig, vocab_size: int, target: Any) -> Proposer:
    if name in _BUILTIN and name not in PROPOSERS:
        importlib.import_module(_BUILTIN[name])  # registers it
    cls = PROPOSERS.get(name)
    if cls is None:
        raise InvalidRequestError(f"unknown speculative method {name!r}; known: {', '.join(known_methods())}, "
                                  "or several joined by '+' (each request takes the first that proposes)",
                                  "speculative_method")
    if getattr(cls, "needs_target", False):
        return cls(config, vocab_size, target)
    return cls(config, vocab_size)


@dataclass(frozen=True)
class DraftTarget:
    """What the draft needs to know of the target engine."""
    folder: Path
    device: torch.device
    dtype: torch.dtype  # the target's weight dtype; the draft's dense layers take it too
    act_dtype: torch.dtype
    attention_backend: str
    max_len: int
    block_size: int
    num_blocks: int  # the draft's KV cache holds as many tokens as the target's
    kv_format: str
    eos_ids: tuple[int, ...]
    progress: bool = False
    # live parts of the target, for proposers that run (part of) the target itself (layer-skip, eagle):
    runner: Any = None  # the target's ModelRunner (its model, its KV cache, its step preparation)
    kv: Any = None  # the target's KVCacheManager
    reserve_blocks: int = 0  # blocks a proposer must leave free when it grows a request's table
