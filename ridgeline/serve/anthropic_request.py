"""Anthropic's Messages body, validated strictly, and its translation into a ChatCompletionRequest.

Every field Anthropic's client can send is honoured, accepted with no effect (ACCEPTED: why), or a 400
naming it; an unknown field is a 400 too, as Anthropic's own API answers. Content blocks are checked
one by one (unknown keys in a block are a 400 naming the block). The mapping onto chat:

- system (a string or text blocks) -> a first system message;
- a user turn's tool_result blocks -> one role tool message each (tool_call_id = tool_use_id; is_error
  prefixes the text with ERROR_PREFIX, templates having no error flag), its text blocks -> a user message,
  in the order they come;
- an assistant turn's text -> content, tool_use -> tool_calls (arguments = json.dumps(input)), thinking ->
  reasoning_content;
- tools -> function tools (input_schema -> parameters, strict kept); tool_choice auto|any|tool|none ->
  auto|required|named|none, disable_parallel_tool_use -> parallel_tool_calls false;
- stop_sequences -> stop; output_config.format -> response_format json_schema; output_config.effort ->
  reasoning_effort; thinking -> the reasoning budget and template variable (thinking_plan).

CHAT_PARAMS renames chat's field names in its 400s back to this API's."""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ridgeline.errors import InvalidRequestError
from ridgeline.http.errors import from_validation
from ridgeline.serve.protocol import RequestBody

ERROR_PREFIX = "Error: "  # a tool_result with is_error true reaches the template as this + its text
MAX_TEMPERATURE = 1.0  # Anthropic's range is [0, 1]

# fields with no effect on the output by their definition
ACCEPTED = {
    "metadata": "tags the request (user_id); nothing is stored",
    "cache_control": "Ridgeline's prefix cache matches prompts by content, automatically",
    "service_tier": "one tier: every request is served alike",
    "inference_geo": "the server runs where it runs",
    "speed": "the server runs at one speed",
    "user_profile_id": "an id for attribution",
    "workspace_id": "an id for attribution",
}
# features Ridgeline does not have: refused when set
REFUSED = {
    "container": "code execution containers",
    "diagnostics": "cache diagnostics",
    "mcp_servers": "MCP servers",
    "context_management": "context management",
}
# chat's field names in its errors -> this API's
CHAT_PARAMS = {"stop": "stop_sequences", "response_format": "output_config.format",
               "thinking_token_budget": "thinking.budget_tokens", "reasoning_effort": "output_config.effort",
               "chat_template_kwargs": "thinking", "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
               "max_completion_tokens": "max_tokens"}
REFUSED_BLOCKS = ("image", "document", "search_result", "redacted_thinking", "server_tool_use",
                  "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
                  "container_upload", "mcp_tool_use", "mcp_tool_result")


class _Block(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    cache_control: dict[str, Any] | None = None  # accepted, no effect (ACCEPTED)


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool = False


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Ridgeline's own are empty: there is nothing to verify


class Tool(_Block):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None
    eager_input_streaming: bool | None = None  # accepted: a constrained call streams in pieces either way
    defer_loading: bool | None = None
    input_examples: list[Any] | None = None
    allowed_callers: list[Any] | None = None


class ToolChoice(_Block):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Block):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputConfig(_Block):
    format: dict[str, Any] | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class Message(_Block):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(RequestBody):
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None  # required on /v1/messages, not on count_tokens
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None

    def check_fields(self) -> None:
        """Unknown and refused fields are 400s naming them."""
        for name, value in (self.model_extra or {}).items():
            if name in REFUSED:
                if value is not None:
                    raise InvalidRequestError(f"{name}: {REFUSED[name]} are not supported", name,
                                              code="unsupported_parameter")
                continue
            raise InvalidRequestError(f"{name}: not a field of the Messages API (or not supported here)", name)


def _parse(model: type[BaseModel], data: Any, where: str) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = from_validation(e.errors())
        raise InvalidRequestError(f"{where}.{err.message}" if err.param else f"{where}: {err.message}",
                                  where.split(".")[0]) from None


def _block(data: Any, where: str, allowed: dict[str, type[BaseModel]]) -> BaseModel:
    kind = data.get("type") if isinstance(data, dict) else None
    if kind in REFUSED_BLOCKS:
        raise InvalidRequestError(f"{where}: {kind} blocks are not supported", where.split(".")[0],
                                  code="unsupported_parameter")
    if kind not in allowed:
        raise InvalidRequestError(f"{where}.type: one of {', '.join(allowed)} here, got {kind!r}"[:300],
                                  where.split(".")[0])
    return _parse(allowed[kind], data, where)


def _text(data: Any, where: str, allowed: dict[str, type[BaseModel]]) -> BaseModel:
    """_block, and a text block's citations refused (they would be dropped from what the model reads)."""
    b = _block(data, where, allowed)
    if isinstance(b, TextBlock) and b.citations:
        raise InvalidRequestError(f"{where}.citations: citations are not supported", where.split(".")[0],
                                  code="unsupported_parameter")
    return b


def _text_of(blocks: list[dict], where: str) -> str:
    return "\n".join(_text(b, f"{where}.{j}", {"text": TextBlock}).text for j, b in enumerate(blocks))


def _user(m: Message, where: str) -> list[dict]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    out: list[dict] = []
    texts: list[str] = []
    for j, raw in enumerate(m.content):
        b = _text(raw, f"{where}.content.{j}", {"text": TextBlock, "tool_result": ToolResultBlock})
        if isinstance(b, TextBlock):
            texts.append(b.text)
            continue
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        content = b.content if isinstance(b.content, str) else _text_of(b.content or [], f"{where}.content.{j}.content")
        out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                    "content": ERROR_PREFIX + content if b.is_error else content})
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(m: Message, where: str) -> dict:
    if isinstance(m.content, str):
        return {"role": "assistant", "content": m.content}
    texts, calls, thoughts = [], [], []
    for j, raw in enumerate(m.content):
        b = _text(raw, f"{where}.content.{j}", {"text": TextBlock, "tool_use": ToolUseBlock,
                                                  "thinking": ThinkingBlock})
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ThinkingBlock):
            thoughts.append(b.thinking)
        else:
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name,
                                                                       "arguments": json.dumps(b.input)}})
    out: dict = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if thoughts:
        out["reasoning_content"] = "\n".join(thoughts)
    return out


def chat_messages(body: MessagesRequest) -> list[dict]:
    out: list[dict] = []
    if body.system is not None:
        blocks = [] if isinstance(body.system, str) else body.system
        if any(b.citations for b in blocks):
            raise InvalidRequestError("system: citations are not supported", "system", code="unsupported_parameter")
        text = body.system if isinstance(body.system, str) else "\n".join(b.text for b in blocks)
        out.append({"role": "system", "content": text})
    for i, m in enumerate(body.messages):
        where = f"messages.{i}"
        out += _user(m, where) if m.role == "user" else [_assistant(m, where)]
    if body.messages[-1].role == "assistant":
        raise InvalidRequestError("messages: a last assistant message (a prefill to continue) is not supported; "
                                  "end with a user message", "messages", code="unsupported_parameter")
    return out


def chat_tools(body: MessagesRequest) -> list[dict] | None:
    if body.tools is None:
        return None
    out = []
    for i, raw in enumerate(body.tools):
        where = f"tools.{i}"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind not in (None, "custom"):
            raise InvalidRequestError(f"{where}: {kind!r}: server tools are not supported; give client tools "
                                      "(name, description, input_schema)"[:300], "tools",
                                      code="unsupported_parameter")
        t = _parse(Tool, raw, where)
        for name in ("defer_loading", "input_examples", "allowed_callers"):
            if getattr(t, name) not in (None, False):
                raise InvalidRequestError(f"{where}.{name}: not supported; leave it unset", "tools",
                                          code="unsupported_parameter")
        fn: dict = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            fn["description"] = t.description
        if t.strict is not None:
            fn["strict"] = t.strict
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: ToolChoice | None) -> tuple[Any, bool | None]:
    """(tool_choice, parallel_tool_calls) in chat's terms."""
    if choice is None:
        return None, None
    if (choice.type == "tool") != (choice.name is not None):
        raise InvalidRequestError("tool_choice.name: required with type tool, and only there", "tool_choice")
    if choice.type == "none" and choice.disable_parallel_tool_use is not None:
        raise InvalidRequestError("tool_choice.disable_parallel_tool_use: not with type none", "tool_choice")
    named = {"type": "function", "function": {"name": choice.name}}
    mapped = {"auto": "auto", "any": "required", "none": "none", "tool": named}[choice.type]
    return mapped, (False if choice.disable_parallel_tool_use else None)


def chat_body(body: MessagesRequest, thinking: dict) -> dict:
    """The ChatCompletionRequest's fields (thinking: thinking_plan's)."""
    for name, value, top in (("temperature", body.temperature, MAX_TEMPERATURE), ("top_p", body.top_p, 1.0)):
        if value is not None and not 0 <= value <= top:
            raise InvalidRequestError(f"{name}: must be in [0, {top:g}], got {value}", name)
    tool_choice, parallel = chat_tool_choice(body.tool_choice)
    out: dict = {"model": body.model, "messages": chat_messages(body), "max_tokens": body.max_tokens,
                 "stream": body.stream, "tools": chat_tools(body), "tool_choice": tool_choice,
                 "parallel_tool_calls": parallel, "stop": body.stop_sequences, "temperature": body.temperature,
                 "top_p": body.top_p, "top_k": body.top_k, **thinking}
    config = body.output_config
    if config is not None and config.format is not None:
        fmt = config.format
        if fmt.get("type") != "json_schema" or set(fmt) - {"type", "schema"} or not isinstance(fmt.get("schema"),
                                                                                              dict):
            raise InvalidRequestError("output_config.format: must be {type: json_schema, schema: {...}}",
                                      "output_config")
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    if config is not None and config.effort is not None:
        if config.effort in ("xhigh", "max"):
            raise InvalidRequestError(f"output_config.effort: {config.effort} is not supported (low, medium, high)",
                                      "output_config", code="unsupported_parameter")
        out["reasoning_effort"] = config.effort
    return {k: v for k, v in out.items() if v is not None}


def thinking_plan(thinking: Thinking | None, max_tokens: int | None, has_reasoning: bool,
                  reads_enable_thinking: bool) -> dict:
    """thinking -> chat fields. enabled: the reasoning budget (budget_tokens, under max_tokens); enabled or
    adaptive: enable_thinking true where the template reads it; disabled: enable_thinking false where the
    template reads it, else a budget of 0 where the model has a reasoning section (the section closes at
    once), else nothing (the model does not think); display omitted: the reasoning is left out of the reply.
    Absent: the model's own default."""
    if thinking is None:
        return {}
    if thinking.type == "between_tools":
        raise InvalidRequestError("thinking.type: between_tools is not supported (enabled, adaptive, disabled)",
                                  "thinking", code="unsupported_parameter")
    if (thinking.type == "enabled") != (thinking.budget_tokens is not None):
        raise InvalidRequestError("thinking.budget_tokens: required with type enabled, and only there", "thinking")
    out: dict = {}
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget < 1 or (max_tokens is not None and budget >= max_tokens):
            raise InvalidRequestError(f"thinking.budget_tokens: must be >= 1 and less than max_tokens, got {budget}",
                                      "thinking")
        out["thinking_token_budget"] = budget
    if reads_enable_thinking:
        out["chat_template_kwargs"] = {"enable_thinking": thinking.type != "disabled"}
    elif thinking.type == "disabled" and has_reasoning:
        out["thinking_token_budget"] = 0
    if thinking.display == "omitted":
        out["include_reasoning"] = False
    return out
