"""A prefill worker's internal endpoint: where the front asks it to compute a prompt and ship the
KV, on an internal channel (wire.LABEL_PREFILL: the deployment's secret, tagged frames) bound to
--internal-host/--internal-port, apart from the public OpenAI routes (which have no such route).

One request per frame, answered in one frame (a connection may carry several, in turn):
    {"op": "prefill", "route": "/v1/completions" | "/v1/chat/completions", "body": {OpenAI body},
     "transfer_id": the id the decode worker issued, "target": its connector's address}
    -> {"status": "sent", "bytes", "seconds", "prompt_tokens"} | {"status": "skip", "reason"}
     | {"status": "failed", "error"} | {"status": "rejected", "http_status": 4xx, "error": OpenAI body}
The body is read exactly as its route reads it: `prefill`, the OpenAI server's (serve/prefill_route.py),
handed over by whatever installs the worker on the server; "rejected" is the client's error (the
front returns it as is), "failed" and "skip" send the request to the decode worker whole."""
from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from ridgeline.disagg.connector import IDLE_TIMEOUT, TransferError
from ridgeline.disagg.listener import DEFAULT_MAX_CONNECTIONS, AuthListener
from ridgeline.disagg.wire import (LABEL_PREFILL, MAX_HEADER, Refused, at_frame_boundary_closed, check_transfer_id,
                                   parse_address, recv_json, send_json)
from ridgeline.errors import RidgelineError
from ridgeline.http.errors import error_body, error_headers, from_validation, public, status_of

log = logging.getLogger(__name__)


class PrefillEndpoint:
    def __init__(self, state, worker, prefill, secret: bytes, host: str, port: int,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        """prefill(state, worker, route, body, transfer_id, target) -> the answer: computes the request
        up to its first token and ships its KV (raising what the route would answer)."""
        self.state, self.worker, self.prefill = state, worker, prefill
        self.cap = state.settings.max_body_bytes + MAX_HEADER
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener = AuthListener("prefill-internal", LABEL_PREFILL, secret, host, port, self._serve,
                                     max_connections)

    @property
    def address(self) -> str:
        host, port = self.listener.address
        return f"tcp://{host}:{port}"

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve requests on `loop` (the server's, where its engine's streams live)."""
        self.loop = loop
        self.listener.start()

    def close(self) -> None:
        self.listener.close()

    def _serve(self, session, peer) -> None:
        while True:
            session.sock.settimeout(IDLE_TIMEOUT)
            if at_frame_boundary_closed(session.sock):
                return
            request = recv_json(session, self.cap)
            if request.get("op") != "prefill":
                raise Refused(f"unknown op {str(request.get('op'))[:40]!r}")
            try:
                tid = check_transfer_id(request.get("transfer_id"))
                target = request.get("target")
                parse_address(target, self.worker.connector.name)
                if not isinstance(request.get("body"), dict):
                    raise Refused("body must be a JSON object")
            except Refused as e:
                self.listener.rejections(peer, e.message)
                send_json(session, {"status": "failed", "error": e.message})
                continue
            job = asyncio.run_coroutine_threadsafe(
                answer(self.prefill, self.state, self.worker, request.get("route"), request["body"], tid, target),
                self.loop)
            send_json(session, job.result())


async def answer(prefill, state, worker, route, body: dict, transfer_id: str, target: str) -> dict:
    """One prefill request's answer (never raises)."""
    if state.drain.draining:
        return {"status": "failed", "error": "the prefill worker is shutting down"}
    try:
        return await prefill(state, worker, route, body, transfer_id, target)
    except ValidationError as e:
        return _rejected(from_validation(e.errors()))  # the route's own 400, naming the field
    except (TransferError, asyncio.TimeoutError) as e:
        worker.counts["failed"] += 1
        return {"status": "failed", "error": str(e)}
    except Exception as e:  # noqa: BLE001 (each one becomes an answer: the front must not wait forever)
        if isinstance(e, RidgelineError) and status_of(e) < 500:
            return _rejected(e)
        worker.counts["failed"] += 1
        e = public(e)
        return {"status": "failed", "error": e.message}


def _rejected(e: RidgelineError) -> dict:
    return {"status": "rejected", "http_status": e.status, "headers": error_headers(e) or {},
            "error": error_body(e.message, e.type, e.param, e.code)}
