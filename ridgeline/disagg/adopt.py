"""The decode engine's side of a transfer: a request that arrives with its prompt's KV (a payload)
starts decoding from it instead of computing its prompt. This is the scheduler's external KV
source (engine/external_kv.py): the scheduler queues and admits; this module checks payloads,
holds them and writes their bytes.

At add, the payload is checked once (pool layout, prompt tokens, one choice, nothing that needs the
prompt's logits); a payload that cannot be used is released and the request is computed as usual
(recompute: same output, only slower). A usable one is held here while its request waits in the
scheduler's `arriving` queue for room; when the scheduler has allocated its blocks, `load` writes
the payload's bytes into them and hands back the first token the prefill sampled. Its blocks (and
those it fills later) enter the prefix cache only when the payload came over an authenticated
connector (`KVPayload.authenticated`): KV from anywhere else serves its own request, never
another's. A payload whose bytes cannot be written (they do not fit its blocks) is dropped there
and then, and its request computed as usual: no other request is touched. A seeded request's
generator continues from the prefill's state, so sampled output matches a co-located engine's too.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ridgeline.disagg.blocks import scatter
from ridgeline.disagg.payload import KVPayload, spec_key, unusable
from ridgeline.engine.external_kv import ExternalKV
from ridgeline.engine.request import Request

log = logging.getLogger(__name__)


@dataclass
class TransferStats:
    adopted: int = 0  # requests that started from a transferred prompt KV
    recomputed: int = 0  # requests whose payload could not be used: computed here
    tokens: int = 0  # prompt tokens adopted


def attach(engine) -> "Adoptions":
    """The decode side of disaggregation on `engine`: its scheduler's external KV source (one per
    engine: a second call returns the first)."""
    src = engine.scheduler.external
    if src is None:
        src = Adoptions(engine)
        engine.scheduler.attach_external(src)
    if not isinstance(src, Adoptions):
        raise TypeError("this engine's scheduler has another external KV source")
    return src


class Adoptions(ExternalKV):
    """Payloads held for requests the scheduler has queued as arriving (engine/external_kv.py)."""

    def __init__(self, engine):
        self.engine = engine  # read: its architecture, limits, KV layout, pool and sampler
        self.pending: dict[str, KVPayload] = {}  # request id -> its payload, until loaded or discarded
        self._authenticated: dict[str, bool] = {}  # loaded this step: may its blocks be cached
        self.stats = TransferStats()

    def offer(self, req: Request, payload: KVPayload) -> bool:
        why = self._why_not(req, payload)
        if why is not None:
            payload.release()
            self.stats.recomputed += 1
            log.info("%s: computing the prompt here: the transferred KV is not usable (%s)", req.request_id, why)
            return False
        self.pending[req.request_id] = payload
        return True

    def _why_not(self, req: Request, payload: KVPayload) -> str | None:
        p = req.params
        if p.n != 1:
            return "n > 1"
        if p.prompt_logprobs is not None or p.logprobs is not None:
            return "logprobs need the prompt's logits"
        if req.max_tokens < 1:
            return "max_tokens 0"
        if not 0 <= payload.header.first_token < self.engine.arch.vocab_size:
            return "its first token is outside the vocabulary"
        if len(req.prompt_token_ids) > self.engine.max_model_len:
            return "its prompt is over max_model_len"
        spec = self.engine.kv_spec
        return unusable(payload, spec_key(spec), req.prompt_token_ids, spec.block_size, spec.bytes_per_block)

    def tokens(self, req: Request) -> int:
        payload = self.pending.get(req.request_id)
        return 0 if payload is None or payload.released else payload.num_tokens

    def load(self, req: Request, blocks: list[int], n: int) -> int | None:
        payload = self.pending.pop(req.request_id)
        if not self._write(req, blocks, payload, n):
            self.stats.recomputed += 1
            return None
        self._authenticated[req.request_id] = payload.authenticated
        self.stats.adopted += 1
        self.stats.tokens += n
        return payload.header.first_token

    def cacheable(self, req: Request) -> bool:
        return self._authenticated.pop(req.request_id, False)

    def discard(self, request_id: str, recompute: bool) -> None:
        payload = self.pending.pop(request_id, None)
        if payload is not None:
            payload.release()
            self.stats.recomputed += recompute

    def close(self) -> None:
        for rid in list(self.pending):
            self.discard(rid, False)

    def _write(self, req: Request, blocks: list[int], payload: KVPayload, n: int) -> bool:
        """The payload's bytes into req's blocks (and its generator state); False, with a warning, when
        they do not fit. The payload is released either way."""
        try:
            scatter(self.engine.runner.kv, blocks, payload.data, n)
            self._restore_generator(req, payload)
            return True
        except (ValueError, RuntimeError) as e:
            log.warning("%s: computing the prompt here: its transferred KV could not be written (%s)",
                        req.request_id, e)
            return False
        finally:
            payload.release()

    def _restore_generator(self, req: Request, payload: KVPayload) -> None:
        state = payload.header.rng_state
        if state is None or req.seed is None or req.params.greedy:
            return
        g = torch.Generator(self.engine.runner.device)
        g.set_state(torch.tensor(state, dtype=torch.uint8))
        self.engine.runner.sample.set_generator(req.request_id, g)
