"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API around a ChatRun
(chat_run.py). The body is checked as Anthropic defines it (anthropic_request.py), translated into a
ChatCompletionRequest and run as a chat; the reply comes back in Anthropic's shapes (anthropic_stream.py).
Every error under /v1/messages, the guard's 401s and validation 400s included, leaves as Anthropic's
body: {"type": "error", "error": {"type": ..., "message": ...}}. The anthropic-version and anthropic-beta
headers are accepted whatever their value: the body's fields decide what is honoured."""
from __future__ import annotations

import re
import uuid
from contextlib import contextmanager

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.http.errors import from_validation, register_error_shape
from ridgeline.serve import reasoning
from ridgeline.serve.anthropic_request import CHAT_PARAMS, MessagesRequest, chat_body, thinking_plan
from ridgeline.serve.anthropic_stream import event_frame, message_events, whole_message
from ridgeline.serve.chat_run import render_prompt, start_chat, uses_tools
from ridgeline.serve.generate import sse_response
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.state import state_of
from ridgeline.serve.tools import plan as tool_plan

router = APIRouter()
PREFIX = "/v1/messages"
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_shape(e: RidgelineError) -> dict:
    kind = _TYPES.get(e.status, "invalid_request_error" if 400 <= e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


register_error_shape(PREFIX, error_shape)


def _error_events(e: RidgelineError) -> list[dict]:
    return [error_shape(e)]


@contextmanager
def _our_names():
    """Chat's errors name chat's fields: rename them to this API's (CHAT_PARAMS)."""
    try:
        yield
    except RidgelineError as e:
        name = CHAT_PARAMS.get(e.param)
        if name is not None:
            if e.message.startswith(e.param):
                e.message = name + e.message[len(e.param):]
            e.param = name
        raise


def _chat_request(state, body: MessagesRequest) -> ChatCompletionRequest:
    body.check_fields()
    tok = state.engine.tokenizer
    has_reasoning = reasoning.reasoning_format(state.settings.reasoning_parser, tok) is not None
    reads = re.search(r"\benable_thinking\b", tok.chat_template or "") is not None
    fields = chat_body(body, thinking_plan(body.thinking, body.max_tokens, has_reasoning, reads))
    with _our_names():
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as e:
            raise from_validation(e.errors()) from None


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request):
    state = state_of(request)
    if body.max_tokens is None:
        raise InvalidRequestError("max_tokens: this field is required", "max_tokens")
    chat = _chat_request(state, body)
    rid = f"msg_{uuid.uuid4().hex}"
    with _our_names():
        run = await start_chat(state, chat, request, rid, PREFIX)
    head = {"id": rid, "type": "message", "role": "assistant", "model": body.model}
    if body.stream:
        return sse_response(run.job, message_events(run, head, body.stop_sequences), frame=event_frame,
                            on_error=_error_events, done=None)
    [choice] = await run.choices(request)
    return JSONResponse(whole_message(run, head, choice, body.stop_sequences))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: MessagesRequest, request: Request):
    """The rendered prompt's tokens (system, messages, tools, the generation prompt), as /v1/messages
    would send them to the engine."""
    state = state_of(request)
    if body.stream:
        raise InvalidRequestError("stream: not a field of count_tokens", "stream")
    chat = _chat_request(state, body)
    state.check_model(chat.model)
    tok, rid = state.engine.tokenizer, f"count-{uuid.uuid4().hex}"
    with _our_names():
        params = chat.sampling_params()
        messages = [m.as_template_input() for m in chat.messages]
        extra = reasoning.template_variables(chat, tok)
        if uses_tools(chat):
            tools = await state.offload(rid, tool_plan, chat, tok, state.render, params, messages)
            messages = tools.messages
            extra.update(tools.extra)
        prompt = await state.offload(rid, render_prompt, tok, messages, state.render, state.text_bound, extra)
    return JSONResponse({"input_tokens": len(prompt.ids)})
