"""A Messages reply in Anthropic's shapes, from a ChatRun: the whole message, and its SSE events
(message_start, per block content_block_start / content_block_delta / content_block_stop, message_delta
with the stop reason and usage, message_stop; an error mid-stream is an `error` event).

Blocks come in the order the parser gives their pieces: thinking, then text, then tool_use blocks, one
per call (a call is parsed whole, so its input comes in one input_json_delta). The whole message holds
the same blocks: what `client.messages.stream(...).get_final_message()` builds from the events equals the
non-streamed reply (a model writing text after a call is the exception: the stream gives it a block of
its own after the call, the whole message joins it into the one text block)."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from ridgeline.serve.chat_run import ChatRun, Choice
from ridgeline.serve.json_body import dumps


def stop_of(run: ChatRun, finish: str | None, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). The engine's output names the stop string that ended the reply
    (CompletionOutput.stop_reason); a string not among the client's (a template's own) is end_turn."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    out = run.job.acc.outputs.get(run.job.request_ids[0])
    matched = out.outputs[0].stop_reason if out is not None and out.outputs else None
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def usage_of(run: ChatRun) -> dict:
    """Anthropic's usage: input_tokens are the prompt's tokens the prefix cache did not hold (the total
    prompt is input_tokens + cache_read_input_tokens, as Anthropic counts)."""
    u = run.usage()
    cached = u["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": u["prompt_tokens"] - cached, "output_tokens": u["completion_tokens"],
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _tool_use(call_id: str, name: str, arguments: str | None) -> dict:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    if arguments is not None:
        try:
            block["input"] = json.loads(arguments)
        except ValueError:  # a call cut by max_tokens (stop_reason says so): no input to give
            pass
    return block


def whole_message(run: ChatRun, head: dict, choice: Choice, stop_sequences: list[str] | None) -> dict:
    content: list[dict] = []
    if choice.reasoning:
        content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.content:
        content.append({"type": "text", "text": choice.content})
    content += [_tool_use(c.id, c.name, c.arguments) for c in choice.tool_calls]
    reason, sequence = stop_of(run, choice.finish_reason, stop_sequences)
    return {**head, "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": usage_of(run)}


_STARTS = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""}}
_DELTAS = {"thinking": "thinking_delta", "text": "text_delta"}


async def message_events(run: ChatRun, head: dict, stop_sequences: list[str] | None) -> AsyncIterator[dict]:
    """The events of one streamed message (n is 1). Each dict's `type` is its SSE event name."""
    prompt = sum(len(p.ids) for p in run.job.prompts)
    yield {"type": "message_start", "message": {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                                "usage": {"input_tokens": prompt, "output_tokens": 0}}}
    index, open_kind, finish = -1, None, None
    async for d in run.deltas():
        finish = d.finish_reason or finish
        delta = d.delta
        if "tool_calls" in delta:
            pieces = [("tool_use", call) for call in delta["tool_calls"]]
        elif delta.get("reasoning"):
            pieces = [("thinking", delta["reasoning"])]
        elif delta.get("content"):
            pieces = [("text", delta["content"])]
        else:
            continue
        for kind, piece in pieces:
            if kind != open_kind or (kind == "tool_use" and "id" in piece):  # a call's head opens its block
                if open_kind is not None:
                    yield {"type": "content_block_stop", "index": index}
                index, open_kind = index + 1, kind
                start = _tool_use(piece["id"], piece["function"]["name"], None) if kind == "tool_use" \
                    else _STARTS[kind]
                yield {"type": "content_block_start", "index": index, "content_block": start}
            if kind == "tool_use":
                if piece["function"]["arguments"]:
                    yield {"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": piece["function"]["arguments"]}}
            else:
                yield {"type": "content_block_delta", "index": index,
                       "delta": {"type": _DELTAS[kind], kind: piece}}
    if open_kind is not None:
        yield {"type": "content_block_stop", "index": index}
    reason, sequence = stop_of(run, finish, stop_sequences)
    yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
           "usage": usage_of(run)}
    yield {"type": "message_stop"}


def event_frame(event: dict) -> str:
    return f"event: {event['type']}\ndata: {dumps(event)}\n\n"

