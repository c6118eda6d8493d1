"""The Responses API's response object, as the whole reply (serve/responses.py) and the event stream
(serve/responses_stream.py) both build it, so the two agree: the envelope echoing the request, the
output items, the status and the usage.

Output order: a reasoning item (where the model's reasoning parser split one off and it is not empty),
the message (its text; present unless the reply is only function calls), then one function_call item
per call. `store` is false: the server did not store the response, whatever the request asked."""
from __future__ import annotations

import time
import uuid

from ridgeline.serve.responses_request import ResponsesRequest
from ridgeline.tool_calls.parser import ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def envelope(body: ResponsesRequest, rid: str) -> dict:
    """The response object before its output: what the request asked for, echoed (status in_progress)."""
    text = {"format": (body.text or {}).get("format") or {"type": "text"}, "verbosity": "medium"}
    reasoning = body.reasoning or {}
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "background": False, "error": None, "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": None, "metadata": body.metadata or {},
            "model": body.model, "output": [], "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "service_tier": "default", "store": False, "temperature": body.temperature, "text": text,
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto", "tools": body.tools or [],
            "top_logprobs": 0, "top_p": body.top_p, "truncation": body.truncation or "disabled", "usage": None,
            "user": body.user}


def reasoning_item(item_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [reasoning_part(text)]}


def reasoning_part(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    """status: in_progress while streamed, completed, or incomplete (cut at max_output_tokens)."""
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [text_part(text)]}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: ToolCall, arguments: str | None = None, status: str = "completed") -> dict:
    """arguments: None for the call's own (the whole); "" as announced before its arguments stream."""
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments, "status": status}


def finished(head: dict, output: list[dict], finish_reason: str | None, usage: dict) -> dict:
    """The response object at its end. finish_reason: the chat choice's ("length": incomplete)."""
    cut = finish_reason == "length"
    return {**head, "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "output": output, "usage": usage}


def message_status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def response_usage(chat_usage: dict, reasoning: str | None, tok) -> dict:
    """Chat's usage in this API's names. reasoning_tokens: the reasoning text tokenized again (the markers
    around it are not counted; a re-tokenization can differ from the sampled tokens by a token or so)."""
    details = chat_usage.get("prompt_tokens_details") or {}
    thought = len(tok.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": thought},
            "total_tokens": chat_usage["total_tokens"]}
