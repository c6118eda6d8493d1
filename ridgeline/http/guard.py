"""ASGI middleware in front of every route of every HTTP front (the OpenAI server, the router, the
disaggregated front): bearer-token auth, the drain's 503, the request-body size cap and the body's
read deadline, all before the app does any work. Pure ASGI (not BaseHTTPMiddleware) so streaming
responses and disconnect detection pass untouched.

Auth: with an API key (or a key file: api_keys.py) every route needs one (looked up in
constant time) except /health (probes), the `open_paths` and `open_prefix` a front names (the
server's console page and its static files: they hold no data; the page asks for the key), and its
`metrics_paths` with --public-metrics. The key's tenant goes into the request's scope (TENANT);
behind a launcher's front, a request carrying the internal key names its tenant in TENANT_HEADER.
Browsers: origins.py decides which pages may send requests. The body
deadline: --timeout-body seconds from the headers to the body's last byte (a stalled or short body
gets 408, and its connection closes); after the body, receive() is disconnect detection and has no
deadline."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ridgeline.http.api_keys import TENANT as TENANT_NAME
from ridgeline.http.api_keys import load_api_keys
from ridgeline.http.errors import RETRY_AFTER_S, ApiError, error_headers, shaped_body
from ridgeline.http.front_limits import FrontLimits
from ridgeline.http.origins import OriginPolicy

# Closing a connection whose client is still uploading resets it (the unread bytes make the kernel send
# RST) and the client may never read the answer. So a refusal of a body that is coming (413, a bad
# Content-Length) keeps the connection: uvicorn reads and drops the rest, under the next request's
# header deadline. Only a stalled body (408) or a shutdown closes it.
CLOSE = {"Connection": "close"}
TENANT = "ridgeline.tenant"  # scope key: the authenticated request's tenant (None: none)
TENANT_HEADER = "x-ridgeline-tenant"  # a front's word on its client's tenant, to the process behind it
_JSON = (b"content-type", b"application/json")


def tenant_of(scope) -> str | None:
    return scope.get(TENANT)


class Guard:
    def __init__(self, app: ASGIApp, limits: FrontLimits, on_error, drain=None,
                 open_paths: Iterable[str] = (), metrics_paths: Iterable[str] = ("/metrics",),
                 open_prefix: str | None = None):
        self.app = app
        self.keys = load_api_keys(limits.api_key, limits.api_key_file)
        self.tenant_header = limits.tenant_header
        self.origins = OriginPolicy(limits.allowed_origins, keyed=bool(self.keys))
        self.open_paths = {"/health", *open_paths} | (set(metrics_paths) if limits.public_metrics else set())
        self.metrics_paths = set(metrics_paths)  # answered while draining
        self.open_prefix = open_prefix
        self.max_body_bytes = limits.max_body_bytes
        self.timeout_body = limits.timeout_body
        self.drain = drain  # its `draining` says the front is shutting down (serve/drain.py); None: no drain
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
        err = self.origins.refusal(headers)
        if err is not None:
            return err
        if "origin" not in headers and "content-type" in headers:  # not a browser: the body is JSON whatever it says
            scope["headers"] = [h for h in scope["headers"] if h[0].lower() != b"content-type"] + [_JSON]
        scope[TENANT] = None
        if self.keys and not self._open(path):
            ok, tenant = self._authorized(headers)
            if not ok:
                return ApiError(401, "missing or incorrect API key: send it as `Authorization: Bearer <key>` "
                                     "(or `x-api-key: <key>`)",
                                code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            if tenant is None and self.tenant_header:
                tenant = headers.get(TENANT_HEADER)
                if tenant is not None and not TENANT_NAME.fullmatch(tenant):
                    return ApiError(400, f"{TENANT_HEADER}: not a tenant name")
            scope[TENANT] = tenant
        draining = self.drain is not None and self.drain.draining
        if draining and path != "/health" and path not in self.metrics_paths:
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

    def _authorized(self, headers: dict[str, str]) -> tuple[bool, str | None]:
        """(a key of ours came, its tenant): `Authorization: Bearer <key>`, or `x-api-key: <key>` as
        Anthropic's clients send it."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            token = headers.get("x-api-key")
            if token is None:
                return False, None
        return self.keys.check(token.strip())

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
        response = JSONResponse(shaped_body(err, scope["path"]), err.status, error_headers(err))
        await response(scope, receive, send)


def install_guard(app, limits: FrontLimits, on_error, **kw) -> None:
    """The Guard in front of every route of `app`; with --allowed-origins, CORS outside it (a browser's
    preflight carries no key: CORSMiddleware answers it for the allowed origins and refuses the rest)."""
    app.add_middleware(Guard, limits=limits, on_error=on_error, **kw)
    if limits.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(limits.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=False)


async def read_body(request: Request) -> bytes:
    """A proxy's read of the body, under the Guard's cap and deadline. A client that went away before
    its last byte gets a 400 nobody reads, not an internal error in the log."""
    try:
        return await request.body()
    except ClientDisconnect:
        raise ApiError(400, "the client closed the connection before its request body arrived") from None
