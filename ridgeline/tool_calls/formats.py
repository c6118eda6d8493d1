"""One description per call-format family: the markers around a call, how the call's body is
written (JSON objects, a JSON list of them, or Qwen3-Coder's XML), and the key that holds the
arguments. The parser reads calls from it and the grammar writes them from it, so the two cannot
disagree. GENERIC is for templates that render no tools: the server describes the tools and this
format in a system message it adds (system_prompt)."""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class CallFormat:
    name: str
    start: str  # the marker that opens a block of calls
    end: str | None  # the marker that closes it; None: the block runs to the end of the reply
    body: str = "json"  # "json": JSON objects (or lists of them), one after another; "xml": <function=...>
    args_key: str = "arguments"  # the key of a JSON call that holds its arguments
    also_starts: tuple[str, ...] = ()  # other markers that open a block (Llama's <|python_tag|>)
    leading_json: bool = False  # a reply that begins with "{" is a block (Llama 3.x JSON calls)
    listed: bool = False  # the constrained writer puts the calls in one JSON list: [call, call]
    call_sep: str = "\n"  # between two calls the constrained writer emits
    constrainable: bool = True  # tool_choice required / named can be enforced by grammar
    opener: str | None = None  # what the writer puts before its calls (None: start)

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(m for m in (self.start, self.end, *self.also_starts) if m)

    def call_text(self, name: str, arguments: dict) -> str:
        """One call as this format writes it (for tests and the generic format's history)."""
        args = json.dumps(arguments, ensure_ascii=False)
        if self.body == "harmony":
            return f"{self.start}commentary to=functions.{name} <|constrain|>json<|message|>{args}{self.end}"
        if self.body == "xml":
            params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                             for k, v in arguments.items())
            return f"{self.start}\n<function={name}>\n{params}</function>\n{self.end}"
        call = f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{self.args_key}": {args}}}'
        if self.listed:
            return f"{self.writes}[{call}]{self.end or ''}"
        return f"{self.writes}\n{call}\n{self.end}" if self.end else f"{self.writes}{call}"

    @property
    def writes(self) -> str:
        return self.start if self.opener is None else self.opener


LEADING_SPACE = " \t\r\n"  # what may come before a leading_json reply's "{" (the auto grammar admits the same)

HERMES = CallFormat("hermes", "<tool_call>", "</tool_call>")
QWEN3_CODER = CallFormat("qwen3_coder", "<tool_call>", "</tool_call>", body="xml")
LLAMA3_JSON = CallFormat("llama3_json", "<|python_tag|>", None, args_key="parameters", leading_json=True,
                         call_sep="; ", opener="")
MISTRAL = CallFormat("mistral", "[TOOL_CALLS]", None, listed=True, call_sep=", ")
PHI4_MINI = CallFormat("phi4_mini", "<|tool_call|>", "<|/tool_call|>", listed=True, call_sep=", ")
GENERIC = CallFormat("generic", "<tool_call>", "</tool_call>")
# GPT-OSS: a call is a commentary message addressed to the function, its body the arguments, ended by <|call|>:
# <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>. The harmony splitter
# (reasoning.py) reads the channels and hands each call to the parser (ToolCallParser.take); required and
# named are constrained (harmony_grammar.py), auto is not (the channel marker opens every message).
HARMONY_CALLS = CallFormat("harmony", "<|channel|>", "<|call|>", body="harmony")
FORMATS = {f.name: f for f in (HERMES, QWEN3_CODER, LLAMA3_JSON, MISTRAL, PHI4_MINI, HARMONY_CALLS, GENERIC)}


def system_prompt(tools: list[dict]) -> str:
    """The generic format's system message: the tools and how to call them."""
    defs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You can call these tools (JSON Schema for each one's arguments):\n"
            f"<tools>\n{defs}\n</tools>\n"
            "To call one, write a JSON object with its name and arguments between <tool_call> and </tool_call>, "
            'for example:\n<tool_call>\n{"name": "tool_name", "arguments": {"arg": "value"}}\n</tool_call>\n'
            "Each result comes back in a message between <tool_response> and </tool_response>.")
