"""/api/generate with raw: the prompt as it is, no template: a completion (as /v1/completions runs one),
started here and streamed as (delta, finish reason) pairs like a chat run's."""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request

from ridgeline.serve.generate import Job, Prompt, accept, admitted, compile_structured, request_namespace
from ridgeline.serve.protocol import CompletionRequest

ROUTE = "/api/generate"


async def start_raw(state, fields: dict, prompt: str, request: Request, rid: str) -> Job:
    """fields: the chat fields translate.chat_fields made (their sampling and response_format apply here;
    messages do not). No num_predict: the reply may run to the end of the context window."""
    if state.text_bound is not None:
        state.text_bound.check(prompt, "prompt")
    ids = await state.offload(rid, state.engine.encode_prompt, prompt)
    fields = {k: v for k, v in fields.items() if k != "messages"}
    if fields.get("max_tokens") is None:
        fields["max_tokens"] = max(1, state.engine.max_model_len - len(ids))  # a prompt too long is refused below
    body = CompletionRequest.model_validate({**fields, "prompt": prompt})
    params = accept(state, body, ROUTE)
    await compile_structured(state, params, rid)
    with admitted(state, 1, 1) as hold:
        return await Job.start(state, rid, [Prompt(ids, prompt)], params, body.max_tokens_field,
                               request_namespace(state, request, None), hold)


async def raw_deltas(job: Job) -> AsyncIterator[tuple[dict, str | None]]:
    async for out in job:
        for c in out.outputs:
            yield ({"content": c.text} if c.text else {}), c.finish_reason
