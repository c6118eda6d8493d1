"""Every HTTP front Ridgeline runs, for the tests they must all pass alike: the OpenAI server, a
router over one replica, and a disaggregated front over a prefill and a decode worker.

`Backends(kind, model)` holds what a kind of front serves through (built once per test module);
`backends.serving(**limits)` starts that front with the limits under test (FrontLimits fields) and
yields a `Served`. Behind the router and the disaggregated front, the replica and the workers take
BACKEND_KEY (never the front's key: a forwarded client header would be refused) and count the
client requests that reach them, so a test can tell the front's own refusal from a backend's."""
from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass

import uvicorn
from disagg_helpers import SECRET, FrontThread, info_of, worker_app
from server_helpers import wait_until

from ridgeline.config import EngineConfig
from ridgeline.disagg.front import Front, Worker
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.http.front_limits import FrontLimits
from ridgeline.router.core import RouterSettings
from ridgeline.router.serve import RouterThread, build_router
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

KINDS = ("server", "router", "disagg")
MODEL = "tiny"
BACKEND_KEY = "the-backends-own-key"
CLIENT_PATHS = ("/v1/", "/disagg/prefill")  # what a proxy sends on for a client (not its own health checks)
# the routes each front guards with its key
GUARDED = {"server": ("/v1/models", "/v1/models/tiny", "/metrics", "/docs", "/openapi.json"),
           "router": ("/v1/models", "/v1/models/tiny", "/metrics"),
           "disagg": ("/v1/models", "/v1/models/tiny", "/metrics", "/disagg/workers")}


class Reached:
    """ASGI middleware, outermost on a backend: counts the client requests that arrive there."""

    def __init__(self, app, counter: collections.Counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(CLIENT_PATHS):
            self.counter[scope["path"]] += 1
        await self.app(scope, receive, send)


@dataclass
class Served:
    kind: str
    url: str
    server: uvicorn.Server  # the front's own (its open connections)
    async_engines: list  # every engine behind the front
    counter: collections.Counter  # requests that reached a backend (the server: its engine)
    guarded: tuple[str, ...]

    def __post_init__(self):
        self.base = sum(self.counter.values())

    def reached(self) -> int:
        """Requests that got past the front since it started (to a replica, a worker, or the server's engine)."""
        return sum(self.counter.values()) - self.base

    def wait_idle(self) -> None:
        wait_until(lambda: all(ae.stats.kv_blocks_used == 0 and not ae.num_running and not ae.num_waiting
                               for ae in self.async_engines), "no request left and every KV block freed")


def count_adds(async_engine, counter: collections.Counter) -> None:
    """The server is its own backend: count what reaches its engine."""
    add = async_engine.add

    async def counted(*args, **kwargs):
        counter["engine"] += 1
        return await add(*args, **kwargs)

    async_engine.add = counted


def serving_server(thread: ServerThread, counter: collections.Counter) -> Served:
    state = thread.app.state.ridgeline
    return Served("server", thread.url, thread.server, [state.async_engine], counter, GUARDED["server"])


def _engine(model, **opts) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs(str(model), progress=False, **opts))


class Backends:
    def __init__(self, kind: str, model, **engine_opts):
        self.kind, self.model, self.counter = kind, model, collections.Counter()
        self.threads: list[ServerThread] = []
        self.workers = []
        opts = {"dtype": "float32", "kv_cache_memory": "2MiB", **engine_opts}
        if kind == "server":
            self.engine = _engine(model, **opts)
        elif kind == "router":
            settings = ServerSettings(MODEL, quiet=True, api_key=BACKEND_KEY, kv_events_endpoint="tcp://127.0.0.1:*")
            self._start(build_app(_engine(model, **opts), settings))
        else:
            for role in ("prefill", "decode"):
                app, worker = worker_app(model, role, "auto", name=MODEL, api_key=BACKEND_KEY, **opts)
                self.workers.append(worker)
                self._start(app)

    def _start(self, app) -> None:
        app.add_middleware(Reached, counter=self.counter)  # added last: runs before the backend's own guard
        self.threads.append(ServerThread(app).start())

    @contextlib.contextmanager
    def serving(self, **limits):
        if self.kind == "server":
            app = build_app(self.engine, ServerSettings(MODEL, quiet=True, **limits))
            count_adds(app.state.ridgeline.async_engine, self.counter)
            with ServerThread(app) as t:
                yield serving_server(t, self.counter)
            return
        engines = [t.app.state.ridgeline.async_engine for t in self.threads]
        if self.kind == "router":
            settings = RouterSettings("cache-aware", health_interval=0.5, replica_api_key=BACKEND_KEY,
                                      limits=FrontLimits(**limits))
            with RouterThread(asyncio.run(build_router([self.threads[0].url], settings))) as t:
                yield Served("router", t.url, t.server, engines, self.counter, GUARDED["router"])
            return
        prefill, decode = ([Worker(t.url, info_of(t, BACKEND_KEY))] for t in self.threads)
        with FrontThread(Front(prefill, decode, worker_key=BACKEND_KEY, secret=SECRET), FrontLimits(**limits)) as t:
            yield Served("disagg", t.url, t.server, engines, self.counter, GUARDED["disagg"])

    def close(self) -> None:
        for t in self.threads:
            t.stop()
        for w in self.workers:
            w.close()

    def __enter__(self) -> Backends:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
