"""In-process prefill and decode workers and a front, for the disaggregation server tests."""
from __future__ import annotations

import threading
import time

import uvicorn

from ridgeline.config import EngineConfig
from ridgeline.disagg.transports import ReceiveLimits, create_connector
from ridgeline.disagg.front import Front, Worker, build_front
from ridgeline.disagg.worker import DisaggWorker, install
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread, bind, url_of
from ridgeline.serve.state import ServerSettings

SAFETY_S = 60.0
SECRET = b"test-deployment-secret-0123456789"  # the internal channels' secret of these in-process deployments


def engine(model, kv: str = "auto") -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs(str(model), dtype="float32", kv_cache_memory="2MiB",
                                              kv_cache_dtype=kv, progress=False))


def worker_server(model, role: str, kv: str, connector: str = "tcp", timeout: float = SAFETY_S, **limits):
    """(ServerThread started, its DisaggWorker) for a role, or (ServerThread, None) co-located."""
    eng = engine(model, kv)
    app = build_app(eng, ServerSettings(str(model), quiet=True))
    worker = None
    if role != "colocated":
        conn = create_connector(connector, timeout, secret=SECRET, limits=ReceiveLimits(**limits))
        worker = DisaggWorker(role, eng, conn, timeout)
        install(app, worker, SECRET)
    return ServerThread(app).start(), worker


class FrontThread:
    def __init__(self, front: Front):
        self.front = front
        self.sock = bind("127.0.0.1", 0)
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(uvicorn.Config(build_front(front), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> FrontThread:
        self.thread.start()
        deadline = time.monotonic() + SAFETY_S
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the front did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(SAFETY_S)
        self.sock.close()


def info_of(server: ServerThread) -> dict:
    import httpx
    return httpx.get(server.url + "/disagg/info").json()


def front_over(prefill: list[ServerThread], decode: list[ServerThread]) -> FrontThread:
    return FrontThread(Front([Worker(s.url, info_of(s)) for s in prefill],
                             [Worker(s.url, info_of(s)) for s in decode], secret=SECRET)).start()
