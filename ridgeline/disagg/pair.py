"""Run one OpenAI request disaggregated: its prompt on a prefill worker, whose KV goes to a decode
worker, which answers (streamed or not). What a front or a router calls:

    pd = PDClient(httpx.AsyncClient())
    response, streamed = await pd.run("/v1/completions", body, prefill_url, decode_url, decode_kv_address)
    # the decode worker's streaming response (streamed), or the prefill worker's 4xx error

The prefill worker validates the body first; a 4xx there is the client's error and is returned as
is. Any other prefill failure (unreachable, 5xx, transfer failed) still sends the request to the
decode worker, marked "failed": it computes the prompt itself, so the answer is never lost."""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

import httpx

from ridgeline.disagg.worker import TRANSFER_ID, TRANSFER_STATUS

log = logging.getLogger(__name__)
_FORWARD = ("authorization", "content-type", "accept")


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
    def __init__(self, http: httpx.AsyncClient, prefill_timeout: float = 600.0):
        self.http = http
        self.prefill_timeout = prefill_timeout
        self.counts = PDCounts()

    async def prefill(self, route: str, body: dict, prefill_url: str, kv_address: str, transfer_id: str,
                      headers: dict | None = None) -> tuple[str, httpx.Response | None]:
        """("sent" | "failed" | "skip", None), or ("rejected", the prefill worker's 4xx response)."""
        try:
            r = await self.http.post(prefill_url + "/disagg/prefill", timeout=self.prefill_timeout,
                                     headers={**(headers or {}), "content-type": "application/json"},
                                     content=encode({"route": route, "body": body, "transfer_id": transfer_id,
                                                     "target": kv_address}))
        except httpx.HTTPError as e:
            log.warning("prefill worker %s: %s; the decode worker computes the prompt", prefill_url, e)
            return "failed", None
        if 400 <= r.status_code < 500:
            return "rejected", r
        if r.status_code != 200:
            return "failed", None
        status = r.json().get("status")
        return (status if status in ("sent", "skip") else "failed"), None

    async def run(self, route: str, body: dict, prefill_url: str, decode_url: str, kv_address: str,
                  headers: dict | None = None) -> tuple[httpx.Response, bool]:
        """(the decode worker's response opened for streaming: the caller closes it, True), or (the
        prefill worker's 4xx response, read, False). httpx.HTTPError if the decode worker fails."""
        fwd = {k: v for k, v in (headers or {}).items() if k.lower() in _FORWARD}
        tid = uuid.uuid4().hex
        status, rejected = await self.prefill(route, body, prefill_url, kv_address, tid, fwd)
        if rejected is not None:
            self.counts.rejected += 1
            return rejected, False
        field = {"sent": "sent", "skip": "skipped"}.get(status, "failed")
        setattr(self.counts, field, getattr(self.counts, field) + 1)
        req = self.http.build_request("POST", decode_url + route, content=encode(body), timeout=None,
                                      headers={"content-type": "application/json", **fwd, TRANSFER_ID: tid,
                                               TRANSFER_STATUS: status})
        return await self.http.send(req, stream=True), True
