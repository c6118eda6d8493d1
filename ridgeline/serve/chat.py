"""POST /v1/chat/completions: OpenAI's shape around a ChatRun (chat_run.py)."""
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from ridgeline.serve.chat_run import ChatRun, start_chat
from ridgeline.serve.fields import ignored_header
from ridgeline.serve.generate import sse_response
from ridgeline.serve.json_body import json_response, object_bytes
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.state import state_of

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = state_of(request)
    run = await start_chat(state, body, request, f"chatcmpl-{uuid.uuid4().hex}", "/v1/chat/completions")
    if body.stream:
        return sse_response(run.job, _chunks(run, body.include_usage), ignored_header(body.model_extra))
    choices = await run.choices(request)
    usage = run.usage()

    def build() -> bytes:
        rows = ({"index": c.index, "message": c.message(), "logprobs": c.logprobs, "finish_reason": c.finish_reason}
                for c in choices)
        return object_bytes({**run.head, "object": "chat.completion"}, rows, {"usage": usage})

    return await json_response(state, run.rid, build, ignored_header(body.model_extra))


async def _chunks(run: ChatRun, include_usage: bool):
    base = {**run.head, "object": "chat.completion.chunk"}
    usage = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, logprobs=None, finish: str | None = None) -> dict:
        return {**base, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish}], **usage}

    for i in range(run.n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for d in run.deltas():
        yield chunk(d.index, d.delta, d.logprobs, d.finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": run.usage()}
