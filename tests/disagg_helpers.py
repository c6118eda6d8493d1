"""In-process prefill and decode workers and a front, for the disaggregation server tests."""
from __future__ import annotations

import httpx

from ridgeline.config import EngineConfig
from ridgeline.disagg.front import Front, Worker, build_front
from ridgeline.disagg.launch import front_server
from ridgeline.disagg.transports import ReceiveLimits, create_connector
from ridgeline.disagg.worker import DisaggWorker
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.http.front_limits import FrontLimits, auth_headers
from ridgeline.http.server import UvicornThread, bind
from ridgeline.serve.app import build_app
from ridgeline.serve.disagg_worker import install
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

SAFETY_S = 60.0
SECRET = b"test-deployment-secret-0123456789"  # the internal channels' secret of these in-process deployments


def engine(model, kv: str = "auto", **opts) -> LLMEngine:
    opts = {"dtype": "float32", "kv_cache_memory": "2MiB", **opts}
    return LLMEngine(EngineConfig.from_kwargs(str(model), kv_cache_dtype=kv, progress=False, **opts))


def worker_app(model, role: str, kv: str, connector: str = "tcp", timeout: float = SAFETY_S, name: str | None = None,
               api_key: str | None = None, limits: dict | None = None, **engine_opts):
    """(the app, its DisaggWorker) for a role, or (the app, None) co-located; not started. limits: the
    connector's ReceiveLimits fields."""
    eng = engine(model, kv, **engine_opts)
    app = build_app(eng, ServerSettings(name or str(model), quiet=True, api_key=api_key))
    worker = None
    if role != "colocated":
        conn = create_connector(connector, timeout, secret=SECRET, limits=ReceiveLimits(**(limits or {})))
        worker = DisaggWorker(role, eng, conn, timeout)
        install(app, worker, SECRET)
    return app, worker


def worker_server(model, role: str, kv: str, connector: str = "tcp", timeout: float = SAFETY_S, **limits):
    """(ServerThread started, its DisaggWorker) for a role, or (ServerThread, None) co-located."""
    app, worker = worker_app(model, role, kv, connector, timeout, limits=limits)
    return ServerThread(app).start(), worker


class FrontThread(UvicornThread):
    """The front on a background thread, served as `serve --disaggregate` serves it (guarded protocol)."""

    def __init__(self, front: Front, limits: FrontLimits = FrontLimits()):
        self.front = front
        super().__init__(front_server(build_front(front, limits), limits), bind("127.0.0.1", 0), "front")


def info_of(server: ServerThread, key: str | None = None) -> dict:
    return httpx.get(server.url + "/disagg/info", headers=auth_headers(key)).json()


def front_over(prefill: list[ServerThread], decode: list[ServerThread], worker_key: str | None = None,
               limits: FrontLimits = FrontLimits()) -> FrontThread:
    workers = [[Worker(s.url, info_of(s, worker_key)) for s in servers] for servers in (prefill, decode)]
    return FrontThread(Front(*workers, worker_key=worker_key, secret=SECRET), limits).start(SAFETY_S)
