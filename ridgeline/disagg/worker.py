"""Worker roles on an OpenAI server (`ridgeline serve --role prefill|decode`).

- prefill: `POST /disagg/prefill` {"route", "body", "transfer_id", "target"} reads the OpenAI body
  of `route` exactly as that route would (same validation, chat template, tokenizer), computes the
  prompt with max_tokens 1 and ships its KV and first token to the connector at `target`; answers
  {"status": "sent" | "failed" | "skip", ...}. "skip": the request is not disaggregated (several
  prompts or choices, logprobs): the decode worker computes it whole. A bad body gets the route's
  own OpenAI error.
- decode: the ordinary OpenAI routes; a request carrying `x-ridgeline-transfer-id` (and
  `x-ridgeline-transfer: sent`) takes that transfer's payload from the connector's inbox (waiting at
  most the transfer timeout) and starts decoding after it; without it (failed, timed out, unusable)
  it computes the prompt itself.
Both answer `GET /disagg/info` (role, model, configuration fingerprint, KV layout, connector address)
so a front can check a set of workers before serving through them."""
from __future__ import annotations

import asyncio
import contextvars
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ridgeline.disagg.connector import KVConnector, TransferError
from ridgeline.disagg.export import Exports
from ridgeline.disagg.payload import spec_key
from ridgeline.engine.messages import EngineRequest
from ridgeline.errors import InvalidRequestError
from ridgeline.serve.errors import from_validation
from ridgeline.serve.state import state_of

ROLES = ("colocated", "prefill", "decode")
TRANSFER_ID, TRANSFER_STATUS = "x-ridgeline-transfer-id", "x-ridgeline-transfer"
_transfer: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("kv_transfer", default=None)


class DisaggWorker:
    def __init__(self, role: str, engine, connector: KVConnector, timeout: float):
        if role not in ("prefill", "decode"):
            raise InvalidRequestError(f"role must be prefill or decode, got {role!r}", "role")
        self.role, self.engine, self.connector, self.timeout = role, engine, connector, timeout
        self.exports = Exports(engine, connector) if role == "prefill" else None
        if role == "decode":
            connector.listen()
        self.counts = {"sent": 0, "failed": 0, "skip": 0, "adopted_wait_timeouts": 0}

    def info(self, state) -> dict:
        return {"role": self.role, "model": state.settings.served_model_name,
                "fingerprint": state.system_fingerprint, "kv_spec": spec_key(self.engine.kv_spec),
                "connector": self.connector.name, "address": self.connector.address,
                "max_model_len": self.engine.max_model_len, "transfers": dict(self.counts),
                "adopted": self.engine.adoptions.stats.adopted, "recomputed": self.engine.adoptions.stats.recomputed,
                "steps": self.engine.step_clock.summary()}

    async def attach(self, requests: list[EngineRequest]) -> list[EngineRequest]:
        """Decode role, on an OpenAI route: the transferred payload for this HTTP request, if any."""
        marked = _transfer.get()
        if self.role != "decode" or marked is None:
            return requests
        tid, status = marked
        if status != "sent" or len(requests) != 1:
            self.connector.inbox.abandon(tid)  # one that arrives anyway is released at once
            return requests
        payload = await self.connector.inbox.take_async(tid, self.timeout)
        if payload is None:
            self.counts["adopted_wait_timeouts"] += 1
            return requests
        return [replace(requests[0], kv=payload)]

    def close(self) -> None:
        if self.exports is not None:
            self.exports.close()
        self.connector.close()


class _TransferHeaders:
    """ASGI middleware: the transfer named by a request's headers, for `attach` on the same task."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        tid = headers.get(TRANSFER_ID.encode())
        token = _transfer.set((tid.decode("latin-1"), headers.get(TRANSFER_STATUS.encode(), b"").decode("latin-1"))
                              if tid else None)
        try:
            return await self.app(scope, receive, send)
        finally:
            _transfer.reset(token)


def install(app: FastAPI, worker: DisaggWorker) -> None:
    state = app.state.ridgeline
    state.disagg = worker
    app.add_api_route("/disagg/info", _info, methods=["GET"])
    if worker.role == "prefill":
        app.add_api_route("/disagg/prefill", _prefill, methods=["POST"])
    app.add_middleware(_TransferHeaders)


async def _info(request: Request):
    state = state_of(request)
    return JSONResponse(state.disagg.info(state))


async def _prefill(request: Request):
    from ridgeline.disagg.prefill_route import run_prefill
    state = state_of(request)
    try:
        raw = await request.json()
        route, body, tid, target = raw["route"], raw["body"], str(raw["transfer_id"]), str(raw["target"])
    except (ValueError, KeyError, TypeError):
        raise InvalidRequestError("a prefill body is {route, body, transfer_id, target}") from None
    try:
        return JSONResponse(await run_prefill(state, state.disagg, route, body, tid, target))
    except ValidationError as e:  # the same 400 as the route's own, naming the field
        raise from_validation(e.errors()) from None
    except (TransferError, asyncio.TimeoutError) as e:
        state.disagg.counts["failed"] += 1
        return JSONResponse({"status": "failed", "error": str(e)})

