"""JSON bodies with pre-serialized parts, built off the event loop. A response with n choices and
their logprobs can be megabytes of JSON: as Python dicts and lists it is millions of objects,
whose building, serialization and garbage collection would stall every other request. Logprob
blocks are built as JSON text instead (Raw: strings, which the collector never traverses), and
the body is put together choice by choice on the server's executor."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial

from fastapi.responses import Response

_dumps = partial(json.dumps, ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # as JSONResponse


class Raw(str):
    """JSON text, spliced into a body as it is."""


def dumps(value) -> str:
    """value as compact JSON; Raw values inside dicts and lists are spliced, not quoted."""
    if isinstance(value, Raw):
        return value
    if isinstance(value, dict):
        return "{" + ",".join(f"{_dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and any(isinstance(v, (Raw, dict, list)) for v in value):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return _dumps(value)


def object_bytes(head: dict, choices: Iterable[dict], tail: dict) -> bytes:
    """{**head, "choices": [...], **tail} as UTF-8 JSON; choices is consumed one item at a time."""
    parts = ["{", dumps(head)[1:-1] + "," if head else "", '"choices":[']
    for i, choice in enumerate(choices):
        parts += [",", dumps(choice)] if i else [dumps(choice)]
    parts.append("]")
    if tail:
        parts += [",", dumps(tail)[1:-1]]
    parts.append("}")
    return "".join(parts).encode("utf-8")


async def json_response(state, name: str, build: Callable[[], bytes], headers: dict | None = None) -> Response:
    """build() on the server's executor (state.offload: the drain's deadline applies)."""
    return Response(await state.offload(name, build), media_type="application/json", headers=headers)
