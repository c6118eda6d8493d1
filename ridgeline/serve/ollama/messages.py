"""ollama's conversation -> OpenAI chat messages (what chat_run renders).

ollama's tool calls carry their arguments as an object and, from older clients, no id; a tool result
names its function (`tool_name`) or nothing. Each call gets an id here (its own, or `call_<message>_<k>`)
and each result answers one earlier call: the one its `tool_call_id` names, else the first unanswered
call of its `tool_name`, else the first unanswered call. A result that answers no call is a 400."""
from __future__ import annotations

import json

from ridgeline.errors import InvalidRequestError
from ridgeline.serve.ollama.protocol import Message


def _refuse_images(images, where: str) -> None:
    if images:
        raise InvalidRequestError(f"{where}.images: images are not supported (this server serves a text model)",
                                  where.split("[")[0], code="unsupported_parameter")


def chat_messages(messages: list[Message]) -> list[dict]:
    out: list[dict] = []
    pending: list[tuple[str, str]] = []  # (id, function name) of calls not answered yet, in order
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        _refuse_images(m.images, where)
        if m.role != "assistant" and (m.tool_calls or m.thinking is not None):
            field = "tool_calls" if m.tool_calls else "thinking"
            raise InvalidRequestError(f"{where}.{field}: only assistant messages carry {field}", "messages")
        if m.role != "tool" and (m.tool_name is not None or m.tool_call_id is not None):
            raise InvalidRequestError(f"{where}: only tool messages carry tool_name or tool_call_id", "messages")
        msg: dict = {"role": m.role, "content": m.content if m.content is not None or m.role == "assistant" else ""}
        if m.role == "assistant":
            if m.thinking is not None:
                msg["reasoning_content"] = m.thinking
            if m.tool_calls:
                msg["tool_calls"] = calls = [_call(c, i, k) for k, c in enumerate(m.tool_calls)]
                pending += [(c["id"], c["function"]["name"]) for c in calls]
        elif m.role == "tool":
            msg["tool_call_id"] = _answered(pending, m, where)
        out.append(msg)
    return out


def _call(c, i: int, k: int) -> dict:
    return {"id": c.id or f"call_{i}_{k}", "type": "function",
            "function": {"name": c.function.name, "arguments": json.dumps(c.function.arguments)}}


def _answered(pending: list[tuple[str, str]], m: Message, where: str) -> str:
    """The id of the call a tool result answers (removed from pending)."""
    if m.tool_call_id is not None:
        match = [p for p in pending if p[0] == m.tool_call_id]
    elif m.tool_name is not None:
        match = [p for p in pending if p[1] == m.tool_name]
    else:
        match = pending[:1]
    if not match:
        named = m.tool_call_id or m.tool_name
        raise InvalidRequestError(
            f"{where}: this tool result answers no earlier assistant tool call"
            + (f" ({ascii(named)[:70]})" if named else "") + "; send the assistant message with its tool_calls "
            "before the results", "messages")
    pending.remove(match[0])
    return match[0][0]
