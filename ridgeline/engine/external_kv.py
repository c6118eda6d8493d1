"""The scheduler's side of a KV connector: prompt KV computed outside this engine (another engine's
prefill, in disaggregation) that a request may start from instead of computing its prompt. The
scheduler owns every queue and status; a connector only answers these questions and writes the
bytes. Torch-free interface (an implementation may use torch to write the pool).

Lifecycle of a request offered with external KV:
  offer(req, kv) at add -> True: the connector holds its KV; the scheduler keeps the request in its
  `arriving` queue (not `waiting`: it is not admitted as a prefill) until the pool has room under the
  same rules as any admission (the watermark, max_num_seqs, a per-step copy budget of
  max_num_batched_tokens prompt tokens). Then the scheduler allocates `tokens(req)` tokens' blocks
  and calls load(req, blocks, n): the connector writes the KV and returns the first token its
  source sampled (the engine appends it as if it had sampled it), or None when it could not (the
  request is computed as usual: only slower). discard(request id, recompute) releases what the
  connector holds for a request that will not be loaded (finished, aborted, or computed here)."""
from __future__ import annotations

from abc import ABC, abstractmethod


class ExternalKV(ABC):
    @abstractmethod
    def offer(self, req, kv) -> bool:
        """At add, before the request is queued: hold `kv` for req, or refuse (kv released; the
        request is computed here)."""

    @abstractmethod
    def tokens(self, req) -> int:
        """Prompt tokens whose KV is held for req (0: none, or no longer usable)."""

    @abstractmethod
    def load(self, req, blocks: list[int], n: int) -> int | None:
        """Write req's KV for its first n tokens into `blocks` (allocated for them); returns the first
        token to append, or None when the bytes could not be written (what was held is released)."""

    def cacheable(self, req) -> bool:
        """Whether KV loaded for req may enter the prefix cache (other requests would attend to it)."""
        return False

    @abstractmethod
    def discard(self, request_id: str, recompute: bool) -> None:
        """Release what is held for request_id; recompute: it will be computed here instead."""
