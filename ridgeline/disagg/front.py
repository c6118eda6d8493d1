"""The xPyD front: one OpenAI endpoint over x prefill and y decode workers. Each generation request
goes to the prefill worker and the decode worker with the fewest requests in flight (ties in turn),
through PDClient; the decode worker's answer (JSON or SSE) streams back as it comes. A client that
goes away closes the decode worker's stream, which aborts the request there.

`check_workers` is the start-up check: the roles are right, there is at least one of each, every
worker runs the same model and configuration (fingerprint) with the same KV layout and connector.

The server's Guard runs first (the front's --api-key, body cap and deadlines): a request reaches a
worker only once it is authenticated and its body is in. Workers get the workers' key (`worker_key`)
on every call from the front, never the client's Authorization header."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ridgeline.disagg.pair import PDClient
from ridgeline.errors import RidgelineError
from ridgeline.http.errors import error_body, install_error_handlers
from ridgeline.http.front_limits import FrontLimits, auth_headers
from ridgeline.http.guard import install_guard, read_body
from ridgeline.http.headers import passed_on


class DisaggConfigError(RidgelineError):
    status = 400
    type = "configuration_error"


@dataclass
class Worker:
    url: str
    info: dict  # its /disagg/info
    inflight: int = 0


def check_workers(prefill: list[Worker], decode: list[Worker]) -> None:
    if not decode:
        raise DisaggConfigError("no decode worker: disaggregation needs at least one")
    if not prefill:
        raise DisaggConfigError("a decode worker needs a prefill worker: none was given")
    for role, workers in (("prefill", prefill), ("decode", decode)):
        for w in workers:
            if w.info.get("role") != role:
                raise DisaggConfigError(f"{w.url} is a {w.info.get('role')} worker, not a {role} worker")
    ref = decode[0]
    for w in prefill + decode:
        for key, what in (("fingerprint", "model and configuration"), ("kv_spec", "KV cache layout"),
                          ("connector", "KV connector")):
            if w.info.get(key) != ref.info.get(key):
                raise DisaggConfigError(
                    f"mismatched workers: {w.url} has {what} {w.info.get(key)} ({w.info.get('model')}) but "
                    f"{ref.url} has {ref.info.get(key)} ({ref.info.get('model')}); start every worker with the "
                    "same model and engine flags")
    for w in decode:
        if not w.info.get("address"):
            raise DisaggConfigError(f"decode worker {w.url} has no KV connector address")
    for w in prefill:
        if not w.info.get("internal"):
            raise DisaggConfigError(f"prefill worker {w.url} has no internal endpoint address")


class Front:
    def __init__(self, prefill: list[Worker], decode: list[Worker], http: httpx.AsyncClient | None = None,
                 worker_key: str | None = None, *, secret: bytes):
        """worker_key: the workers' API key (every HTTP call carries it); secret: the deployment's, for the
        workers' internal channels."""
        if not secret:
            raise DisaggConfigError("the front needs the deployment's internal secret")
        check_workers(prefill, decode)
        self.prefill, self.decode = prefill, decode
        self.auth = auth_headers(worker_key)  # on every call to a worker
        self.refused: dict[int, int] = {}  # HTTP status -> requests the front itself refused
        self.http = http or httpx.AsyncClient(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100))
        self.pd = PDClient(self.http, secret)
        self._turn = itertools.count()
        self.requests = 0
        self.errors = 0

    def headers(self, request: Request) -> dict[str, str]:
        """What a call to a worker carries: the client's content headers, and the workers' key."""
        return {**{k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}, **self.auth}

    def count_refusal(self, status: int) -> None:
        self.refused[status] = self.refused.get(status, 0) + 1

    def pick(self, workers: list[Worker]) -> Worker:
        turn = next(self._turn)
        order = workers[turn % len(workers):] + workers[:turn % len(workers)]
        return min(order, key=lambda w: w.inflight)

    async def generate(self, route: str, request: Request) -> Response:
        self.requests += 1
        raw = await read_body(request)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _error(400, "the request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "invalid_request_error")
        p, d = self.pick(self.prefill), self.pick(self.decode)
        p.inflight += 1
        d.inflight += 1
        try:
            resp, streamed = await self.pd.run(route, body, p.info["internal"], d.url, d.info["address"],
                                               self.headers(request))
        except httpx.HTTPError as e:
            d.inflight -= 1
            self.errors += 1
            return _error(503, f"the decode worker did not answer ({type(e).__name__})", "service_unavailable")
        finally:
            p.inflight -= 1
        if not streamed:
            d.inflight -= 1
            return Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"),
                            headers=passed_on(resp.headers))
        return StreamingResponse(_relay(resp, d), resp.status_code, media_type=resp.headers.get("content-type"),
                                 headers={**{k: v for k, v in resp.headers.items() if k.lower() == "cache-control"},
                                          **passed_on(resp.headers)})


async def _relay(resp: httpx.Response, worker: Worker):
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    finally:  # also when the client went away: closing aborts the request on the decode worker
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        worker.inflight -= 1


def _error(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse(error_body(message, type_), status_code=status)


def build_front(front: Front, limits: FrontLimits = FrontLimits()) -> FastAPI:
    app = FastAPI(title="ridgeline disaggregated front", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.front = front
    install_error_handlers(app, front.count_refusal)

    for route in ("/v1/completions", "/v1/chat/completions"):
        async def handler(request: Request, route: str = route):
            return await front.generate(route, request)
        app.add_api_route(route, handler, methods=["POST"])

    async def models(request: Request):
        try:
            r = await front.http.get(front.decode[0].url + request.url.path, headers=front.headers(request))
        except httpx.HTTPError:
            return _error(503, "the decode worker did not answer", "service_unavailable")
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))

    async def health():
        for w in front.prefill + front.decode:
            try:
                ok = (await front.http.get(w.url + "/health", timeout=5)).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                return JSONResponse({"status": "unavailable", "worker": w.url}, status_code=503)
        return JSONResponse({"status": "ok", "prefill": len(front.prefill), "decode": len(front.decode)})

    async def metrics():
        c = front.pd.counts
        lines = [f"ridgeline_disagg_requests_total {front.requests}",
                 f"ridgeline_disagg_errors_total {front.errors}"]
        lines += [f'ridgeline_disagg_transfers_total{{status="{k}"}} {getattr(c, k)}'
                  for k in ("sent", "failed", "skipped", "rejected")]
        lines += [f'ridgeline_disagg_refused_total{{status="{k}"}} {n}' for k, n in sorted(front.refused.items())]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def workers():
        """Each worker's /disagg/info (role, transfers, where its time between steps goes), or its error."""
        out = []
        for w in front.prefill + front.decode:
            try:
                r = await front.http.get(w.url + "/disagg/info", headers=front.auth, timeout=60)
                out.append({"url": w.url, **r.json()})
            except (httpx.HTTPError, ValueError) as e:
                out.append({"url": w.url, "role": w.info.get("role"), "error": type(e).__name__})
        return JSONResponse({"workers": out})

    app.add_api_route("/disagg/workers", workers, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET", "HEAD"])
    app.add_api_route("/v1/models/{model_id:path}", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET", "HEAD"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    install_guard(app, limits, front.count_refusal)
    return app
