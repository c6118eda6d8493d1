"""The prefill engine's side of a transfer: when a request marked for export samples its first token,
its prompt's KV is copied out of the pool on the step thread (before the request finishes and its
blocks are released; exactly its prompt's positions, the rest of its last block zeroed) and delivered to the decode worker's connector from a sender thread.

`expect(request id, transfer id, address)` marks a request and returns a concurrent Future that
settles with the Delivered record, or the TransferError, once delivery is done; a marked request
that ends without a first token (aborted, failed) settles its future with a TransferError too."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ridgeline.disagg.blocks import gather
from ridgeline.disagg.connector import KVConnector, TransferError
from ridgeline.disagg.payload import Header, spec_key
from ridgeline.engine.request import Request

log = logging.getLogger(__name__)


@dataclass
class _Target:
    transfer_id: str
    address: str
    future: Future


class Exports:
    def __init__(self, engine, connector: KVConnector, senders: int = 2):
        self.engine = engine
        self.connector = connector
        self.key = spec_key(engine.kv_spec)
        self.targets: dict[str, _Target] = {}  # request id -> where its KV goes (step thread reads, others add)
        self.pool = ThreadPoolExecutor(senders, "kv-send")
        engine.kv_export = self.on_first_token

    def expect(self, request_id: str, transfer_id: str, address: str) -> Future:
        fut: Future = Future()
        self.targets[request_id] = _Target(transfer_id, address, fut)
        return fut

    def cancel(self, request_id: str, why: str = "the prefill ended without a first token") -> None:
        target = self.targets.pop(request_id, None)
        if target is not None and not target.future.done():
            target.future.set_exception(TransferError(why))

    def on_first_token(self, req: Request, token: int) -> None:
        """On the step thread, with req's prompt KV complete in its blocks."""
        target = self.targets.pop(req.request_id, None)
        if target is None:
            return
        try:
            out = self._prepare(req, token, target.transfer_id)
        except Exception as e:  # e.g. no shared memory left: the decode side recomputes
            target.future.set_exception(TransferError(f"KV export failed: {e}"))
            return
        self.pool.submit(self._deliver, out, target)

    def _prepare(self, req: Request, token: int, transfer_id: str):
        kv, eng = self.engine.kv, self.engine
        n = req.num_prompt_tokens
        blocks = kv.tables[req.request_id][:kv.blocks_for(n)]
        assert 0 not in blocks, "a request with window holes cannot be exported"
        gen = eng.runner.sample.generators.get(req.request_id)
        rng = None if gen is None else gen.get_state().tolist()
        nbytes = len(blocks) * eng.kv_spec.bytes_per_block
        header = Header(transfer_id, self.key, list(req.prompt_token_ids), int(token), len(blocks), nbytes, rng)
        return self.connector.prepare(header, lambda out: gather(eng.runner.kv, blocks, n, out))

    def _deliver(self, out, target: _Target) -> None:
        try:
            target.future.set_result(self.connector.deliver(out, target.address))
        except TransferError as e:
            log.warning("%s: %s; the decode worker recomputes the prompt", out.header.transfer_id, e.message)
            target.future.set_exception(e)
        except Exception as e:  # never leave the route waiting
            target.future.set_exception(TransferError(f"KV transfer failed: {e}"))

    def close(self) -> None:
        for rid in list(self.targets):
            self.cancel(rid, "the prefill worker is shutting down")
        self.pool.shutdown(wait=False, cancel_futures=True)
