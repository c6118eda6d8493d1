"""install(app): the console's page, its static files, the live view and the calculators' API.

The page and its files are sent with a Content-Security-Policy that lets the page load scripts, styles
and data from this server only (none inline, nothing evaluated from strings), never be framed by another
site, and with nosniff, so a file is never read as a type other than the one it is served as.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from ridgeline.advisor.units import finite_or_none
from ridgeline.serve.console import advise_api
from ridgeline.serve.console.live import LiveView
from ridgeline.serve.console.paths import LIVE_PATH, STATIC_PREFIX

STATIC = Path(__file__).parent / "static"
# img data: is the page's empty favicon (it spares a request for /favicon.ico)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                    "Referrer-Policy": "no-referrer"}


class _StaticFiles(StaticFiles):
    async def get_response(self, path: str, scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def install(app: FastAPI) -> None:
    live = LiveView(app.state.ridgeline)

    async def index():
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache", **SECURITY_HEADERS})

    async def live_view(hardware: str = "local"):  # async: reads counts the event loop owns
        return JSONResponse(finite_or_none(live.snapshot(hardware)))

    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.add_api_route(LIVE_PATH, live_view, methods=["GET"], include_in_schema=False)
    app.include_router(advise_api.router, include_in_schema=False)
    app.mount(STATIC_PREFIX.rstrip("/"), _StaticFiles(directory=STATIC), name="console-static")
    app.state.console = live
