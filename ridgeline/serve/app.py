"""build_app(engine, settings): the FastAPI app. Its lifespan starts and stops the step thread."""
from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ridgeline import __version__
from ridgeline.engine.async_engine import AsyncEngine
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve import chat, completions
from ridgeline.serve.errors import install_error_handlers
from ridgeline.serve.guard import Guard
from ridgeline.serve.metrics import ServerMetrics
from ridgeline.serve.request_log import RequestLog
from ridgeline.serve.state import ServerSettings, ServerState, state_of


def build_app(engine: LLMEngine, settings: ServerSettings) -> FastAPI:
    async_engine = AsyncEngine(engine)
    metrics = ServerMetrics(async_engine)
    request_log = RequestLog(settings.log_requests) if settings.log_requests else None

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        async_engine.start()
        try:
            yield
        finally:
            await async_engine.stop()
            if request_log is not None:
                request_log.close()

    app = FastAPI(title="ridgeline", version=__version__, lifespan=lifespan)
    app.state.ridgeline = ServerState(settings, engine, async_engine, metrics, request_log)
    app.state.started = int(time.time())
    install_error_handlers(app, metrics.count_error)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", prometheus, methods=["GET"])
    app.add_middleware(Guard, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes,
                       on_error=metrics.count_error)
    return app


async def list_models(request: Request):
    state = state_of(request)
    card = {"id": state.settings.served_model_name, "object": "model", "created": request.app.state.started,
            "owned_by": "ridgeline", "max_model_len": state.engine.max_model_len}
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request):
    ok = state_of(request).async_engine.alive
    return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)


async def prometheus(request: Request):  # async: reads event-loop-owned counts on the loop thread
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
