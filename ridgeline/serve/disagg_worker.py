"""A prefill or decode worker (disagg/worker.py) on the OpenAI server's app: `GET /disagg/info`, the
transfer headers' middleware, and for a prefill worker its internal endpoint (disagg/prefill_server.py)
computing requests as the server's routes read them (prefill_route.py)."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ridgeline.disagg.worker import DisaggWorker, TransferHeaders
from ridgeline.serve.state import state_of


def install(app: FastAPI, worker: DisaggWorker, secret: bytes | None = None) -> None:
    """The worker's routes on app; a prefill worker's internal endpoint (it needs `secret`) is bound
    now and serves while the app runs."""
    state = app.state.ridgeline
    state.disagg = worker
    app.add_api_route("/disagg/info", _info, methods=["GET"])
    app.add_middleware(TransferHeaders, worker=worker)
    if worker.role != "prefill":
        return
    from ridgeline.disagg.prefill_server import PrefillEndpoint
    from ridgeline.serve.prefill_route import run_prefill
    if not secret:
        raise ValueError("a prefill worker's internal endpoint needs the deployment's secret")
    worker.endpoint = endpoint = PrefillEndpoint(state, worker, run_prefill, secret, worker.internal_host,
                                                 worker.internal_port, worker.max_connections)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        async with inner(a) as value:
            endpoint.start(asyncio.get_running_loop())
            try:
                yield value
            finally:
                endpoint.close()
    app.router.lifespan_context = lifespan


async def _info(request: Request):
    state = state_of(request)
    return JSONResponse(state.disagg.info(state))
