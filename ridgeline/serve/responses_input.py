"""A Responses API body's `input` (and `instructions`) as chat messages: message items, function calls and
their outputs, earlier reasoning. Text only; a key an item does not define, set to a value, is refused
naming its path (input[2].content[0].type); a null one is what an SDK dumps for an unset field."""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError

NO_STATE = "this server keeps no state (nothing is stored): send the whole conversation in input"


def bad(param: str, message: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param, code)


def unsupported(param: str, message: str) -> InvalidRequestError:
    return bad(param, message, "unsupported_parameter")


def messages(items: str | list, instructions: str | None) -> list[dict]:
    """input (and instructions, a system message first) as chat messages. function_call items join the
    assistant message before them (parallel calls are one message); a reasoning item's text goes to the
    next assistant message as its reasoning_content."""
    out: list[dict] = [{"role": "system", "content": instructions}] if instructions is not None else []
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not items:
        raise bad("input", "must not be empty")
    thought: str | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(where, "must be an object")
        kind = item.get("type") or "message"  # EasyInputMessage: type may be left out
        _known(item, _ITEM_KEYS.get(kind, set(item)), where)
        if kind == "reasoning":
            thought = _reasoning_text(item, where)
            continue
        if kind == "message":
            m = _message(item, where)
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", where), "type": "function",
                    "function": {"name": _str(item, "name", where), "arguments": _str(item, "arguments", where)}}
            if out and out[-1].get("_open"):
                out[-1]["tool_calls"].append(call)
                if thought is not None:
                    out[-1].setdefault("reasoning_content", thought)
                    thought = None
                continue
            m = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif kind == "function_call_output":
            m = {"role": "tool", "tool_call_id": _str(item, "call_id", where),
                 "content": _text(item.get("output"), f"{where}.output", ("input_text", "output_text"))}
        elif kind == "item_reference":
            raise unsupported(f"{where}.type", "item_reference needs stored items; " + NO_STATE)
        else:
            raise unsupported(f"{where}.type", f"{ascii(kind)[:60]} items are not supported (message, "
                               "function_call, function_call_output and reasoning are)")
        if m["role"] == "assistant":
            m.setdefault("tool_calls", [])
            m["_open"] = True  # later function_call items join it
            if thought is not None:
                m["reasoning_content"] = thought
        thought = None  # reasoning belongs to the assistant turn right after it (none: dropped)
        out.append(m)
    for m in out:  # the assistant turns without calls carry none
        if not m.pop("_open", False) or m["tool_calls"]:
            continue
        del m["tool_calls"]
    return out


_ITEM_KEYS = {"message": {"type", "role", "content", "id", "status", "phase"},
              "function_call": {"type", "id", "call_id", "name", "arguments", "status"},
              "function_call_output": {"type", "id", "call_id", "output", "status"},
              "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"}}
_PART_KEYS = {"type", "text", "annotations", "logprobs", "refusal"}


def _known(obj: dict, keys: set[str], where: str) -> None:
    """A key this API does not define, set to something: refused (null is an SDK's dump of an unset field)."""
    extra = sorted(k for k, v in obj.items() if k not in keys and v is not None)
    if extra:
        raise unsupported(f"{where}.{extra[0]}", "not supported here")


def _str(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad(f"{where}.{key}", "must be a string")
    return value


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad(f"{where}.role", f"one of user, assistant, system, developer; got {ascii(role)[:40]}")
    kinds = ("output_text", "refusal") if role == "assistant" else ("input_text",)
    return {"role": role, "content": _text(item.get("content"), f"{where}.content", kinds)}


def _text(content, where: str, kinds: tuple[str, ...]) -> str | list[dict]:
    """A string, or a list of text parts (chat's text parts; other kinds refused by name)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise unsupported(f"{at}.type", f"{kind} is not supported: this server takes text only")
        if kind not in kinds:
            raise bad(f"{at}.type", f"one of {', '.join(kinds)} here; got {ascii(kind)[:40]}")
        _known(part, _PART_KEYS, at)
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise bad(f"{at}.text", "must be a string")
        parts.append({"type": "text", "text": text})
    return parts


def _reasoning_text(item: dict, where: str) -> str | None:
    """An earlier turn's reasoning: its reasoning_text content, else its summary's text."""
    if item.get("encrypted_content") is not None:
        raise unsupported(f"{where}.encrypted_content", "this server cannot read encrypted reasoning (its own "
                           "reasoning items carry their text in content); leave encrypted_content out")
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list) or not all(isinstance(p, dict) and p.get("type") == kind
                                                  and isinstance(p.get("text"), str) for p in parts):
            raise bad(f"{where}.{key}", f"must be a list of {kind} parts")
        if parts:
            return "".join(p["text"] for p in parts)
    return None
