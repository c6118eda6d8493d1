"""The prefill worker's request: an OpenAI body read as its own route reads it, computed up to its
first token, its prompt KV shipped to a decode worker's connector. run_prefill is the `prefill` its
internal endpoint (disagg/prefill_server.py) runs, handed over by disagg_worker.install."""
from __future__ import annotations

import asyncio
from dataclasses import replace

from ridgeline.engine.messages import EngineRequest
from ridgeline.errors import InvalidRequestError
from ridgeline.serve import completions
from ridgeline.serve.chat_run import render_prompt
from ridgeline.serve.generate import accept, check_admission, check_context, compile_structured
from ridgeline.serve.protocol import ChatCompletionRequest, CompletionRequest

ROUTES = ("/v1/completions", "/v1/chat/completions")


async def _prompts(state, route: str, raw: dict, name: str):
    if route == "/v1/completions":
        body = CompletionRequest.model_validate(raw)
        params = accept(state, body, route)
        await compile_structured(state, params, name)  # off the step thread, under its deadline
        for p in body.prompts:  # text that can never fit is refused before the tokenizer sees it
            if isinstance(p, str) and state.text_bound is not None:
                state.text_bound.check(p)
        return body, params, await state.offload(name, completions._prompts, state.engine, body.prompts, False)
    if route == "/v1/chat/completions":
        body = ChatCompletionRequest.model_validate(raw)
        params = accept(state, body, route)
        await compile_structured(state, params, name)  # off the step thread, under its deadline
        messages = [m.as_template_input() for m in body.messages]
        return body, params, [await state.offload(name, render_prompt, state.engine.tokenizer, messages,
                                                  state.render, state.text_bound)]
    raise InvalidRequestError(f"route must be one of {', '.join(ROUTES)}, got {route!r}", "route")


def not_disaggregated(num_prompts: int, params) -> str | None:
    """Why a request is computed whole on a decode worker instead, or None."""
    if num_prompts != 1:
        return "several prompts"
    if params.n != 1:
        return "n > 1"
    if params.logprobs is not None or params.prompt_logprobs is not None:
        return "logprobs"
    return None


async def run_prefill(state, worker, route: str, raw: dict, transfer_id: str, target: str) -> dict:
    name = f"prefill-{transfer_id}"
    body, params, prompts = await _prompts(state, route, raw, name)
    for p in prompts:
        check_context(state.engine.max_model_len, p, body.max_tokens_field)
    why = not_disaggregated(len(prompts), params)
    if why is not None:
        worker.counts["skip"] += 1
        return {"status": "skip", "reason": why}
    check_admission(state, 1, 1)
    # the first token is sampled as the whole request would sample it (min_tokens keeps EOS out of it)
    first = replace(params, max_tokens=1, min_tokens=min(params.min_tokens, 1))
    fut = worker.exports.expect(name, transfer_id, target)
    try:
        stream = await state.async_engine.add([EngineRequest(name, prompts[0].ids, first, prompts[0].text,
                                                             body.cache_salt)], name)
        try:
            async for _ in stream:
                pass
        finally:
            stream.abort()
    finally:
        worker.exports.cancel(name)  # no first token (aborted, failed): the transfer fails
    delivered = await asyncio.wait_for(asyncio.wrap_future(fut), worker.timeout + 5)
    worker.counts["sent"] += 1
    return {"status": "sent", "bytes": delivered.nbytes, "seconds": delivered.seconds,
            "prompt_tokens": len(prompts[0].ids)}
