"""ASGI middleware in front of every route: bearer-token auth, the drain's 503, the request-body size
cap and the body's read deadline. Pure ASGI (not BaseHTTPMiddleware) so streaming responses and
disconnect detection pass untouched.

Auth: with an API key every route needs it except /health (probes), the console's page and its static
files (they hold no data; the page asks for the key), and /metrics and the console's live view with
--public-metrics. The body deadline: --timeout-body seconds from the headers to the body's last byte
(a stalled or short body gets 408, and its connection closes); after the body, receive() is
disconnect detection and has no deadline."""
from __future__ import annotations

import asyncio
import hmac
import time

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ridgeline.serve.console.paths import LIVE_PATH, STATIC_PREFIX
from ridgeline.serve.drain import Drain
from ridgeline.serve.errors import RETRY_AFTER_S, ApiError, error_body, error_headers

# Closing a connection whose client is still uploading resets it (the unread bytes make the kernel send
# RST) and the client may never read the answer. So a refusal of a body that is coming (413, a bad
# Content-Length) keeps the connection: uvicorn reads and drops the rest, under the next request's
# header deadline. Only a stalled body (408) or a shutdown closes it.
CLOSE = {"Connection": "close"}


class Guard:
    def __init__(self, app: ASGIApp, settings, drain: Drain, on_error):
        self.app = app
        self.api_key = settings.api_key
        self.open_paths = {"/health"} | ({"/metrics", LIVE_PATH} if settings.public_metrics else set())
        self.open_prefix = STATIC_PREFIX if settings.console else None
        if settings.console:
            self.open_paths.add("/")
        self.max_body_bytes = settings.max_body_bytes
        self.timeout_body = settings.timeout_body
        self.drain = drain
        self.on_error = on_error  # on_error(status): counts the refusal for /metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        err = self._refusal(scope)
        if err is not None:
            return await self._refuse(scope, receive, send, err)
        await self.app(scope, self._limited(receive), send)

    def _refusal(self, scope: Scope) -> ApiError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        if self.api_key and not self._open(path) and not self._authorized(headers):
            return ApiError(401, "missing or incorrect API key: send it as `Authorization: Bearer <key>`",
                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if self.drain.draining and path not in ("/health", "/metrics", LIVE_PATH):
            return ApiError(503, "the server is shutting down; retry on another replica or later",
                            headers={**CLOSE, "Retry-After": str(RETRY_AFTER_S)})
        length = headers.get("content-length")
        if length is not None and not length.isdigit():
            return ApiError(400, f"invalid Content-Length {length!r}")
        if length is not None and int(length) > self.max_body_bytes:
            return ApiError(413, f"the request body is {length} bytes, over the limit of {self.max_body_bytes} "
                                 "(--max-body-bytes)", code="request_too_large")
        return None

    def _open(self, path: str) -> bool:
        return path in self.open_paths or (self.open_prefix is not None and path.startswith(self.open_prefix)
                                           and ".." not in path)

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def _limited(self, receive: Receive) -> Receive:
        """The body under its size cap (for bodies without a Content-Length: chunked) and deadline."""
        seen, done = 0, False
        deadline = time.monotonic() + self.timeout_body

        async def limited() -> dict:
            nonlocal seen, done
            if done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:  # FastAPI re-raises HTTPException from body parsing
                raise HTTPException(408, f"the request body did not arrive within {self.timeout_body:g}s "
                                         "(--timeout-body)", headers=CLOSE) from None
            if message["type"] != "http.request":
                done = True
                return message
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise HTTPException(413, f"the request body is over the limit of {self.max_body_bytes} "
                                         "bytes (--max-body-bytes)")
            done = not message.get("more_body", False)
            return message

        return limited

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, err: ApiError) -> None:
        self.on_error(err.status)
        response = JSONResponse(error_body(err.message, err.type, err.param, err.code), err.status,
                                error_headers(err))
        await response(scope, receive, send)
