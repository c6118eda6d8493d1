"""A Responses API body (POST /v1/responses) checked in its own words and translated into the chat
request it runs as (serve/chat_run.py). The server keeps no state: everything a turn needs comes in
its `input`, and a field that points at stored state is a 400 saying so. Every field is honoured,
accepted with no effect (the docs page's table says why), or refused naming it; errors the chat
checks raise later are renamed back to this API's fields (renamed)."""
from __future__ import annotations

import re
from typing import Any, Literal

from ridgeline.errors import RidgelineError
from ridgeline.serve.protocol import RequestBody
from ridgeline.serve.responses_input import NO_STATE, bad as _bad, messages, unsupported as _unsupported

_BUILT_IN = "a built-in tool this server does not have; only function tools are supported"
_INCLUDE_OK = ("reasoning.encrypted_content",)  # nothing is encrypted: the reasoning item's content carries it
_MAX_METADATA = 16
# the chat route's sampling extensions, taken here too under the same names (chat checks them)
EXTENSIONS = ("seed", "stop", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
              "logit_bias", "min_tokens", "stop_token_ids", "ignore_eos", "cache_salt")


class ResponsesRequest(RequestBody):
    """The fields of OpenAI's Responses create call. Types are strict; the shapes inside input, tools,
    text and reasoning are checked by hand so a 400 names the path (input[2].content[0].type)."""
    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    background: bool | None = None
    # refused when set: they need state or features this server does not have
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: Any = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    background_options: Any = None
    prompt_cache_options: Any = None
    # Ridgeline's extensions (EXTENSIONS), as on chat
    seed: Any = None
    stop: Any = None
    top_k: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    min_tokens: Any = None
    stop_token_ids: Any = None
    ignore_eos: Any = None
    cache_salt: Any = None

    def check(self) -> None:
        """Refuse what this server cannot do, naming the field."""
        for name in ("previous_response_id", "conversation"):
            if getattr(self, name) is not None:
                raise _unsupported(name, NO_STATE)
        for name in ("prompt", "max_tool_calls", "context_management", "moderation", "image", "access_programs",
                     "background_options", "prompt_cache_options"):
            if getattr(self, name) is not None:
                raise _unsupported(name, "not supported by this server; leave it unset")
        if self.background:
            raise _unsupported("background", "background responses need stored state; " + NO_STATE)
        if self.top_logprobs:
            raise _unsupported("top_logprobs", "log probabilities are not supported on this route yet")
        for i, name in enumerate(self.include or ()):
            if name not in _INCLUDE_OK:
                raise _unsupported(f"include[{i}]", f"{ascii(name)[:60]} is not supported (only "
                                   f"{', '.join(_INCLUDE_OK)})")
        if self.service_tier not in (None, "auto", "default"):
            raise _unsupported("service_tier", "service tiers are not supported (auto or default only)")
        if self.stream_options is not None:
            if not self.stream:
                raise _bad("stream_options", "only allowed when stream is true")
            extra = sorted(set(self.stream_options) - {"include_obfuscation"})
            if extra:
                raise _unsupported(f"stream_options.{extra[0]}", "not supported")
        if self.metadata is not None and len(self.metadata) > _MAX_METADATA:
            raise _bad("metadata", f"at most {_MAX_METADATA} keys")

    def chat_body(self) -> dict:
        """The chat completion request this runs as (validated by ChatCompletionRequest afterwards)."""
        self.check()
        body: dict[str, Any] = {"model": self.model, "messages": messages(self.input, self.instructions)}
        for ours, theirs in (("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                             ("top_p", "top_p"), ("user", "user"), ("parallel_tool_calls", "parallel_tool_calls")):
            if getattr(self, ours) is not None:
                body[theirs] = getattr(self, ours)
        body.update({k: getattr(self, k) for k in EXTENSIONS if getattr(self, k) is not None})
        if self.tools is not None:
            body["tools"] = [_tool(t, i) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = _tool_choice(self.tool_choice)
        fmt = text_format(self.text)
        if fmt is not None:
            body["response_format"] = fmt
        effort = reasoning_effort(self.reasoning)
        if effort is not None:
            body["reasoning_effort"] = effort
        return body


def _tool(t, i: int) -> dict:
    """A Responses function tool (flat: name at the top) as chat's nested one."""
    where = f"tools[{i}]"
    kind = t.get("type") if isinstance(t, dict) else None
    if kind != "function":
        if kind is None:
            raise _bad(where, "must be an object with a type")
        raise _unsupported(f"{where}.type", f"{ascii(kind)[:40]} is {_BUILT_IN}")
    extra = sorted(set(t) - {"type", "name", "description", "parameters", "strict"})
    if extra:
        raise _unsupported(f"{where}.{extra[0]}", "not supported on a function tool")
    return {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict")
                                             if t.get(k) is not None}}


def _tool_choice(choice) -> str | dict:
    if isinstance(choice, str):
        return choice  # auto, none, required: chat checks the value
    kind = choice.get("type")
    if kind != "function":
        raise _unsupported("tool_choice.type", f"{ascii(kind)[:40]}: only a function can be named")
    extra = sorted(set(choice) - {"type", "name"})
    if extra:
        raise _unsupported(f"tool_choice.{extra[0]}", "not supported")
    if not isinstance(choice.get("name"), str):
        raise _bad("tool_choice.name", "must be a string: the function to call")
    return {"type": "function", "function": {"name": choice["name"]}}


def text_format(text: dict | None) -> dict | None:
    """text.format as chat's response_format (None: plain text)."""
    if text is None:
        return None
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise _unsupported(f"text.{extra[0]}", "not supported")
    if text.get("verbosity") not in (None, "medium"):
        raise _unsupported("text.verbosity", "output verbosity is not supported (medium only)")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    raise _bad("text.format.type", f"one of text, json_schema, json_object; got {ascii(kind)[:40]}")


def reasoning_effort(reasoning: dict | None) -> str | None:
    """reasoning.effort, the template's reasoning_effort. summary is accepted: no summaries are written (the
    reasoning item's summary is empty; its content carries the whole text)."""
    if reasoning is None:
        return None
    extra = sorted(set(reasoning) - {"effort", "summary", "generate_summary"})
    if extra:
        raise _unsupported(f"reasoning.{extra[0]}", "not supported")
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) not in (None, "auto", "concise", "detailed"):
            raise _bad(f"reasoning.{key}", "one of auto, concise, detailed")
    return reasoning.get("effort")


# chat's field names as this API's: (chat param prefix, ours), first match wins
_RENAMES = (("messages", "input"), ("max_completion_tokens", "max_output_tokens"), ("response_format", "text.format"),
            ("reasoning_effort", "reasoning.effort"), ("prompt", "input"))


def renamed(e: RidgelineError) -> RidgelineError:
    """An error the chat checks raised, in this API's field names (response_format -> text.format,
    tools[0].function.parameters -> tools[0].parameters, ...). A message's path into chat's messages
    is chat's (its indexes count the instructions and merged calls): the param says input."""
    message = re.sub(r"(tools\[\d+\])\.function\b", r"\1", e.message)
    for theirs, ours in _RENAMES:
        if e.param and e.param.startswith(theirs):
            e.param = ours if theirs in ("messages", "prompt") else ours + e.param[len(theirs):]
            message = re.sub(rf"\b{theirs}\b", ours, message)
            break
    e.message = message
    e.args = (message,)
    return e
