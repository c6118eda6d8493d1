"""A chat request's tools, tool_choice and parallel_tool_calls checked (each mistake a 400 naming its
field), and its tool history made into template input: assistant `tool_calls` with their arguments
as objects (as templates expect), `tool` messages tied to an earlier call. For the generic format
the server writes the history itself: the tools in a system message, calls in the generic format,
results as user messages."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import llguidance as llg

from ridgeline.errors import InvalidRequestError
from ridgeline.tool_calls.formats import GENERIC, system_prompt

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 128


def _bad(field: str, message: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"{field}: {message}", param=field.split("[")[0].split(".")[0], code=code)


@dataclass(frozen=True)
class ToolChoice:
    tools: tuple[dict, ...]  # [{"type": "function", "function": {name, description, parameters}}]
    mode: str  # "none" | "auto" | "required" | "named"
    name: str | None  # the named function
    parallel: bool
    strict: bool = False  # a tool asked for `strict`: its calls must follow its schema (constrained, or refused)

    @property
    def schemas(self) -> dict[str, dict]:
        return {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}

    @property
    def callable(self) -> dict[str, dict]:
        """The tools a reply may call: all, or the named one."""
        s = self.schemas
        return {self.name: s[self.name]} if self.mode == "named" else s


def _refs(schema, where: str) -> None:
    """Refuse a remote $ref anywhere in a schema (only '#...' references are resolved, never fetched)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
                raise _bad(where, f"$ref {ascii(ref)[:80]} is not a local reference; remote schemas are never "
                                  "fetched", code="unsupported_parameter")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _schema(value, where: str) -> dict:
    if value is None:
        return {"type": "object", "properties": {}}
    if not isinstance(value, dict):
        raise _bad(where, f"must be a JSON schema object, got {type(value).__name__}")
    _refs(value, where)
    try:
        error = llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_json_schema(json.dumps(value)), None)
    except (ValueError, TypeError, RecursionError) as e:
        error = str(e) or type(e).__name__
    if error:
        raise _bad(where, f"cannot be enforced: {' '.join(str(error).split())[:300]}", code="unsupported_parameter")
    return value


def _tool(t, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
        raise _bad(where, 'must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
    f = t["function"]
    extra = sorted(set(f) - {"name", "description", "parameters", "strict"})
    if extra:
        raise _bad(f"{where}.function", f"unknown key(s) {', '.join(extra)}")
    if not isinstance(f.get("name"), str) or not NAME.match(f["name"]):
        raise _bad(f"{where}.function.name", "must be 1 to 64 letters, digits, _ . or -")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise _bad(f"{where}.function.description", "must be a string")
    if f.get("strict") not in (None, True, False):
        raise _bad(f"{where}.function.strict", "must be true or false")
    out = {"name": f["name"], "parameters": _schema(f.get("parameters"), f"{where}.function.parameters")}
    if f.get("description"):
        out["description"] = f["description"]
    return {"type": "function", "function": out}


def tool_choice(tools, choice, parallel) -> ToolChoice | None:
    """None: no tools given and none asked for."""
    if parallel not in (None, True, False):
        raise _bad("parallel_tool_calls", "must be true or false")
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "must be a list of tools")
    tools = tools or []
    if len(tools) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools, got {len(tools)}")
    checked = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise _bad("tools", f"two tools are named {dup!r}")
    name = None
    if isinstance(choice, dict):
        f = choice.get("function")
        if choice.get("type") != "function" or not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise _bad("tool_choice", 'must be "none", "auto", "required" or {"type": "function", "function": '
                                      '{"name": ...}}')
        name, mode = f["name"], "named"
        if name not in names:
            raise _bad("tool_choice", f"names {ascii(name)[:70]}, which is not in tools")
    elif choice in (None, "none", "auto", "required"):
        mode = choice or ("auto" if checked else "none")
    else:
        raise _bad("tool_choice", f'must be "none", "auto", "required" or a named function, got {ascii(choice)[:40]}')
    if mode == "required" and not checked:
        raise _bad("tool_choice", '"required" needs tools')
    if not checked:
        return None
    strict = any(t["function"].get("strict") is True for t in tools)
    return ToolChoice(tuple(checked), mode, name, parallel is not False, strict)


def _calls(m: dict, where: str) -> list[dict]:
    calls = m.get("tool_calls") or []
    if m.get("role") != "assistant" and calls:
        raise _bad(f"{where}.tool_calls", "only assistant messages carry tool calls")
    out = []
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(c.get("id"), str) or c.get("type", "function") != "function":
            raise _bad(w, 'must be {"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}')
        if not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
            raise _bad(f"{w}.function", "needs a name and arguments (a JSON string)")
        try:
            args = json.loads(f["arguments"])
        except (ValueError, RecursionError):
            raise _bad(f"{w}.function.arguments", "is not valid JSON") from None
        if not isinstance(args, dict):
            raise _bad(f"{w}.function.arguments", "must be a JSON object")
        out.append({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def template_messages(messages: list[dict], raw: list[dict]) -> list[dict]:
    """messages: the template input of each message (role, content); raw: the request's messages
    (their tool_calls and tool_call_id). Checks each tool message answers an earlier call, and names the
    function it answers (`name`, for templates that address a result to its function: GPT-OSS's)."""
    out, ids = [], {}
    for i, (m, r) in enumerate(zip(messages, raw)):
        where = f"messages[{i}]"
        calls = _calls(r, where)
        ids.update((c["id"], c["function"]["name"]) for c in calls)
        m = {**m, "tool_calls": calls} if calls else dict(m)
        if m["role"] == "tool":
            tid = r.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise _bad(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
            if tid not in ids:
                raise _bad(f"{where}.tool_call_id", f"{ascii(tid)[:70]} matches no earlier assistant tool call")
            m["tool_call_id"] = tid
            # the called function's name (checked for special-token text with the call), never a client's `name`:
            # templates render it outside the contents
            m["name"] = ids[tid]
        elif r.get("tool_call_id") is not None:
            raise _bad(f"{where}.tool_call_id", "only tool messages carry tool_call_id")
        out.append(m)
    return out


def generic_messages(messages: list[dict], tools: ToolChoice | None) -> list[dict]:
    """The conversation for a template without tools: the tools described in the system message,
    calls written in the generic format, results as user messages."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            text = "\n".join(GENERIC.call_text(c["function"]["name"], c["function"]["arguments"])
                             for c in m["tool_calls"])
            out.append({"role": "assistant", "content": "\n".join(p for p in (m.get("content"), text) if p)})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m.get("content")})
    if tools is not None and tools.mode != "none":
        prompt = system_prompt(list(tools.tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content'] or ''}\n\n{prompt}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
