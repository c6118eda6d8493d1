"""build_app(engine, settings): the FastAPI app. Its lifespan starts and stops the step thread."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ridgeline.http.errors import install_error_handlers
from ridgeline.http.guard import install_guard
from ridgeline.version import __version__
from ridgeline.engine.async_engine import AsyncEngine
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve import anthropic, chat, completions, embeddings, ollama, responses, tokenize
from ridgeline.serve.console.paths import LIVE_PATH, STATIC_PREFIX
from ridgeline.serve.docs import docs_page
from ridgeline.serve.drain import Drain
from ridgeline.serve.limits import CHAT_TEMPLATE_MIN_BYTES, text_bound
from ridgeline.serve.metrics import ServerMetrics
from ridgeline.serve.pooling import pooling_of
from ridgeline.serve.replica_info import install_replica_routes, start_publisher
from ridgeline.serve.request_log import RequestLog
from ridgeline.serve.state import ServerSettings, ServerState, state_of
from ridgeline.serve.stats_log import log_throughput
from ridgeline.weights.template_worker import TemplateWorkers


def build_app(engine: LLMEngine, settings: ServerSettings, log_interval: float = 5.0) -> FastAPI:
    """log_interval: seconds between throughput lines while busy (none with settings.quiet)."""
    async_engine = AsyncEngine(engine)
    metrics = ServerMetrics(async_engine)
    request_log = RequestLog(settings.log_requests) if settings.log_requests else None
    state = ServerState(settings, engine, async_engine, metrics, request_log, Drain(async_engine),
                        system_fingerprint(engine))
    state.kv_events = start_publisher(engine, async_engine, settings.kv_events_endpoint)
    state.text_bound = bound = text_bound(engine.max_model_len, engine.tokenizer.max_bytes_per_token)
    state.pooling = pooling_of(settings.pooling, engine.info.model_folder)
    template_bytes = settings.chat_template_max_bytes
    if template_bytes is None:  # the default never refuses a prompt that could fit
        template_bytes = max(CHAT_TEMPLATE_MIN_BYTES, bound.max_chars if bound is not None else 0)
    state.chat_template = TemplateWorkers(settings.chat_template_timeout, template_bytes)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        async_engine.start()
        ticker = None if settings.quiet else asyncio.ensure_future(log_throughput(state, log_interval))
        probe = asyncio.ensure_future(metrics.probe_loop())
        try:
            yield
        finally:
            for task in (ticker, probe):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await async_engine.stop(timeout=0.5 if state.drain.forced else 10.0)
            state.executor.shutdown(wait=False, cancel_futures=True)
            state.chat_template.close()
            if request_log is not None:
                request_log.close()
            if state.kv_events is not None:
                state.kv_events.close()

    # FastAPI's own /docs and /redoc load their scripts from a CDN: replaced by an offline page
    app = FastAPI(title="ridgeline", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ridgeline = state
    app.state.started = int(time.time())
    install_error_handlers(app, metrics.count_error)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(tokenize.router)
    app.include_router(embeddings.router)
    app.include_router(responses.router)
    app.include_router(anthropic.router)
    ollama.install(app, settings.console)
    for path, route in (("/v1/models", list_models), ("/v1/models/{model_id:path}", get_model), ("/health", health),
                        ("/version", tokenize.version)):
        app.add_api_route(path, route, methods=["GET"])
        app.add_api_route(path, route, methods=["HEAD"], include_in_schema=False)
    app.add_api_route("/metrics", prometheus, methods=["GET"])
    install_replica_routes(app)

    async def docs():
        return docs_page(app.openapi())

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    if settings.console:
        from ridgeline.serve.console.routes import install
        install(app)
    install_guard(app, settings.limits, metrics.count_error, drain=state.drain,
                  metrics_paths=("/metrics", LIVE_PATH), open_paths=("/",) if settings.console else (),
                  open_prefix=STATIC_PREFIX if settings.console else None)
    return app


def system_fingerprint(engine: LLMEngine) -> str:
    """Names the backend configuration a response came from (OpenAI's `system_fingerprint`): the same
    Ridgeline version, model files, architecture, dtypes and kernels give the same value."""
    i = engine.info
    key = f"{__version__}|{i.model_folder}|{i.architecture}|{i.dtype}|{i.kv_spec.format_names}|{i.kernels}"
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _card(request: Request) -> dict:
    state = state_of(request)
    return {"id": state.settings.served_model_name, "object": "model", "created": request.app.state.started,
            "owned_by": "ridgeline", "max_model_len": state.engine.max_model_len}


async def list_models(request: Request):
    return JSONResponse({"object": "list", "data": [_card(request)]})


async def get_model(model_id: str, request: Request):
    state_of(request).check_model(model_id)
    return JSONResponse(_card(request))


async def health(request: Request):
    state = state_of(request)
    if state.drain.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    ok = state.async_engine.alive
    return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)


async def prometheus(request: Request):  # async: reads event-loop-owned counts on the loop thread
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
