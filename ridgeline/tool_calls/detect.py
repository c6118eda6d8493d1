"""Which call format a chat template uses: render a probe conversation with and without tools, with
one and with two assistant calls, take what the first call added (the diff against the same turn
without it) and match it against the known families. A template that renders neither the tools nor
the calls, or renders them in no known way, gets the generic format (described in a system message
the server adds, its history written by the server)."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError
from ridgeline.weights.chat_template import TemplateFailure
from ridgeline.tool_calls.formats import FORMATS, GENERIC, CallFormat

PROBE, PROBE_TWO = "ridgeline_probe", "ridgeline_probe_two"
# the families, first match wins: a pattern over the text the template writes for one call
SIGNATURES: tuple[tuple[str, re.Pattern], ...] = (
    ("qwen3_coder", re.compile(rf"<function={PROBE}>")),
    ("hermes", re.compile(r"<tool_call>\s*\{")),
    ("mistral", re.compile(r"\[TOOL_CALLS\]")),
    ("phi4_mini", re.compile(r"<\|tool_call\|>")),
    ("llama3_json", re.compile(rf'<\|python_tag\|>|\{{"name":\s*"{PROBE}",\s*"parameters"')),
    ("harmony", re.compile(rf"to=functions\.{PROBE}\b")),
)
# render(messages, tools or None) -> the template's text (no generation prompt); raises on failure
Render = Callable[[list[dict], "list[dict] | None"], str]


@dataclass(frozen=True)
class Detected:
    format: CallFormat
    template_tools: bool  # the template renders tools, calls and tool results itself
    parallel: bool  # the template renders two calls in one message

    @property
    def generic(self) -> bool:
        return not self.template_tools


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": "A probe.", "parameters": {
        "type": "object", "properties": {"probe_arg": {"type": "string"}}, "required": ["probe_arg"]}}}


def _call(name: str, i: int) -> dict:
    return {"id": f"call_probe{i}", "type": "function",
            "function": {"name": name, "arguments": {"probe_arg": "probe_value"}}}


def _added(longer: str, shorter: str, context: int = 16) -> str:
    """What longer has that shorter lacks: longer without their common start and end, widened by
    context characters each side (a marker the two share a piece of stays whole)."""
    a = 0
    while a < min(len(longer), len(shorter)) and longer[a] == shorter[a]:
        a += 1
    b = 0
    while b < min(len(longer), len(shorter)) - a and longer[-1 - b] == shorter[-1 - b]:
        b += 1
    return longer[max(0, a - context):len(longer) - max(0, b - context)]


def detect(render: Render) -> Detected:
    user = {"role": "user", "content": "Probe question?"}
    tools = [_tool(PROBE), _tool(PROBE_TWO)]

    def turn(calls: list[dict]) -> list[dict]:
        return [user, {"role": "assistant", "content": "", "tool_calls": calls}]

    try:
        plain = render([user], None)
        with_tools = render([user], tools)
        none = render(turn([]), tools)
        one = render(turn([_call(PROBE, 0)]), tools)
        two = render(turn([_call(PROBE, 0), _call(PROBE_TWO, 1)]), tools)
    except (InvalidRequestError, TemplateFailure, ValueError):
        return Detected(GENERIC, False, True)
    region = _added(one, none)
    if with_tools == plain or PROBE not in region:
        return Detected(GENERIC, False, True)
    for name, pattern in SIGNATURES:
        if pattern.search(region):
            return Detected(FORMATS[name], True, PROBE_TWO in _added(two, one))
    return Detected(GENERIC, False, True)
