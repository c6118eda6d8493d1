"""Send one request to a replica the policy picks and pass its answer back unchanged.

- Statuses, bodies and errors pass through as the replica wrote them.
- A replica that cannot be reached, drops the connection before answering, or answers 503 (it is
  draining or overloaded) while another replica is up: the request goes to the next replica. Nothing
  has reached the client yet, so a retry is invisible (a connection failure also takes the replica
  out of rotation).
- A stream passes through chunk by chunk once its first chunk has arrived. If the replica fails
  after that, the client gets an OpenAI-style error event and `data: [DONE]`: tokens already sent
  cannot be taken back, so it is never retried.
"""
from __future__ import annotations

import json
import logging
import re

import httpx
from fastapi.responses import Response, StreamingResponse

from ridgeline.http.errors import error_body
from ridgeline.router.core import Router
from ridgeline.router.policy import Route
from ridgeline.router.replica import Replica, Ticket
from ridgeline.http.headers import PASSED_ON

log = logging.getLogger("ridgeline.router")
# not Authorization: the router checked the client's key; replicas get theirs from the router's client
_PASSED_HEADERS = ("content-type", "accept", "openai-organization", "openai-project")
_KEPT_RESPONSE_HEADERS = ("content-type", "retry-after", "cache-control", "x-accel-buffering", *PASSED_ON)
_FIRST_TOKEN = re.compile(rb'"(?:text|content)": ?"[^"]')  # a chunk carrying generated text


def forwarded_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in _PASSED_HEADERS}


def _response_headers(resp: httpx.Response, ticket: Ticket) -> dict[str, str]:
    """The replica's headers worth passing on, and which replica answered and the prompt tokens the
    router expected it to have cached (compare with usage.prompt_tokens_details.cached_tokens)."""
    kept = {k: v for k, v in resp.headers.items() if k.lower() in _KEPT_RESPONSE_HEADERS}
    kept["x-ridgeline-replica"] = ticket.replica.url
    kept["x-ridgeline-expected-cached-tokens"] = str(ticket.expected_hit)
    return kept


async def forward(router: Router, method: str, path: str, body: bytes, headers: dict, route: Route) -> Response:
    tried: set[str] = set()
    while True:
        replica = router.pick(route, tried)
        tried.add(replica.name)
        ticket = router.admit(replica, route)
        outcome = await _try(router, replica, ticket, method, path, body, headers)
        if outcome is not None:
            return outcome
        ticket.end()
        router.metrics.retries.inc()


async def _try(router: Router, replica: Replica, ticket: Ticket, method: str, path: str, body: bytes,
               headers: dict) -> Response | None:
    """The response to pass on, or None to try another replica."""
    request = router.client.build_request(method, replica.url + path, content=body, headers=headers)
    try:
        resp = await router.client.send(request, stream=True)
    except httpx.HTTPError as e:
        router.mark_down(replica, f"{type(e).__name__} on {path}")
        return None
    streaming = resp.status_code == 200 and resp.headers.get("content-type", "").startswith("text/event-stream")
    if not streaming:
        try:
            content = await resp.aread()
        except httpx.HTTPError as e:
            router.mark_down(replica, f"{type(e).__name__} while reading the answer to {path}")
            return None
        finally:
            await resp.aclose()
        if resp.status_code == 503 and any(r.up and r is not replica for r in router.replicas):
            return None
        ticket.end()
        router.metrics.requests.labels(replica.url, str(resp.status_code)).inc()
        return Response(content, resp.status_code, _response_headers(resp, ticket))
    chunks = resp.aiter_raw()
    try:
        first = await anext(chunks)
    except (httpx.HTTPError, StopAsyncIteration) as e:
        await resp.aclose()
        router.mark_down(replica, f"{type(e).__name__} before the first chunk of {path}")
        return None
    router.metrics.requests.labels(replica.url, "200").inc()
    return StreamingResponse(_relay(router, replica, ticket, resp, first, chunks), 200, _response_headers(resp, ticket))


async def _relay(router: Router, replica: Replica, ticket: Ticket, resp: httpx.Response, first: bytes, chunks):
    try:
        chunk = first
        while True:
            if not ticket.started and _FIRST_TOKEN.search(chunk):
                ticket.first_token()
            yield chunk
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except httpx.HTTPError as e:
                router.mark_down(replica, f"{type(e).__name__} in the middle of a stream")
                router.metrics.stream_failures.inc()
                message = (f"the replica serving this request ({replica.url}) failed in the middle of the stream "
                           f"({type(e).__name__}); the output above is incomplete")
                yield b"\n\ndata: " + json.dumps(error_body(message, "server_error", code="replica_failed")).encode()
                yield b"\n\ndata: [DONE]\n\n"
                return
    finally:  # also when the client goes away: closing upstream makes the replica abort the request
        ticket.end()
        await resp.aclose()
