"""The OpenAI server under uvicorn, on a socket bound up front (ridgeline/http/server.py's bind).

serve_forever: the CLI's main-thread server. SIGINT/SIGTERM (or ServerThread.stop) drains: stop
accepting, answer new requests on open connections with 503, let in-flight requests finish for up to
drain_timeout seconds, then end each one still running with an OpenAI-style 503 (in-band, then
[DONE], for a stream) and exit 0. A second signal ends them at once and exits with 128 + its number.
ServerThread: the same server on a background thread (tests, notebooks, benchmarks).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import time

import uvicorn
from fastapi import FastAPI

from ridgeline.http.server import SignalServer, UvicornThread, bind
from ridgeline.http.transport import guarded_protocol

log = logging.getLogger("ridgeline.serve")
WRITE_GRACE_S = 5.0  # after the drain deadline: time for routes to write their errors before connections close


def _config(app: FastAPI, drain_timeout: float | None, access_log: bool) -> uvicorn.Config:
    s = app.state.ridgeline.settings
    drain = s.drain_timeout if drain_timeout is None else drain_timeout
    return uvicorn.Config(app, lifespan="on", timeout_graceful_shutdown=drain, access_log=access_log,
                          log_level="info", timeout_keep_alive=5,
                          http=guarded_protocol(s.timeout_header, s.max_connections))


class _DrainingServer(SignalServer):
    """uvicorn's shutdown cancels whatever is left at its graceful timeout (cut streams, a text/plain
    500, CancelledError tracebacks) and re-raises the signal; here the app ends each request itself
    at the deadline, and a signal means: drain, then return an exit status."""

    exit_status = 0

    def _on_signal(self, sig: int, frame) -> None:
        # state first, then the message: a second signal can run its handler in the middle of this one
        if self.should_exit:
            self.force_exit = True
            self.exit_status = 128 + sig
            print("second signal: ending in-flight requests now", file=sys.stderr, flush=True)
        else:
            self.should_exit = True
            print(f"{signal.Signals(sig).name}: draining in-flight requests for up to "
                  f"{self.config.timeout_graceful_shutdown:g}s", file=sys.stderr, flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = self.config.app.state.ridgeline.drain
        drain.begin()
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        timeout = self.config.timeout_graceful_shutdown
        if not await self._wait_idle(timeout):
            drain.expire(timeout)
            if not await self._wait_idle(WRITE_GRACE_S, ignore_force=True):
                await self._close_the_rest()
        drain.forced = self.force_exit
        await self.lifespan.shutdown()

    async def _wait_idle(self, timeout: float, ignore_force: bool = False) -> bool:
        """Wait until no connection or request task is left; False on timeout or a second signal."""
        deadline = time.monotonic() + timeout
        state = self.server_state
        while state.connections or state.tasks:
            if time.monotonic() >= deadline or (self.force_exit and not ignore_force):
                return False
            await asyncio.sleep(0.02)
        return True

    async def _close_the_rest(self) -> None:
        """Clients that did not take their error within the grace: drop them (their routes then see a
        disconnect and end), and cancel what still runs after that."""
        state = self.server_state
        log.warning("shutdown: closing %d connection(s) that did not finish within %gs of the drain deadline",
                    len(state.connections), WRITE_GRACE_S)
        for connection in list(state.connections):
            connection.transport.close()
        if not await self._wait_idle(1.0, ignore_force=True):
            for task in state.tasks:
                task.cancel()


def serve_forever(app: FastAPI, sock: socket.socket, drain_timeout: float | None = None,
                  access_log: bool = False) -> int:
    """Serve until a signal; returns the process exit status (0: drained, 128+n: forced by signal n)."""
    server = _DrainingServer(_config(app, drain_timeout, access_log))
    server.run(sockets=[sock])
    return server.exit_status


class ServerThread(UvicornThread):
    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, drain_timeout: float | None = None):
        self.app = app
        super().__init__(_DrainingServer(_config(app, drain_timeout, access_log=False)), bind(host, port), "server")
