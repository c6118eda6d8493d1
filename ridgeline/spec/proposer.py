"""Proposers: guess the next k tokens of decoding requests; the target verifies them all in one
step (ridgeline/runner/step_sampler.py), so a right guess saves a step and a wrong one costs only
the extra rows. A registry, keyed by name (SpeculativeConfig.method), of classes with one method."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ridgeline.config import SpeculativeConfig
from ridgeline.errors import InvalidRequestError

PROPOSERS: dict[str, type[Proposer]] = {}


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


class Proposer:
    name = "?"

    def __init__(self, config: SpeculativeConfig, vocab_size: int):
        self.config = config
        self.vocab_size = vocab_size

    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        """Up to r.k token ids for each request (fewer, or none, is fine)."""
        raise NotImplementedError

    def forget(self, req_ids: Sequence[str]) -> None:
        """These requests finished or were aborted: drop any state kept for them."""


def create_proposer(config: SpeculativeConfig, vocab_size: int) -> Proposer | None:
    if config.method is None:
        return None
    import ridgeline.spec.ngram  # noqa: F401  (registers the built-in proposers)
    cls = PROPOSERS.get(config.method)
    if cls is None:
        raise InvalidRequestError(f"unknown speculative method {config.method!r}; known: "
                                  f"{', '.join(sorted(PROPOSERS)) or 'none'}", "speculative_method")
    return cls(config, vocab_size)
