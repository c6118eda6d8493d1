"""POST /api/chat and POST /api/generate: ollama's bodies translated into a chat completion (chat_run.py)
or, for a raw generate, a completion (raw.py); the reply streamed as NDJSON (ollama's default) or whole."""
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.errors import InvalidRequestError
from ridgeline.serve.chat_run import ChatRun, start_chat
from ridgeline.serve.logprobs import TokenTexts, chat_logprobs
from ridgeline.serve.ollama import reply
from ridgeline.serve.ollama.card import resolve
from ridgeline.serve.ollama.messages import chat_messages
from ridgeline.serve.ollama.protocol import ChatRequest, GenerateRequest
from ridgeline.serve.ollama.raw import raw_deltas, start_raw
from ridgeline.serve.ollama.translate import chat_fields, check_window, ollama_names
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.state import state_of

router = APIRouter()


def _loaded(model: str, end: dict, stream: bool) -> JSONResponse:
    """An empty conversation or prompt: ollama's "load the model" request (it is loaded already)."""
    body = {"model": model, "created_at": reply.created_at(), **end, "done_reason": "load", "done": True}
    return JSONResponse(body, media_type=reply.NDJSON if stream else None)


async def _chat_run(state, body, messages: list[dict], request: Request, rid: str, route: str) -> ChatRun:
    with ollama_names():
        fields, num_ctx = chat_fields(state, body, messages, resolve(state, body.model))
        chat = ChatCompletionRequest.model_validate(fields)
        run = await start_chat(state, chat, request, rid, route)
        check_window(run.job, num_ctx, chat.max_tokens)
    return run


async def _chat_deltas(run: ChatRun):
    async for d in run.deltas(whole_calls=True):
        yield d.delta, d.finish_reason, reply.entries(d.logprobs)


@router.post("/api/chat")
async def chat(body: ChatRequest, request: Request):
    state = state_of(request)
    resolve(state, body.model)
    messages = chat_messages(body.messages)
    if not messages:
        return _loaded(body.model, reply.CHAT_END, body.stream)
    run = await _chat_run(state, body, messages, request, f"ollama-{uuid.uuid4().hex}", "/api/chat")
    if body.stream:
        return reply.ndjson_response(run.job, reply.lines(run.job, _chat_deltas(run), body.model, reply.chat_piece,
                                                          reply.CHAT_END))
    [c] = await run.choices(request)
    message = {"role": "assistant", "content": c.content or ""}
    if c.reasoning is not None:
        message["thinking"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [reply.ollama_call(call.delta()) for call in c.tool_calls]
    return JSONResponse(reply.whole(run.job, body.model, {"message": message}, c.finish_reason, c.logprobs))


def _refuse_generate_fields(body: GenerateRequest) -> None:
    if body.suffix:
        raise InvalidRequestError("suffix: insertion with a suffix (fill-in-the-middle) is not supported; leave it "
                                  "unset", "suffix", code="unsupported_parameter")
    if body.template is not None:
        raise InvalidRequestError("template: the served model's own chat template renders every prompt; leave "
                                  "template unset, or send raw: true with the prompt already templated", "template",
                                  code="unsupported_parameter")
    if body.context is not None:
        raise InvalidRequestError("context: deprecated by ollama and not supported; send the conversation to "
                                  "/api/chat", "context", code="unsupported_parameter")
    if body.images:
        raise InvalidRequestError("images: images are not supported (this server serves a text model)", "images",
                                  code="unsupported_parameter")
    if body.raw and (body.system is not None or body.think is not None):
        field = "system" if body.system is not None else "think"
        raise InvalidRequestError(f"{field}: a raw prompt bypasses the chat template, which is what places {field}; "
                                  "put it in the prompt yourself or leave raw unset", field)


@router.post("/api/generate")
async def generate(body: GenerateRequest, request: Request):
    state = state_of(request)
    served = resolve(state, body.model)
    _refuse_generate_fields(body)
    if not body.prompt:
        return _loaded(body.model, reply.GENERATE_END, body.stream)
    rid = f"ollama-{uuid.uuid4().hex}"
    if body.raw:
        with ollama_names():
            fields, num_ctx = chat_fields(state, body, [], served)
            job = await start_raw(state, fields, body.prompt, request, rid)
            check_window(job, num_ctx, fields.get("max_tokens"))
        if body.stream:
            return reply.ndjson_response(job, reply.lines(job, raw_deltas(job, state.engine.tokenizer), body.model, reply.generate_piece,
                                                          reply.GENERATE_END))
        [out] = await job.results(request)
        c = out.outputs[0]
        logprobs = chat_logprobs(TokenTexts(state.engine.tokenizer), c.logprobs)
        return JSONResponse(reply.whole(job, body.model, {"response": c.text}, c.finish_reason, logprobs))
    messages = ([{"role": "system", "content": body.system}] if body.system is not None else []) + \
        [{"role": "user", "content": body.prompt}]
    run = await _chat_run(state, body, messages, request, rid, "/api/generate")
    if body.stream:
        return reply.ndjson_response(run.job, reply.lines(run.job, _chat_deltas(run), body.model, reply.generate_piece,
                                                          reply.GENERATE_END))
    [c] = await run.choices(request)
    fields = {"response": c.content or ""}
    if c.reasoning is not None:
        fields["thinking"] = c.reasoning
    return JSONResponse(reply.whole(run.job, body.model, fields, c.finish_reason, c.logprobs))
