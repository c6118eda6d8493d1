"""/api/generate with raw: the prompt as it is, no template: a completion (as /v1/completions runs one),
started here and streamed as (delta, finish reason) pairs like a chat run's."""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request

from ridgeline.errors import InvalidRequestError
from ridgeline.serve.generate import Job, Prompt, accept, admitted, compile_structured, request_namespace
from ridgeline.serve.logprobs import TokenTexts, chat_logprobs
from ridgeline.serve.ollama.reply import entries
from ridgeline.serve.protocol import CompletionRequest

ROUTE = "/api/generate"


async def start_raw(state, fields: dict, prompt: str, request: Request, rid: str) -> Job:
    """fields: the chat fields translate.chat_fields made (their sampling, response_format and logprobs apply
    here; messages do not). No num_predict: the reply may run to the end of the context window."""
    logprobs, top_logprobs = fields.get("logprobs"), fields.get("top_logprobs")
    if state.text_bound is not None:
        state.text_bound.check(prompt, "prompt")
    ids = await state.offload(rid, state.engine.encode_prompt, prompt)
    fields = {k: v for k, v in fields.items() if k not in ("messages", "logprobs", "top_logprobs")}
    fields["logprobs"] = _logprobs(logprobs, top_logprobs)
    if fields.get("max_tokens") is None:
        fields["max_tokens"] = max(1, state.engine.max_model_len - len(ids))  # a prompt too long is refused below
    body = CompletionRequest.model_validate({**fields, "prompt": prompt})
    params = accept(state, body, ROUTE)
    await compile_structured(state, params, rid)
    with admitted(state, 1, 1) as hold:
        return await Job.start(state, rid, [Prompt(ids, prompt)], params, body.max_tokens_field,
                               request_namespace(state, request, None), hold)


def _logprobs(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """ollama's pair -> a completion's `logprobs` (the top entries per token; None: no logprobs)."""
    if top_logprobs is not None and not logprobs:
        raise InvalidRequestError("top_logprobs: requires logprobs to be true", "top_logprobs")
    return (top_logprobs or 0) if logprobs else None


async def raw_deltas(job: Job, tok) -> AsyncIterator[tuple[dict, str | None, list | None]]:
    texts = TokenTexts(tok)
    async for out in job:
        for c in out.outputs:
            yield ({"content": c.text} if c.text else {}), c.finish_reason, entries(chat_logprobs(texts, c.logprobs))
