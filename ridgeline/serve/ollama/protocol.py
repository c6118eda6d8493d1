"""ollama's request bodies, validated strictly (a wrong JSON type is a 400 naming the field). A top-level
field ollama's API does not have is refused, as is an unknown key in a message or a tool call: the
client library sends none, and a field dropped silently could change the output."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ridgeline.errors import InvalidRequestError
from ridgeline.serve.protocol import BodyError, RequestBody

KeepAlive = int | float | str | None  # a duration ("5m"), seconds, or -1: accepted, no effect (one model, loaded)


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Body(RequestBody):
    @model_validator(mode="after")
    def _no_unknown(self):
        extra = sorted(self.model_extra or ())
        if extra:
            names = ", ".join(ascii(k)[1:-1][:40] for k in extra[:5])
            raise BodyError(InvalidRequestError(f"{names}: not a field of this ollama route", extra[0],
                                                code="unknown_parameter"))
        return self


class CallFunction(_Closed):
    index: int | None = None
    name: str
    arguments: dict[str, Any]


class ToolCall(_Closed):
    id: str | None = None
    type: Literal["function"] | None = None
    function: CallFunction


class Message(_Closed):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None  # assistant: its earlier reasoning
    images: list[Any] | None = None  # refused unless empty: no vision
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_name: str | None = None  # tool: the function whose result this is
    tool_call_id: str | None = None  # tool: the call it answers (newer clients)


class _Generating(Body):
    model: str
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    stream: bool = True  # ollama's default
    think: bool | str | None = None
    keep_alive: KeepAlive = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatRequest(_Generating):
    messages: list[Message] = []  # empty: ollama's way to load a model (answered done_reason "load")
    tools: list[Any] | None = None  # OpenAI's shape: checked by the chat route's tool code


class GenerateRequest(_Generating):
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    suffix: str | None = None  # refused: no fill-in-the-middle
    template: str | None = None  # refused: the model's own chat template renders
    context: list[int] | None = None  # refused: ollama deprecated it; send the conversation to /api/chat
    images: list[Any] | None = None  # refused unless empty


class EmbedRequest(Body):
    model: str
    input: str | list[str]
    truncate: bool = True  # ollama's default: cut an input at the context window
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(Body):
    model: str
    prompt: str | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ModelRequest(Body):
    """/api/show and /api/pull: the model by `model` or by its older name `name`."""
    model: str | None = None
    name: str | None = None
    verbose: bool | None = None  # show: the full tokenizer lists (none are listed here)
    insecure: bool | None = None  # pull: accepted, nothing is downloaded
    stream: bool = True  # pull

    @property
    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise InvalidRequestError("model: this field is required", "model")
        return name
