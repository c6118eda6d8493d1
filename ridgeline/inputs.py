"""User input checks shared by the server and the offline API.

Text must be valid Unicode: a lone surrogate ("\\ud800", which JSON can escape and Python strings
can hold) cannot be encoded as UTF-8, so it would fail later in the tokenizer, a log file or a
response body. `find_bad_text` walks a whole parsed JSON value (keys too) without recursion.
Chat messages take the server's shapes: content is a string, a list of text parts, or null.
"""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError

CHAT_ROLES = ("system", "user", "assistant", "developer")  # developer: OpenAI's newer name for system
_SCALARS = frozenset({int, float, bool, type(None)})


def _bad_at(text: str) -> int | None:
    """Index of the first character UTF-8 cannot encode (a lone surrogate), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def shown(text: str, limit: int = 64) -> str:
    """text safe to put in a message, a log line or a JSON body: escapes surrogates and newlines."""
    out = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\n", "\\n").replace("\r", "\\r")
    return out if len(out) <= limit else out[: limit - 3] + "..."


def find_bad_text(value, path: str = "") -> tuple[str, str, int] | None:
    """(path like 'messages.0.content', the bad string, index) of the first string or key in a
    JSON-like value that is not valid Unicode, or None."""
    stack = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if (i := _bad_at(v)) is not None:
                return where, v, i
        elif isinstance(v, dict):
            for k, x in reversed(v.items()):
                key = str(k)
                inner = f"{where}.{shown(key)}" if where else shown(key)
                if (i := _bad_at(key)) is not None:
                    return inner, key, i
                stack.append((inner, x))
        elif isinstance(v, (list, tuple)) and not set(map(type, v)) <= _SCALARS:
            stack.extend((f"{where}.{i}" if where else str(i), x) for i, x in reversed(list(enumerate(v))))
    return None


def check_text(value, param: str) -> None:
    """Raise InvalidRequestError naming where value (a string or any JSON-like value) is not
    valid Unicode text."""
    bad = find_bad_text(value, param)
    if bad is not None:
        where, text, i = bad
        raise InvalidRequestError(
            f"{where or 'the request body'}: contains a lone surrogate (U+{ord(text[i]):04X}) at character {i}; "
            "text must be valid Unicode (send UTF-8)", param=where.split(".")[0] or None)


def template_message(role: str, content: str | list | None) -> dict:
    """What a chat template sees for one message: text parts joined by newlines."""
    if not isinstance(content, str):
        content = "\n".join(p["text"] if isinstance(p, dict) else p.text for p in content or [])
    return {"role": "system" if role == "developer" else role, "content": content}


def chat_messages(messages, param: str = "messages") -> list[dict]:
    """Validate one conversation as the server validates its `messages` -> template input."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError(f"{param}: must be a non-empty list of messages", param=param)
    out = []
    for i, m in enumerate(messages):
        where = f"{param}.{i}"
        if not isinstance(m, dict):
            raise InvalidRequestError(f"{where}: must be a dict with role and content", param=param)
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise InvalidRequestError(f"{where}.role: must be one of {', '.join(CHAT_ROLES)}", param=param)
        if not (content is None or isinstance(content, str) or (isinstance(content, (list, tuple)) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content))):
            raise InvalidRequestError(f"{where}.content: must be a string or a list of "
                                      '{"type": "text", "text": ...} parts', param=param)
        check_text(content, f"{where}.content")
        out.append(template_message(role, content))
    return out


def _is_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and all(type(t) is int for t in value)


def prompt_list(prompts, param: str = "prompts") -> list[str | list[int]]:
    """A string, token ids, or a list of either (the offline API's `prompts`, a completion body's
    `prompt`) -> a list of prompts; anything else is an InvalidRequestError naming the offending prompt."""
    if isinstance(prompts, str):
        check_text(prompts, param)
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidRequestError(f"{param}: must be a string, a list of token ids or a list of either, not "
                                  f"{type(prompts).__name__}", param)
    if prompts and _is_ids(prompts):
        return [list(prompts)]
    for i, p in enumerate(prompts):
        if not (isinstance(p, str) or (_is_ids(p) and p)):
            raise InvalidRequestError(f"{param}.{i}: must be a string or a non-empty list of integer token ids, "
                                      f"not {type(p).__name__}", param)
        check_text(p, f"{param}.{i}")
    return [p if isinstance(p, str) else list(p) for p in prompts]
