"""POST /v1/chat/completions"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.serve.generate import Job, Prompt, sse_response, accept
from ridgeline.serve.logprobs import chat_logprobs
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.state import state_of

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = state_of(request)
    params = accept(state, body, "/v1/chat/completions")
    tok = state.engine.tokenizer
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    prompt = await state.offload(rid, _prompt, tok, [m.as_template_input() for m in body.messages])
    job = await Job.start(state, rid, [prompt], params, body.max_tokens_field, body.cache_salt)
    head = {"id": rid, "created": int(time.time()), "model": body.model,
            "system_fingerprint": state.system_fingerprint}
    if body.stream:
        return sse_response(job, _chunks(job, head, tok, params.n, body.include_usage))
    [out] = await job.results(request)
    choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": chat_logprobs(tok, c.logprobs), "finish_reason": c.finish_reason} for c in out.outputs]
    return JSONResponse({**head, "object": "chat.completion", "choices": choices, "usage": job.usage()})


def _prompt(tok, messages: list[dict]) -> Prompt:
    """Render and tokenize (on the server's executor: a long conversation takes a while)."""
    text = tok.apply_chat_template(messages)
    return Prompt(tok.encode_chat(messages, rendered=text), text)  # message contents never parse special tokens


async def _chunks(job: Job, head: dict, tok, n: int, include_usage: bool):
    base = {**head, "object": "chat.completion.chunk"}
    usage = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, logprobs=None, finish: str | None = None) -> dict:
        return {**base, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish}], **usage}

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for out in job:  # deltas
        for c in out.outputs:
            if c.text or c.logprobs or c.finish_reason:
                yield chunk(c.index, {"content": c.text} if c.text else {}, chat_logprobs(tok, c.logprobs),
                            c.finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": job.usage()}
