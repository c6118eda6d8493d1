"""Request bodies as OpenAI defines them (plus vLLM's sampling extensions), validated strictly:
a wrong JSON type is a 400, never coerced. Before any field is read, the whole body (unknown fields
and keys included) must be valid Unicode, and a peer's feature not supported yet (the table in
serve/fields.py) must be absent or off. OpenAI's own ranges are checked here; what the engine can
hold is SamplingParams' job, checked once there. Unknown fields are kept in `model_extra` so the
route can name them (log and response header) and ignore them."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.inputs import check_text, shown, template_message
from ridgeline.sampling_params import MAX_LOGPROBS, SamplingParams
from ridgeline.serve.fields import refuse_peer_fields
from ridgeline.structured.request import GUIDED, from_request

_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                    "frequency_penalty", "seed", "stop", "stop_token_ids", "min_tokens", "ignore_eos",
                    "skip_special_tokens", "include_stop_str_in_output", "best_of")
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]



class BodyError(RidgelineError):
    """An InvalidRequestError raised while pydantic validates a body. Not a ValueError, so pydantic
    passes it through unchanged and the server answers with its message and param."""

    def __init__(self, e: InvalidRequestError):
        super().__init__(e.message, e.param, e.code)
        self.status, self.type = e.status, e.type


def check_body(data: Any, model_fields) -> None:
    """Whole-body rules, on the parsed JSON before any field is read: valid Unicode everywhere,
    no peer feature that is not supported switched on (model_fields: those the route enforces)."""
    check_text(data, "")
    if isinstance(data, dict):
        refuse_peer_fields(data, model_fields)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class RequestBody(_Strict):
    """A route's whole body: check_body's rules run on the parsed JSON before any field is read."""

    @model_validator(mode="before")
    @classmethod
    def _whole_body(cls, data: Any) -> Any:
        try:
            check_body(data, cls.model_fields)
        except InvalidRequestError as e:
            raise BodyError(e) from None
        return data


def _token_id(key: str) -> int:
    """A logit_bias key: a token id written as a decimal string, as OpenAI sends it."""
    if not (key.isascii() and key.isdigit() and len(key) <= 19):
        raise InvalidRequestError(f"logit_bias: keys must be token ids (decimal integers), got '{shown(key)}'",
                                  "logit_bias")
    return int(key)


class StreamOptions(_Strict):
    include_usage: bool = False


class _GenerateRequest(RequestBody):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    # vLLM extensions
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    cache_salt: str | None = None  # prefix-cache isolation: only requests with the same salt share KV blocks
    logit_bias: dict[str, float] | None = None  # token id (a string) -> bias in [-100, 100], added to its logit
    best_of: int | None = None  # only None or n
    # structured outputs (ridgeline/structured/request.py): one of these at most
    response_format: dict[str, Any] | None = None  # OpenAI's
    structured_outputs: dict[str, Any] | None = None  # vLLM's
    guided_json: dict[str, Any] | str | None = None  # vLLM's older spellings
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    structural_tag: dict[str, Any] | str | None = None  # vLLM's
    regex: str | None = None  # SGLang's
    ebnf: str | None = None
    json_schema: dict[str, Any] | str | None = None  # SGLang's (JSON text) and llama.cpp's (an object)
    grammar: str | None = None  # llama.cpp's (GBNF)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options: only allowed when stream is true", "stream_options")

    def _sampling(self, max_tokens: tuple[str, int | None], logprobs: int | None,
                  prompt_logprobs: int | None = None) -> SamplingParams:
        name, value = max_tokens
        if value is not None and value < (0 if prompt_logprobs is not None else 1):
            hint = " (0 is allowed with echo and logprobs: score the prompt only)" if value == 0 else ""
            raise InvalidRequestError(f"{name}: must be >= 1, got {value}{hint}", name)
        if self.temperature is not None and not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidRequestError(f"temperature: must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}",
                                      "temperature")
        fields = {k: v for k in _SAMPLING_FIELDS if (v := getattr(self, k)) is not None}
        structured, _ = from_request(self.response_format, self.structured_outputs,
                                                          {k: getattr(self, k) for k in GUIDED},
                                                          self.guided_decoding_backend)
        if structured is not None:
            fields["structured"] = structured
        if self.logit_bias:
            fields["logit_bias"] = {_token_id(k): v for k, v in self.logit_bias.items()}
        return SamplingParams(**fields, max_tokens=value, logprobs=logprobs, prompt_logprobs=prompt_logprobs)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant: the calls it made (tool_calls/request.py)
    tool_call_id: str | None = None  # tool: the call this result answers
    reasoning_content: str | None = None  # assistant: its earlier reasoning (templates that read it render it)

    def as_template_input(self) -> dict:
        m = template_message(self.role, self.content)
        if self.reasoning_content is not None:
            m["reasoning_content"] = self.reasoning_content
        return m


class ChatCompletionRequest(_GenerateRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Any] | None = None  # checked in tool_calls/request.py
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # template variables (serve/reasoning.py)
    reasoning_effort: str | None = None  # a template variable, where the template reads it
    include_reasoning: bool | None = None  # false: leave reasoning_content out of the reply
    thinking_token_budget: int | None = None  # the reasoning section's tokens at most (vLLM's name)
    max_reasoning_tokens: int | None = None  # the same, by another name

    @property
    def max_tokens_field(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def sampling_params(self) -> SamplingParams:
        self.check_stream_options()
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise InvalidRequestError("top_logprobs: requires logprobs to be true", "top_logprobs")
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                raise InvalidRequestError(f"top_logprobs: must be in [0, {MAX_LOGPROBS}], got "
                                          f"{self.top_logprobs}", "top_logprobs")
        return self._sampling(self.max_tokens_field, (self.top_logprobs or 0) if self.logprobs else None)


class CompletionRequest(_GenerateRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None

    @property
    def max_tokens_field(self) -> tuple[str, int | None]:
        return "max_tokens", 16 if self.max_tokens is None else self.max_tokens  # OpenAI's default

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise InvalidRequestError("prompt: must not be empty", "prompt")
        return list(p)

    def sampling_params(self) -> SamplingParams:
        self.check_stream_options()
        # echo + logprobs: the prompt's tokens get logprobs too (its whole prompt is computed)
        return self._sampling(self.max_tokens_field, self.logprobs, self.logprobs if self.echo else None)
