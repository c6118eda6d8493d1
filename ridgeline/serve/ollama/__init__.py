"""ollama's REST API (/api/...) on Ridgeline's server, for ollama's own clients and the front ends built on
them: chat and generate (routes.py, onto the chat run), embeddings (embed.py), the model card routes
(models.py). Every error under /api/ leaves as ollama's body, {"error": message}."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from ridgeline.http.errors import register_error_shape
from ridgeline.serve.ollama import embed, models, routes

register_error_shape("/api/", lambda e: {"error": e.message})


def install(app: FastAPI, console: bool) -> None:
    """The routes; and ollama's liveness answer at / where the console does not own it."""
    for module in (routes, embed, models):
        app.include_router(module.router)
    if not console:
        async def alive():
            return PlainTextResponse("Ollama is running (served by Ridgeline)")

        app.add_api_route("/", alive, methods=["GET"], include_in_schema=False)
        app.add_api_route("/", alive, methods=["HEAD"], include_in_schema=False)
