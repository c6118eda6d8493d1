"""Worker roles on an OpenAI server (`ridgeline serve --role prefill|decode`).

- prefill: the public routes as any server, plus an internal endpoint (prefill_server.py, on
  --internal-host/--internal-port, the deployment's secret) where the front asks it to compute a
  prompt (max_tokens 1) and ship its KV and first token to a decode worker's connector.
- decode: the ordinary OpenAI routes, and a KV connector (connector.py, on --internal-host/--kv-port,
  the deployment's secret) that issues transfer ids to the front and receives their KV; a request
  carrying `x-ridgeline-transfer-id` (and `x-ridgeline-transfer: sent`) takes that transfer's payload
  from the inbox (waiting at most the transfer timeout) and starts decoding after it; without it
  (failed, timed out, unusable, an id this worker did not issue) it computes the prompt itself.
  Whatever its request did with it, a transfer ends with its request.
Both answer `GET /disagg/info` (`DisaggWorker.info`: role, model, configuration fingerprint, KV
layout, connector and internal addresses) so a front can check a set of workers before serving
through them. The OpenAI server installs a worker on its app (serve/disagg_worker.py): that route,
TransferHeaders, and a prefill worker's internal endpoint running the server's own prefill.

A worker with a role needs the deployment's secret (`deployment_secret`): from the environment of
a launcher that started it (`ridgeline serve --disaggregate`), else from --internal-secret-file."""
from __future__ import annotations

import contextvars
from dataclasses import replace

from ridgeline.disagg.adopt import attach as attach_adoptions
from ridgeline.disagg.connector import KVConnector
from ridgeline.disagg.export import Exports
from ridgeline.disagg.listener import DEFAULT_MAX_CONNECTIONS
from ridgeline.disagg.payload import Layout, spec_key
from ridgeline.disagg.wire import Refused, check_transfer_id
from ridgeline.engine.messages import EngineRequest
from ridgeline.errors import InvalidRequestError
from ridgeline.utils import internal_auth

ROLES = ("colocated", "prefill", "decode")
TRANSFER_ID, TRANSFER_STATUS = "x-ridgeline-transfer-id", "x-ridgeline-transfer"
_transfer: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("kv_transfer", default=None)


def deployment_secret(secret_file: str | None, role: str) -> bytes:
    """The secret this worker shares with the rest of its deployment; a clear error without one."""
    try:
        return internal_auth.deployment_secret(secret_file, required=True)
    except InvalidRequestError as e:
        if e.param != "internal_secret_file" or "needs the same internal secret" not in e.message:
            raise  # the file itself is wrong: say so
        raise InvalidRequestError(
            f"a {role} worker needs its deployment's internal secret: give --internal-secret-file FILE (the same "
            "file on every worker and front: `head -c 32 /dev/urandom | xxd -p > FILE; chmod 600 FILE`), or let "
            "`ridgeline serve --disaggregate xPyD` start the workers", "internal_secret_file") from None


class DisaggWorker:
    def __init__(self, role: str, engine, connector: KVConnector, timeout: float, internal_host: str = "127.0.0.1",
                 internal_port: int = 0, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        if role not in ("prefill", "decode"):
            raise InvalidRequestError(f"role must be prefill or decode, got {role!r}", "role")
        if engine.kv.groups is not None:
            raise InvalidRequestError("a disaggregation worker moves a request's KV as one block table; this engine "
                                      "keeps a table per local/global layer group: build it with "
                                      "hybrid_kv_cache=False (--disable-hybrid-kv-cache-manager)", "role")
        self.role, self.engine, self.connector, self.timeout = role, engine, connector, timeout
        self.internal_host, self.internal_port, self.max_connections = internal_host, internal_port, max_connections
        self.exports = Exports(engine, connector) if role == "prefill" else None
        self.endpoint = None  # prefill: the internal endpoint (serve/disagg_worker.py's install makes it)
        # decode: the scheduler's external KV source, where transferred prompts wait for room
        self.adoptions = attach_adoptions(engine) if role == "decode" else None
        if role == "decode":
            connector.listen(Layout.of(engine.kv_spec, engine.max_model_len))
        self.counts = {"sent": 0, "failed": 0, "skip": 0, "adopted_wait_timeouts": 0}

    def info(self, state) -> dict:
        return {"role": self.role, "model": state.settings.served_model_name,
                "fingerprint": state.system_fingerprint, "kv_spec": spec_key(self.engine.kv_spec),
                "connector": self.connector.name, "address": self.connector.address,
                "internal": None if self.endpoint is None else self.endpoint.address,
                "max_model_len": self.engine.max_model_len, "transfers": dict(self.counts),
                "adopted": self.adoptions.stats.adopted if self.adoptions else 0,
                "recomputed": self.adoptions.stats.recomputed if self.adoptions else 0,
                "steps": self.engine.step_clock.summary()}

    async def attach(self, requests: list[EngineRequest]) -> list[EngineRequest]:
        """Decode role, on an OpenAI route: the transferred payload for this HTTP request, if any."""
        marked = _transfer.get()
        if self.role != "decode" or marked is None:
            return requests
        tid, status = marked
        if status != "sent" or len(requests) != 1:
            self.connector.inbox.abandon(tid)  # one that arrives anyway is refused
            return requests
        payload = await self.connector.inbox.take_async(tid, self.timeout)
        if payload is None:
            self.counts["adopted_wait_timeouts"] += 1
            return requests
        return [replace(requests[0], kv=payload)]

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
        if self.exports is not None:
            self.exports.close()
        self.connector.close()
        if self.adoptions is not None:
            self.adoptions.close()


class TransferHeaders:
    """ASGI middleware: the transfer named by a request's headers, for `attach` on the same task; the
    transfer ends with the request (a payload it did not take is released)."""

    def __init__(self, app, worker: DisaggWorker):
        self.app, self.worker = app, worker

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        tid = _transfer_id(headers.get(TRANSFER_ID.encode()))
        token = _transfer.set((tid, headers.get(TRANSFER_STATUS.encode(), b"").decode("latin-1")) if tid else None)
        try:
            return await self.app(scope, receive, send)
        finally:
            _transfer.reset(token)
            if tid and self.worker.role == "decode":
                self.worker.connector.inbox.abandon(tid)


def _transfer_id(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return check_transfer_id(raw.decode("latin-1"))
    except Refused:
        return None  # not an id this worker issued: the request is computed here
