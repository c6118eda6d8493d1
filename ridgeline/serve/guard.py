"""ASGI middleware in front of every route: bearer-token auth for /v1 and the request-body size cap.
Pure ASGI (not BaseHTTPMiddleware) so streaming responses and disconnect detection pass untouched."""
from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ridgeline.serve.errors import ApiError, error_body


class Guard:
    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int, on_error):
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.on_error = on_error  # on_error(status): counts the refusal for /metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and scope["path"].startswith("/v1/") and not self._authorized(headers):
            return await self._refuse(scope, receive, send, ApiError(
                401, "missing or incorrect API key: send it as `Authorization: Bearer <key>`",
                code="invalid_api_key"))
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            err = (ApiError(413, f"the request body is {length} bytes, over the limit of {self.max_body_bytes} "
                                 "(--max-body-bytes)", code="request_too_large") if length.isdigit()
                   else ApiError(400, f"invalid Content-Length {length!r}"))
            return await self._refuse(scope, receive, send, err)
        await self.app(scope, self._capped(receive), send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def _capped(self, receive: Receive) -> Receive:
        """For bodies without a Content-Length (chunked): refuse once the bytes read pass the cap."""
        seen = 0

        async def capped() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:  # FastAPI re-raises HTTPException from body parsing
                    raise HTTPException(413, f"the request body is over the limit of {self.max_body_bytes} "
                                             "bytes (--max-body-bytes)")
            return message

        return capped

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, err: ApiError) -> None:
        self.on_error(err.status)
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        response = JSONResponse(error_body(err.message, err.type, err.param, err.code), err.status, headers)
        await response(scope, receive, send)
