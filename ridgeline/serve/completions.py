"""POST /v1/completions"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.generate import Cursor, Job, Prompt, sse_response, accept
from ridgeline.serve.logprobs import completion_logprobs
from ridgeline.serve.protocol import CompletionRequest
from ridgeline.serve.state import state_of

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = state_of(request)
    params = accept(state, body, "/v1/completions")
    rid = f"cmpl-{uuid.uuid4().hex}"
    prompts = await state.offload(rid, _prompts, state.engine, body.prompts, body.echo)
    job = await Job.start(state, rid, prompts, params, body.max_tokens_field, body.cache_salt)
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": body.model,
            "system_fingerprint": state.system_fingerprint}
    tok, n = state.engine.tokenizer, params.n
    if body.stream:
        return sse_response(job, _chunks(job, head, tok, n, body.echo, body.include_usage))
    choices = []
    for i, (p, out) in enumerate(zip(prompts, await job.results(request))):
        echo = p.text if body.echo else ""
        choices += [{"index": i * n + c.index, "text": echo + c.text,
                     "logprobs": completion_logprobs(tok, c.logprobs, len(echo)),
                     "finish_reason": c.finish_reason} for c in out.outputs]
    return JSONResponse({**head, "choices": choices, "usage": job.usage()})


def _prompts(engine: LLMEngine, prompts: list[str | list[int]], echo: bool) -> list[Prompt]:
    """Tokenize (on the server's executor: a long prompt takes a while)."""
    return [_prompt(engine, p, echo) for p in prompts]


def _prompt(engine: LLMEngine, prompt: str | list[int], echo: bool) -> Prompt:
    ids = engine.encode_prompt(prompt)
    if isinstance(prompt, str):
        return Prompt(ids, prompt)
    return Prompt(ids, engine.tokenizer.decode(ids, skip_special_tokens=False) if echo else None)


async def _chunks(job: Job, head: dict, tok, n: int, echo: bool, include_usage: bool):
    usage = {"usage": None} if include_usage else {}

    def chunk(index: int, text: str, logprobs=None, finish: str | None = None) -> dict:
        return {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                     "finish_reason": finish}], **usage}

    cursors: dict[int, Cursor] = {}
    if echo:
        for i, p in enumerate(job.prompts):
            for k in range(n):
                yield chunk(i * n + k, p.text)
    async for out in job:
        i = job.index_of(out.request_id)
        for c in out.outputs:
            cur = cursors.setdefault(i * n + c.index, Cursor())
            offset = cur.chars
            step = cur.advance(c)
            if step is not None:
                text, lps, finish = step
                yield chunk(i * n + c.index, text, completion_logprobs(tok, lps, offset), finish)
    if include_usage:
        yield {**head, "choices": [], "usage": job.usage()}
