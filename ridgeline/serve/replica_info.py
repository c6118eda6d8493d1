"""What a router needs from a replica besides the OpenAI routes: GET /info (model identity, block
size, where its KV events are published, and where its time between steps goes: engine/step_clock.py) and, with --kv-events-endpoint, the KV event publisher and
GET /kv_events/snapshot."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ridgeline.http.errors import ApiError
from ridgeline.version import __version__
from ridgeline.engine.async_engine import AsyncEngine
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.errors import InvalidRequestError
from ridgeline.serve.kv_publisher import KVEventPublisher


def start_publisher(engine: LLMEngine, async_engine: AsyncEngine, endpoint: str | None) -> KVEventPublisher | None:
    """Bind the PUB socket and hook it to the prefix cache and the step thread (None: events off)."""
    if endpoint is None:
        return None
    if engine.kv.cache is None:
        raise InvalidRequestError("--kv-events-endpoint announces prefix-cache blocks, but prefix caching is off "
                                  "(--no-prefix-caching or --kv-eviction)", "kv_events_endpoint")
    publisher = KVEventPublisher(endpoint, engine.info.block_size)
    engine.kv.cache.events = publisher.recorder
    async_engine.after_step = publisher.publish
    return publisher


def install_replica_routes(app: FastAPI) -> None:
    async def info(request: Request):
        state = request.app.state.ridgeline
        engine, publisher = state.engine, state.kv_events
        return JSONResponse({
            "model": state.settings.served_model_name, "model_path": str(engine.info.model_folder),
            "block_size": engine.info.block_size, "max_model_len": engine.max_model_len,
            "prefix_caching": engine.kv.cache is not None, "version": __version__,
            "kv_events_endpoint": publisher.endpoint if publisher is not None else None,
            "steps": engine.step_clock.summary()})

    async def snapshot(request: Request):
        publisher = request.app.state.ridgeline.kv_events
        if publisher is None:
            raise ApiError(404, "this server publishes no KV events (start it with --kv-events-endpoint)")
        return JSONResponse(publisher.snapshot())

    app.add_api_route("/info", info, methods=["GET"], include_in_schema=False)
    app.add_api_route("/kv_events/snapshot", snapshot, methods=["GET"], include_in_schema=False)
