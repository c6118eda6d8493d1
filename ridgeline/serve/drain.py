"""The app's side of a graceful shutdown; the server (server.py) drives it.

begin(): the server stopped accepting; new requests on open connections get 503 and /health says
"draining". expire(): the drain timeout passed; every request still in flight ends now with a 503
its route can still write (an in-band error then [DONE] for a stream, a JSON body otherwise), one
warning per request in the log. Nothing is cancelled: cancelling a route would cut its response."""
from __future__ import annotations

import asyncio
import logging

from ridgeline.engine.async_engine import AsyncEngine, EngineStoppedError

log = logging.getLogger("ridgeline.serve")


class Drain:
    def __init__(self, async_engine: AsyncEngine):
        self.async_engine = async_engine
        self.draining = False
        self.expired = asyncio.Event()  # set on the event loop by expire()
        self.error = EngineStoppedError("the server is shutting down")
        self.timeout = 0.0  # the drain timeout that expired
        self.forced = False  # a second signal: stop without waiting for the step thread's current step

    def begin(self) -> None:
        self.draining = True

    def expire(self, drain_timeout: float) -> int:
        """End what is still in flight; returns how many HTTP requests that was."""
        self.draining = True
        self.timeout = drain_timeout
        self.error = EngineStoppedError(f"the server shut down before this request finished (it was still "
                                        f"running when the {drain_timeout:g}s drain timeout passed)")
        self.expired.set()  # requests not yet in the engine (being tokenized) stop waiting
        streams = self.async_engine.abort_all(self.error)
        for stream in streams:
            self.log_aborted(stream.name)
        return len(streams)

    def log_aborted(self, name: str) -> None:
        log.warning("shutdown: aborted %s: still running after the %gs drain timeout", name, self.timeout)
