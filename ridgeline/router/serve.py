"""Build a Router from replica URLs (start-up checks included) and serve it under uvicorn."""
from __future__ import annotations

import socket

import httpx
import uvicorn

from ridgeline.http.front_limits import auth_headers
from ridgeline.http.server import SignalServer, UvicornThread, bind
from ridgeline.http.transport import guarded_protocol
from ridgeline.router.core import Router, RouterSettings
from ridgeline.router.prompt_hash import PromptHasher
from ridgeline.router.startup import discover, tokenizer_folder


async def build_router(urls: list[str], settings: RouterSettings, tokenizer: str | None = None) -> Router:
    headers = auth_headers(settings.replica_api_key)
    async with httpx.AsyncClient(timeout=settings.connect_timeout + 5, headers=headers) as client:
        replicas = await discover(client, urls, settings.policy)
    hasher = None
    if settings.policy == "cache-aware":
        folder = tokenizer_folder(tokenizer, [r.info for r in replicas])
        hasher = PromptHasher(folder, replicas[0].info["block_size"])
    return Router(replicas, settings, hasher)


class _RouterServer(SignalServer):
    """uvicorn re-raises a captured SIGINT/SIGTERM once it has stopped, which would end the process
    before `ridgeline serve --data-parallel-size` stops its replicas; here a signal only stops the
    server (a second one without waiting for open connections) and run() returns."""

    def _on_signal(self, sig: int, frame) -> None:
        self.force_exit = self.should_exit
        self.should_exit = True


def _config(router: Router) -> uvicorn.Config:
    from ridgeline.router.app import build_router_app
    limits = router.settings.limits
    return uvicorn.Config(build_router_app(router), lifespan="on", access_log=False, log_level="warning",
                          timeout_keep_alive=5, http=guarded_protocol(limits.timeout_header, limits.max_connections))


def serve_router(router: Router, sock: socket.socket) -> int:
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per proxied request
    _RouterServer(_config(router)).run(sockets=[sock])
    return 0


class RouterThread(UvicornThread):
    """The router on a background thread (tests, benchmarks)."""

    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0):
        self.router = router
        super().__init__(_RouterServer(_config(router)), bind(host, port), "router")


def serve_fleet(fleet, limits, sock: socket.socket, ollama_version: str = "0.0.0") -> int:
    """`ridgeline serve --models`: the front of several models (router/fleet_app.py) under uvicorn."""
    import logging
    from ridgeline.router.fleet_app import build_fleet_app
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = uvicorn.Config(build_fleet_app(fleet, limits, ollama_version), lifespan="on", access_log=False, log_level="warning",
                            timeout_keep_alive=5, http=guarded_protocol(limits.timeout_header, limits.max_connections))
    _RouterServer(config).run(sockets=[sock])
    return 0
