"""Every failure leaves the server as OpenAI's error body: {"error": {message, type, param, code}},
or, under a path prefix whose API has its own shape (Anthropic's, ollama's), as that API's body
(register_error_shape).
A 500 never carries its cause (exception text can hold paths, prompts, internals): clients get the
generic INTERNAL body, and the detail goes to the log only."""
from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ridgeline.errors import RidgelineError
from ridgeline.http.logtext import clean

log = logging.getLogger("ridgeline.serve")
INTERNAL = "internal error"
RETRY_AFTER_S = 1  # what a 429 / busy 503 asks the client to wait before retrying

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable"}


class ApiError(RidgelineError):
    """An HTTP-level refusal (auth, unknown model, limits) raised by the server itself."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message, param, code)
        self.status = status
        self.type = _TYPES.get(status, "server_error")
        self.headers = headers


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# (path prefix, shape(error) -> body): APIs whose clients read another error body than OpenAI's
_SHAPES: list[tuple[str, Callable[[RidgelineError], dict]]] = []


def register_error_shape(prefix: str, shape: Callable[[RidgelineError], dict]) -> None:
    """Errors under paths starting with prefix leave as shape(e) (a client-visible RidgelineError)."""
    _SHAPES[:] = [(p, f) for p, f in _SHAPES if p != prefix] + [(prefix, shape)]


def shaped_body(e: RidgelineError, path: str = "") -> dict:
    """The error body the client of `path` reads (OpenAI's unless an API registered its own)."""
    for prefix, shape in _SHAPES:
        if path.startswith(prefix):
            return shape(e)
    return error_body(e.message, e.type, e.param, e.code)


def status_of(e: BaseException) -> int:
    """The HTTP status `e` is answered with (see public)."""
    return e.status if isinstance(e, RidgelineError) and (e.status < 500 or e.status == 503) else 500


def public(e: BaseException) -> RidgelineError:
    """What a client may see of `e`: a RidgelineError below 500 (or a 503) as it is; anything else the
    generic 500, its detail logged here unless whoever raised it has logged it (`logged`)."""
    if status_of(e) != 500:
        return e
    if not getattr(e, "logged", False):
        log.error("internal error: %s", clean(f"{type(e).__name__}: {e}"), exc_info=e)
    return ApiError(500, INTERNAL)


def error_headers(e: RidgelineError) -> dict[str, str] | None:
    headers = dict(getattr(e, "headers", None) or {})
    if e.status == 429:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    return headers or None


def error_response(e: BaseException, path: str = "") -> JSONResponse:
    e = public(e)
    return JSONResponse(shaped_body(e, path), e.status, error_headers(e))


def install_error_handlers(app: FastAPI, on_error) -> None:
    """on_error(status) counts each refusal for /metrics."""

    @app.exception_handler(RidgelineError)
    async def ridgeline_error(request: Request, e: RidgelineError):
        on_error(e.status)
        return error_response(e, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):  # FastAPI would answer 422
        on_error(400)
        return error_response(from_validation(e.errors()), request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        on_error(e.status_code)
        if e.status_code == 404 and e.detail == "Not Found":  # no such route: say which exist
            return error_response(ApiError(404, f"no route {request.method} {request.url.path}; this server "
                                                f"answers {routes_of(request.app)}", code="unknown_route"),
                                  request.url.path)
        return error_response(ApiError(e.status_code, str(e.detail), headers=e.headers), request.url.path)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        on_error(500)
        return error_response(e, request.url.path)


def routes_of(app) -> str:
    """The app's routes for a 404's message: "GET /health, POST /v1/chat/completions, ..." (those in its
    OpenAPI schema, each path once with its methods)."""
    try:
        with warnings.catch_warnings():  # FastAPI warns of operation ids two routes share: not the client's business
            warnings.simplefilter("ignore")
            paths = app.openapi().get("paths", {})
    except Exception:  # a schema that cannot be built must not turn a 404 into a 500
        return "(its routes are listed at /docs)"
    return ", ".join(f"{'/'.join(sorted(m.upper() for m in ops if m != 'head'))} {p}"
                     for p, ops in sorted(paths.items()) if any(m != "head" for m in ops))


def from_validation(errors) -> ApiError:
    """A 400 naming the field, from pydantic's errors (FastAPI's, with "body" first in each location, or
    a model_validate's, without it)."""
    if not errors:
        return ApiError(400, "invalid request")
    # a union reports one error per member: the deepest one says most ('content.0.type: should be text')
    located = [([p for p in e.get("loc", ()) if _is_field(p)], e) for e in errors]
    loc, first = max(located, key=lambda le: len(le[0]))
    if loc[:1] == ["body"]:
        loc = loc[1:]
    kind = first.get("type")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON: {detail}".rstrip(": "))
    if not loc:
        return ApiError(400, "the request body must be a JSON object")
    path = ".".join(str(p) for p in loc)
    if kind == "missing":
        return ApiError(400, f"{path}: this field is required", param=str(loc[0]))
    value = first.get("input")
    shown = f" (got {value!r})" if isinstance(value, (int, float, str, bool)) or value is None else ""
    return ApiError(400, f"{path}: {first.get('msg', 'invalid value')}{shown}", param=str(loc[0]))


def _is_field(part) -> bool:
    """Pydantic puts union-member tags such as 'list[int]' or 'TextPart' in a location; drop them."""
    return isinstance(part, int) or (part.isidentifier() and not part[:1].isupper()
                                     and part not in ("str", "int", "float", "bool", "list"))
