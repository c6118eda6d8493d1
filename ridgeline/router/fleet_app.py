"""build_fleet_app(fleet, limits): the OpenAI (and Anthropic, ollama) front of several models. A request's
`model` picks the model (loaded on first use); its answer passes through unchanged (router/proxy.py).
/v1/models lists every served model and whether it is loaded; /health is the front's. The Guard runs
first: a request is authenticated, and its body capped, before it is parsed."""
from __future__ import annotations

import hashlib
import json
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from ridgeline.http.errors import ApiError, error_response, install_error_handlers
from ridgeline.http.guard import TENANT_HEADER, install_guard, read_body, tenant_of
from ridgeline.router.fleet import Fleet, FleetError, parse_keep_alive
from ridgeline.router.policy import Route
from ridgeline.router.proxy import forward, forwarded_headers
from ridgeline.version import __version__

# every route whose JSON body names its model
ROUTED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/messages",
          "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/api/chat", "/api/generate", "/api/embed",
          "/api/embeddings", "/api/show", "/api/pull")


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def build_fleet_app(fleet: Fleet, limits, ollama_version: str = "0.0.0") -> FastAPI:
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await fleet.start()
        try:
            yield
        finally:
            await fleet.stop()

    app = FastAPI(title="ridgeline models", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.fleet = fleet
    install_error_handlers(app, lambda status: None)

    def refuse(e: FleetError, path: str) -> JSONResponse:  # in the API's own error shape (OpenAI's, ollama's, ...)
        param = "model" if e.code in ("model_not_found", "missing_model") else "keep_alive" if e.code == "keep_alive" \
            else None
        return error_response(ApiError(e.status, e.message, param, e.code), path)

    async def routed(request: Request):
        body = await read_body(request)
        try:
            parsed = json.loads(body)
            name = parsed.get("model")
        except (ValueError, RecursionError, AttributeError):
            parsed = name = None
        if name is None:
            return refuse(FleetError(400, "a JSON body with `model` (one of: " + ", ".join(fleet.models) + ")",
                                     "missing_model"), request.url.path)
        try:
            keep = parse_keep_alive(parsed["keep_alive"]) if "keep_alive" in parsed and \
                request.url.path.startswith("/api/") else None  # ollama's: how long this model stays loaded
            m = await fleet.acquire(name)
        except FleetError as e:
            return refuse(e, request.url.path)
        if keep is not None:
            m.keep_alive = keep
        headers = forwarded_headers(request.headers)
        tenant = tenant_of(request.scope)
        if tenant is not None:
            headers[TENANT_HEADER] = tenant
        try:
            resp = await forward(m.router, "POST", request.url.path, body, headers, Route())
        except BaseException:
            fleet.release(m)
            raise
        resp.background = BackgroundTask(fleet.release, m)  # after the last byte (a stream's too)
        return resp

    def card(m) -> dict:
        return {"id": m.name, "object": "model", "created": created, "owned_by": "ridgeline", "loaded": m.loaded,
                "active_requests": m.active}

    async def models(_: Request):
        return {"object": "list", "data": [card(m) for m in fleet.models.values()]}

    async def model(model_id: str):
        try:
            return card(fleet.get(model_id))
        except FleetError as e:
            return refuse(e, "/v1/models")

    async def tags(_: Request):  # ollama's list: every served model, loaded or not
        return {"models": [{"name": m.name, "model": m.name, "modified_at": _iso(created), "size": m.nbytes,
                            "digest": hashlib.sha256(m.name.encode()).hexdigest(), "details": {}}
                           for m in fleet.models.values()]}

    async def ps(request: Request):  # ollama's loaded models: each replica's own entry, expiring by keep-alive
        out = []
        for m in [m for m in fleet.models.values() if m.loaded]:
            resp = await forward(m.router, "GET", "/api/ps", b"", forwarded_headers(request.headers), Route())
            try:
                entries = json.loads(resp.body)["models"]
            except (ValueError, KeyError, AttributeError):
                continue
            keep = fleet.keep_of(m)
            for e in entries:
                e["name"] = e["model"] = m.name
                if keep >= 0:
                    e["expires_at"] = _iso(time.time() + max(0.0, keep - (time.monotonic() - m.last_used)))
            out += entries
        return {"models": out}

    async def version(_: Request):
        return {"version": ollama_version}

    async def health(_: Request):
        return {"status": "ok", "models": {m.name: "loaded" if m.loaded else "not loaded"
                                           for m in fleet.models.values()}}

    for path in ROUTED:
        app.add_api_route(path, routed, methods=["POST"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", model, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET", "HEAD"])
    for path, route in (("/api/tags", tags), ("/api/ps", ps), ("/api/version", version)):
        app.add_api_route(path, route, methods=["GET"])
    install_guard(app, limits, lambda status: None)
    return app
