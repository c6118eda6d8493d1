"""POST /v1/chat/completions"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from ridgeline.serve.generate import (Job, Prompt, accept, admitted, compile_structured, request_namespace,
                                      sse_response)
from ridgeline.serve.fields import ignored_header
from ridgeline.serve.json_body import json_response, object_bytes
from ridgeline.serve.limits import TextBound
from ridgeline.serve.logprobs import TokenTexts, chat_logprobs
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.state import state_of

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = state_of(request)
    params = accept(state, body, "/v1/chat/completions")
    tok = state.engine.tokenizer
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    await compile_structured(state, params, rid)
    messages = [m.as_template_input() for m in body.messages]
    with admitted(state, 1, params.n) as hold:
        prompt = await state.offload(rid, _prompt, tok, messages, state.render, state.text_bound)
        job = await Job.start(state, rid, [prompt], params, body.max_tokens_field,
                              request_namespace(state, request, body.cache_salt), hold)
    head = {"id": rid, "created": int(time.time()), "model": body.model,
            "system_fingerprint": state.system_fingerprint}
    if body.stream:
        return sse_response(job, _chunks(job, head, TokenTexts(tok), params.n, body.include_usage),
                            ignored_header(body.model_extra))
    [out] = await job.results(request)
    usage = job.usage()

    def build() -> bytes:
        texts = TokenTexts(tok)
        choices = ({"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": chat_logprobs(texts, c.logprobs), "finish_reason": c.finish_reason}
                   for c in out.outputs)
        return object_bytes({**head, "object": "chat.completion"}, choices, {"usage": usage})

    return await json_response(state, rid, build, ignored_header(body.model_extra))


def _prompt(tok, messages: list[dict], render=None, bound: TextBound | None = None) -> Prompt:
    """Render and tokenize (on the server's executor: a long conversation takes a while). render: the
    server's bounded renderer (None: in this thread); bound: rendered text longer cannot fit."""
    text = tok.apply_chat_template(messages, render=render)
    if bound is not None:
        bound.check(text, "messages")
    return Prompt(tok.encode_chat(messages, rendered=text, render=render), text)  # contents never parse specials


async def _chunks(job: Job, head: dict, texts: TokenTexts, n: int, include_usage: bool):
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
                yield chunk(c.index, {"content": c.text} if c.text else {}, chat_logprobs(texts, c.logprobs),
                            c.finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": job.usage()}
