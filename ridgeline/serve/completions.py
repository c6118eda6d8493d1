"""POST /v1/completions"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.serve.generate import Job, Prompt, sse_response, accept
from ridgeline.serve.logprobs import completion_logprobs, join_logprobs, prompt_logprobs_block
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
        echo, echo_lps = _echo(tok, p, out, body.echo)
        choices += [{"index": i * n + c.index, "text": echo + c.text,
                     "logprobs": join_logprobs(echo_lps, completion_logprobs(tok, c.logprobs, len(echo))),
                     "finish_reason": c.finish_reason} for c in out.outputs]
    return JSONResponse({**head, "choices": choices, "usage": job.usage()})


def _echo(tok, p: Prompt, out: RequestOutput, echo: bool) -> tuple[str, dict | None]:
    """The echoed prompt text, and its tokens' logprobs when they were asked for (echo + logprobs)."""
    if not echo:
        return "", None
    lps = prompt_logprobs_block(tok, p.ids, out.prompt_logprobs) if out.prompt_logprobs is not None else None
    return p.text, lps


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
            text, lps = _echo(tok, job.prompts[i], out, True)
            for k in range(n):
                offsets[i * n + k] = len(text)
                yield chunk(i * n + k, text, lps)
        for c in out.outputs:
            index = i * n + c.index
            if c.text or c.logprobs or c.finish_reason:
                offset = offsets.get(index, 0)
                offsets[index] = offset + len(c.text)
                yield chunk(index, c.text, completion_logprobs(tok, c.logprobs, offset), c.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": job.usage()}
