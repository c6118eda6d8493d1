"""build_router_app(router): the router's OpenAI front (FastAPI). Generation routes are routed by
the policy; /v1/embeddings, /tokenize and /detokenize go where the policy sends a request without a prefix;
/v1/models goes to any replica that is up; /health and /metrics are the router's. The
server's Guard runs first: a request is authenticated, and its body capped, before it is parsed or
tokenized."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ridgeline.http.errors import install_error_handlers
from ridgeline.http.guard import TENANT_HEADER, install_guard, read_body, tenant_of
from ridgeline.version import __version__
from ridgeline.router.core import Router
from ridgeline.router.policy import Route
from ridgeline.router.proxy import forward, forwarded_headers
from ridgeline.engine.cache_namespace import tenant_salt
from ridgeline.utils.internal_auth import deployment_secret

GENERATE = ("/v1/completions", "/v1/chat/completions")
ANY_REPLICA = ("/v1/embeddings", "/tokenize", "/detokenize")  # no prefix to route by: whichever the policy picks


def build_router_app(router: Router) -> FastAPI:
    # tokenizing and hashing run here, off the event loop (the tokenizer releases the GIL)
    executor = ThreadPoolExecutor(2, "ridgeline-route")

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await router.start()
        try:
            yield
        finally:
            await router.stop()
            executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="ridgeline router", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.router = router

    def count(status: int) -> None:  # a refusal by the router itself (the Guard, a route)
        router.metrics.requests.labels("router", str(status)).inc()

    install_error_handlers(app, count)

    async def generate(request: Request):  # the Guard has let it in: authenticated, its body under the cap
        body = await read_body(request)
        route, headers = Route(), forwarded_headers(request.headers)
        tenant = tenant_of(request.scope)
        if tenant is not None:  # the replicas trust the router's word on it (their key is the router's)
            headers[TENANT_HEADER] = tenant
        if router.hasher is not None:
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):  # the replica says why
                parsed = None
            field = None if tenant is None else tenant_salt(deployment_secret(), tenant)
            route = await asyncio.get_running_loop().run_in_executor(
                executor, router.hasher.route, request.url.path, parsed, field)
        return await forward(router, "POST", request.url.path, body, headers, route)

    async def any_replica(request: Request):
        headers = forwarded_headers(request.headers)
        tenant = tenant_of(request.scope)
        if tenant is not None:
            headers[TENANT_HEADER] = tenant
        return await forward(router, "POST", request.url.path, await read_body(request), headers, Route())

    async def models(request: Request):
        return await forward(router, request.method, request.url.path, b"", forwarded_headers(request.headers),
                             Route())

    async def health(_: Request):
        up = router.up()
        replicas = {r.url: "up" if r.up else f"down: {r.reason}" for r in router.replicas}
        return JSONResponse({"status": "ok" if up else "unavailable", "replicas": replicas},
                            status_code=200 if up else 503)

    async def metrics(_: Request):
        return Response(router.metrics.render(await router.replica_metrics()), media_type=CONTENT_TYPE_LATEST)

    for path in GENERATE:
        app.add_api_route(path, generate, methods=["POST"])
    for path in ANY_REPLICA:
        app.add_api_route(path, any_replica, methods=["POST"])
    app.add_api_route("/v1/models", models, methods=["GET", "HEAD"])
    app.add_api_route("/v1/models/{model_id:path}", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET", "HEAD"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    install_guard(app, router.settings.limits, count)
    return app
