"""install(app): the console's page, its static files, the live view and the calculators' API."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ridgeline.advisor.units import finite_or_none
from ridgeline.serve.console import advise_api
from ridgeline.serve.console.live import LiveView
from ridgeline.serve.console.paths import LIVE_PATH, STATIC_PREFIX

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    live = LiveView(app.state.ridgeline)

    async def index():
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def live_view(hardware: str = "local"):  # async: reads counts the event loop owns
        return JSONResponse(finite_or_none(live.snapshot(hardware)))

    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.add_api_route(LIVE_PATH, live_view, methods=["GET"], include_in_schema=False)
    app.include_router(advise_api.router, include_in_schema=False)
    app.mount(STATIC_PREFIX.rstrip("/"), StaticFiles(directory=STATIC), name="console-static")
    app.state.console = live
