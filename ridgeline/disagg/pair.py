"""Run one OpenAI request disaggregated: its prompt on a prefill worker, whose KV goes to a decode
worker, which answers (streamed or not). What a front or a router calls, holding the deployment's
secret (the internal channels are authenticated with it):

    pd = PDClient(httpx.AsyncClient(), secret)
    response, streamed = await pd.run("/v1/completions", body, prefill_internal, decode_url, decode_kv_address)
    # the decode worker's streaming response (streamed), or the prefill worker's 4xx error

`prefill_internal` and `decode_kv_address` are the workers' internal addresses (`internal` and
`address` in their /disagg/info). The decode worker issues the transfer's id first (over its KV
connector); the prefill worker validates the body, computes it and ships its KV under that id. A
4xx there is the client's error and is returned as is. Any other failure (unreachable, no id,
transfer failed) still sends the request to the decode worker, marked "failed": it computes the
prompt itself, so the answer is never lost."""
from __future__ import annotations

import asyncio
import functools
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from ridgeline.disagg.connector import TransferError, abandon_transfer, request_transfer
from ridgeline.disagg.sessions import SessionPool
from ridgeline.disagg.wire import LABEL_KV, LABEL_PREFILL, parse_address
from ridgeline.disagg.worker import TRANSFER_ID, TRANSFER_STATUS
from ridgeline.errors import RidgelineError

log = logging.getLogger(__name__)
_FORWARD = ("authorization", "content-type", "accept")
MAX_CALLS = 256  # internal calls in flight at once (each holds a thread while its prefill runs)


def encode(obj) -> bytes:
    """A body as the workers' json.loads reads it back, exactly as the client sent it: ASCII (a lone
    surrogate stays an escape), NaN and Infinity kept (httpx's json= refuses both, and the worker is
    the one to say what is wrong with them)."""
    return json.dumps(obj, ensure_ascii=True, allow_nan=True).encode()


@dataclass
class PDCounts:
    sent: int = 0
    failed: int = 0
    skipped: int = 0
    rejected: int = 0  # a prefill worker's 4xx, returned to the client


class PDClient:
    def __init__(self, http: httpx.AsyncClient, secret: bytes, prefill_timeout: float = 600.0,
                 connect_timeout: float = 10.0, max_calls: int = MAX_CALLS):
        self.http, self.secret = http, secret
        self.prefill_timeout, self.connect_timeout = prefill_timeout, connect_timeout
        self.counts = PDCounts()
        self._calls = ThreadPoolExecutor(max_calls, "pd-internal")
        # kept-open authenticated connections: to decode workers' connectors, to prefill workers' endpoints
        self._kv = SessionPool(secret, LABEL_KV, b"front", connect_timeout)
        self._prefill = SessionPool(secret, LABEL_PREFILL, b"front", connect_timeout)

    async def _call(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(self._calls, functools.partial(fn, *args, **kw))

    async def transfer_id(self, kv_address: str) -> str | None:
        try:
            return await self._call(request_transfer, self._kv, kv_address)
        except TransferError as e:
            log.warning("%s; the decode worker computes the prompt", e.message)
            return None

    async def prefill(self, route: str, body: dict, prefill_address: str, kv_address: str,
                      transfer_id: str) -> tuple[str, httpx.Response | None]:
        """("sent" | "failed" | "skip", None), or ("rejected", the prefill worker's 4xx as a response)."""
        request = {"op": "prefill", "route": route, "body": body, "transfer_id": transfer_id, "target": kv_address}
        try:
            host, port = parse_address(prefill_address, "tcp")
            answer = await self._call(self._prefill.call, host, port, request, self.prefill_timeout)
        except (OSError, RidgelineError) as e:
            log.warning("prefill worker %s: %s; the decode worker computes the prompt", prefill_address,
                        getattr(e, "message", e))
            return "failed", None
        status = answer.get("status")
        if status == "rejected":
            code = answer.get("http_status")
            code = code if isinstance(code, int) and 400 <= code < 500 else 400
            headers = {k: str(v) for k, v in (answer.get("headers") or {}).items() if k.lower() == "retry-after"}
            return "rejected", httpx.Response(code, json=answer.get("error"), headers=headers)
        if status == "failed":
            log.warning("prefill worker %s: %s; the decode worker computes the prompt", prefill_address,
                        str(answer.get("error"))[:200])
        return (status if status in ("sent", "skip") else "failed"), None

    async def run(self, route: str, body: dict, prefill_address: str, decode_url: str, kv_address: str,
                  headers: dict | None = None) -> tuple[httpx.Response, bool]:
        """(the decode worker's response opened for streaming: the caller closes it, True), or (the
        prefill worker's 4xx response, read, False). httpx.HTTPError if the decode worker fails."""
        fwd = {k: v for k, v in (headers or {}).items() if k.lower() in _FORWARD}
        tid = await self.transfer_id(kv_address)
        status = "failed"
        if tid is not None:
            status, rejected = await self.prefill(route, body, prefill_address, kv_address, tid)
            if rejected is not None:
                self.counts.rejected += 1
                self._calls.submit(abandon_transfer, self._kv, kv_address, tid)
                return rejected, False
        field = {"sent": "sent", "skip": "skipped"}.get(status, "failed")
        setattr(self.counts, field, getattr(self.counts, field) + 1)
        marks = {TRANSFER_ID: tid, TRANSFER_STATUS: status} if tid is not None else {}
        req = self.http.build_request("POST", decode_url + route, content=encode(body), timeout=None,
                                      headers={"content-type": "application/json", **fwd, **marks})
        return await self.http.send(req, stream=True), True

    def close(self) -> None:
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._kv.close()
        self._prefill.close()
