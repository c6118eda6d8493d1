"""ollama's model-management routes for a server of one loaded model: GET /api/tags, POST /api/show,
GET /api/ps, GET /api/version, POST /api/pull (the served model: success at once; another: a 404, since
the server downloads nothing: `ridgeline pull` fetches a model and a server is started on it)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.http.errors import ApiError
from ridgeline.serve.ollama import card
from ridgeline.serve.ollama.protocol import ModelRequest
from ridgeline.serve.ollama.reply import NDJSON
from ridgeline.serve.state import state_of

router = APIRouter()
API_VERSION = "0.12.0"  # the ollama API these routes follow (think, tool_name, tool call ids)


async def tags(request: Request):
    return JSONResponse({"models": [card.entry(state_of(request))]})


async def ps(request: Request):
    return JSONResponse({"models": [card.running(state_of(request))]})


async def version(request: Request):
    return JSONResponse({"version": API_VERSION})


for _path, _route in (("/api/tags", tags), ("/api/ps", ps), ("/api/version", version)):
    router.add_api_route(_path, _route, methods=["GET"])
    router.add_api_route(_path, _route, methods=["HEAD"], include_in_schema=False)


@router.post("/api/show")
async def show(body: ModelRequest, request: Request):
    state = state_of(request)
    card.resolve(state, body.model_name)
    return JSONResponse(card.show(state))


@router.post("/api/pull")
async def pull(body: ModelRequest, request: Request):
    state = state_of(request)
    name = body.model_name
    try:
        card.resolve(state, name)
    except ApiError:
        shown = ascii(name)[1:-1][:80]
        raise ApiError(404, f'"{shown}" is not the model this server serves ("{card.listed_name(state)}"), and the '
                            "server downloads nothing: fetch a model with `ridgeline pull NAME` and start a server on "
                            "it", param="model", code="model_not_found") from None
    return JSONResponse({"status": "success"}, media_type=NDJSON if body.stream else None)
