"""POST /v1/completions"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.serve.generate import (Job, Prompt, accept, admitted, compile_structured, request_namespace,
                                      sse_response)
from ridgeline.serve.fields import ignored_header
from ridgeline.serve.json_body import json_response, object_bytes
from ridgeline.serve.logprobs import (LegacyLogprobs, TokenTexts, as_raw, completion_logprobs, join_logprobs,
                                      prompt_logprobs_block)
from ridgeline.serve.protocol import CompletionRequest
from ridgeline.serve.state import state_of

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = state_of(request)
    params = accept(state, body, "/v1/completions")
    rid = f"cmpl-{uuid.uuid4().hex}"
    await compile_structured(state, params, rid)
    texts = body.prompts
    if state.text_bound is not None:
        for p in texts:
            if isinstance(p, str):
                state.text_bound.check(p)
    with admitted(state, len(texts), params.n) as hold:
        prompts = await state.offload(rid, _prompts, state.engine, texts, body.echo)
        job = await Job.start(state, rid, prompts, params, body.max_tokens_field,
                              request_namespace(state, request, body.cache_salt), hold)
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": body.model,
            "system_fingerprint": state.system_fingerprint}
    tok, n = state.engine.tokenizer, params.n
    if body.stream:
        return sse_response(job, _chunks(job, head, TokenTexts(tok), n, body.echo, body.include_usage),
                            ignored_header(body.model_extra))
    outs = await job.results(request)
    usage = job.usage()
    return await json_response(state, rid, lambda: object_bytes(head, _choices(tok, prompts, outs, n, body.echo),
                                                                {"usage": usage}), ignored_header(body.model_extra))


def _choices(tok, prompts: list[Prompt], outs: list[RequestOutput], n: int, echo: bool):
    """The response's choices, one at a time (json_body.object_bytes serializes each in turn)."""
    texts = TokenTexts(tok)
    for i, (p, out) in enumerate(zip(prompts, outs)):
        echoed, echo_lps = _echo(texts, p, out, echo)
        for c in out.outputs:
            yield {"index": i * n + c.index, "text": echoed + c.text,
                   "logprobs": join_logprobs(echo_lps, completion_logprobs(texts, c.logprobs, len(echoed))),
                   "finish_reason": c.finish_reason}


def _echo(texts: TokenTexts, p: Prompt, out: RequestOutput, echo: bool) -> tuple[str, LegacyLogprobs | None]:
    """The echoed prompt text, and its tokens' logprobs when they were asked for (echo + logprobs)."""
    if not echo:
        return "", None
    lps = prompt_logprobs_block(texts, p.ids, out.prompt_logprobs) if out.prompt_logprobs is not None else None
    return p.text, lps


def _prompts(engine: LLMEngine, prompts: list[str | list[int]], echo: bool) -> list[Prompt]:
    """Tokenize (on the server's executor: a long prompt takes a while)."""
    return [_prompt(engine, p, echo) for p in prompts]


def _prompt(engine: LLMEngine, prompt: str | list[int], echo: bool) -> Prompt:
    ids = engine.encode_prompt(prompt)
    if isinstance(prompt, str):
        return Prompt(ids, prompt)
    return Prompt(ids, engine.tokenizer.decode(ids, skip_special_tokens=False) if echo else None)


async def _chunks(job: Job, head: dict, texts: TokenTexts, n: int, echo: bool, include_usage: bool):
    usage = {"usage": None} if include_usage else {}

    def chunk(index: int, text: str, logprobs=None, finish: str | None = None) -> dict:
        return {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                     "finish_reason": finish}], **usage}

    offsets: dict[int, int] = {}  # choice -> characters sent (the legacy logprobs' text_offset)
    scored = job.params.prompt_logprobs is not None  # echo + logprobs: echo once the prompt is scored
    if echo and not scored:
        for i, p in enumerate(job.prompts):
            for k in range(n):
                offsets[i * n + k] = len(p.text)
                yield chunk(i * n + k, p.text)
    async for out in job:  # deltas
        i = job.index_of(out.request_id)
        if echo and scored and out.prompt_logprobs is not None:
            text, lps = _echo(texts, job.prompts[i], out, True)
            for k in range(n):
                offsets[i * n + k] = len(text)
                yield chunk(i * n + k, text, as_raw(lps))
        for c in out.outputs:
            index = i * n + c.index
            if c.text or c.logprobs or c.finish_reason:
                offset = offsets.get(index, 0)
                offsets[index] = offset + len(c.text)
                yield chunk(index, c.text, as_raw(completion_logprobs(texts, c.logprobs, offset)), c.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": job.usage()}
