"""An ollama chat or generate body -> a ChatCompletionRequest's fields, and the chat route's errors back in
ollama's names: a 400 about `max_tokens` names `options.num_predict`, one about `response_format` names
`format`, so a client reads the field it sent."""
from __future__ import annotations

import re
from contextlib import contextmanager

from pydantic import ValidationError

from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.http.errors import from_validation
from ridgeline.serve import reasoning
from ridgeline.serve.ollama import options as opts

# the chat-completion field -> the ollama field a client set it with
NAMES = {**{chat: f"options.{name}" for name, chat in opts.SAMPLING.items()}, "response_format": "format",
         "response_format.json_schema.schema": "format", "response_format.json_schema": "format",
         "chat_template_kwargs": "think", "reasoning_effort": "think", "include_reasoning": "think"}
_ALTERNATIVES = "|".join(re.escape(n) for n in sorted(NAMES, key=len, reverse=True))
# a field named where a message starts, or (with an underscore: never an English word) anywhere in it
_NAME = re.compile(rf"^({_ALTERNATIVES})(?=[:.\[ ])|(?<![\w.])({'|'.join(re.escape(n) for n in sorted(NAMES, key=len, reverse=True) if '_' in n)})\b")


@contextmanager
def ollama_names():
    """Errors raised inside (a pydantic ValidationError too) leave naming ollama's fields."""
    try:
        yield
    except ValidationError as e:
        raise _renamed(from_validation(e.errors())) from None
    except RidgelineError as e:
        raise _renamed(e) from None


def _renamed(e: RidgelineError) -> RidgelineError:
    e.message = _NAME.sub(lambda m: NAMES[m.group(1) or m.group(2)], e.message)
    if e.param in NAMES:
        e.param = NAMES[e.param]
    return e


def chat_fields(state, body, messages: list[dict], served: str) -> tuple[dict, int | None]:
    """(the ChatCompletionRequest's fields, options.num_ctx or None) for an ollama chat or generate body."""
    tok = state.engine.tokenizer
    sampling, num_ctx = opts.translate(body.options, state.engine.max_model_len)
    fields: dict = {"model": served, "messages": messages, **sampling}
    fmt = opts.response_format(body.format)
    if fmt is not None:
        fields["response_format"] = fmt
    has_reasoning = reasoning.reasoning_format(state.settings.reasoning_parser, tok) is not None
    fields.update(opts.think_fields(body.think, has_reasoning, tok.chat_template, body.model))
    if body.logprobs is not None:
        fields["logprobs"] = body.logprobs
    if body.top_logprobs is not None:
        fields["top_logprobs"] = body.top_logprobs  # without logprobs true: chat's 400 names it
    tools = getattr(body, "tools", None)
    if tools:
        fields["tools"] = tools
    return fields, num_ctx


def check_window(job, num_ctx: int | None, max_tokens: int | None) -> None:
    """options.num_ctx as a bound: the prompt and num_predict must fit in it (the job is closed if not)."""
    if num_ctx is None:
        return
    n = len(job.prompts[0].ids)
    if n + (max_tokens or 1) > num_ctx:
        job.close(400)
        more = f" and num_predict {max_tokens}" if max_tokens else ""
        raise InvalidRequestError(f"options.num_ctx: the prompt is {n} tokens{more}, more than num_ctx {num_ctx}; "
                                  "shorten the conversation or raise num_ctx (nothing is truncated)", "options.num_ctx",
                                  code="context_length_exceeded")
