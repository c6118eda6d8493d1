"""What uvicorn's h11 protocol lacks for a server facing untrusted clients: a deadline for each
request's headers and a cap on open connections. (The body's deadline is the Guard's: see guard.py.)

- A connection gets --timeout-header seconds to deliver a request's headers, from the moment it is
  ready for one (connected, or its previous response sent). Past it the connection is closed, after
  a 408 if part of a request had arrived. Idle keep-alive connections close sooner, at uvicorn's
  keep-alive timeout.
- A connection opened while --max-connections are open gets its request answered with a 503 (and
  Retry-After) and is closed; the open ones are served as before.

Built on H11Protocol's hooks (connection_made, handle_events, on_response_complete, connection_lost);
uvicorn's own limit_concurrency is not used, as it also refuses requests on connections already open.
"""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

from ridgeline.http.errors import RETRY_AFTER_S, error_body

_408 = json.dumps(error_body("the request's headers did not arrive in time (--timeout-header)",
                             "invalid_request_error", code="request_timeout")).encode()
_408_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                 b"content-length: " + str(len(_408)).encode() + b"\r\n\r\n" + _408)


class GuardedH11Protocol(H11Protocol):
    timeout_header = 10.0  # set per server by guarded_protocol()
    max_connections = 1000

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._timed_cycle = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # counts this one
            self.app = _over_capacity(self.max_connections)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_timer is not None and self.cycle is not self._timed_cycle:
            self._disarm()  # a new request cycle: its headers are in

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # before uvicorn handles a pipelined request, which disarms it again
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._timed_cycle = self.cycle
        self._header_timer = self.loop.call_later(self.timeout_header, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:  # part of a request came: it can still be told why
            self.transport.write(_408_RESPONSE)
        self.transport.close()


def guarded_protocol(timeout_header: float, max_connections: int) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"timeout_header": timeout_header, "max_connections": max_connections})


def _over_capacity(limit: int):
    body = json.dumps(error_body(f"the server has too many open connections (--max-connections {limit}); "
                                 "retry later", "service_unavailable", code="too_many_connections")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"retry-after", str(RETRY_AFTER_S).encode())]

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
