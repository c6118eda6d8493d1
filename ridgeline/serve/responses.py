"""POST /v1/responses: OpenAI's Responses API, stateless, around a ChatRun (chat_run.py). The body is
checked in this API's words and translated into a chat request (responses_request.py); the reply comes
back as a response object (responses_output.py) or its event stream (responses_stream.py). Errors
keep OpenAI's shape, which this API shares."""
from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError

from ridgeline.errors import RidgelineError
from ridgeline.http.errors import from_validation
from ridgeline.serve.chat_run import Choice, start_chat
from ridgeline.serve.fields import ignored_header
from ridgeline.serve.generate import sse_response, warn_unknown
from ridgeline.serve.json_body import dumps, json_response
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.responses_output import (call_item, envelope, finished, message_item, message_status, new_id,
                                              reasoning_item, response_usage)
from ridgeline.serve.responses_request import ResponsesRequest, renamed
from ridgeline.serve.responses_stream import ResponseEvents, frame
from ridgeline.serve.state import state_of

ROUTE = "/v1/responses"
router = APIRouter()


@router.post(ROUTE)
async def create_response(body: ResponsesRequest, request: Request):
    state = state_of(request)
    rid = new_id("resp")
    warn_unknown(body, ROUTE)
    translated = body.chat_body()  # its 400s name this API's fields already
    try:
        try:
            chat = ChatCompletionRequest.model_validate(translated)
        except ValidationError as e:
            raise from_validation(e.errors()) from None
        run = await start_chat(state, chat, request, rid, ROUTE)
    except RidgelineError as e:  # raised in chat's field names: answered in ours
        raise _explained(renamed(e), body) from None
    head, tok = envelope(body, rid), state.engine.tokenizer
    headers = ignored_header(body.model_extra)
    if body.stream:
        events = ResponseEvents(run, head, tok)
        return sse_response(run.job, events.events(), headers, frame=frame, on_error=events.failed, done=None)
    [choice] = await run.choices(request)
    response = finished(head, output_items(choice), choice.finish_reason,
                        response_usage(run.usage(), choice.reasoning, tok))
    return await json_response(state, rid, lambda: dumps(response).encode("utf-8"), headers)


def output_items(choice: Choice) -> list[dict]:
    """The whole reply's items, in the order the stream sends them (responses_stream.py)."""
    items = [reasoning_item(new_id("rs"), choice.reasoning)] if choice.reasoning else []
    if choice.content or not choice.tool_calls:
        items.append(message_item(new_id("msg"), choice.content or "", message_status(choice.finish_reason)))
    return items + [call_item(new_id("fc"), call) for call in choice.tool_calls]


def _explained(e: RidgelineError, body: ResponsesRequest) -> RidgelineError:
    if e.code == "context_length_exceeded" and body.truncation == "auto":
        e.message += " (truncation auto is accepted, but this server never drops input items to make room)"
        e.args = (e.message,)
    return e
