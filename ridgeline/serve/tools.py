"""Tool calling on the chat route: the template's call format (detected once per template, on the
server's executor through the bounded renderer), the request's template input, the constraint for
`tool_choice` required and named (a grammar of calls, each call's arguments its tool's schema) and
auto (free text, each call constrained from its opening marker on, where the format has one), and a
parser per choice for the reply."""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams
from ridgeline.structured_params import StructuredOutputs
from ridgeline.tool_calls.detect import Detected, detect
from ridgeline.tool_calls.grammar import NotConstrainable, auto_grammar, call_grammar, lazily_constrained
from ridgeline.tool_calls.harmony_grammar import TOKENS as HARMONY_TOKENS
from ridgeline.tool_calls.parser import ToolCallParser
from ridgeline.tool_calls.request import ToolChoice, generic_messages, template_messages, tool_choice

_detected: dict[str, Detected] = {}  # template source -> its format
_lock = threading.Lock()


@dataclass
class ToolPlan:
    choice: ToolChoice | None
    detected: Detected
    messages: list[dict]  # template input
    extra: dict  # template variables (tools)
    specials: dict[int, str]  # tokens the parser matches by id
    params: SamplingParams

    def parser(self) -> ToolCallParser | None:
        if self.choice is None or self.choice.mode == "none":
            return None
        return ToolCallParser(self.detected.format, self.specials, schemas=self.choice.schemas,
                              max_calls=None if self.choice.parallel else 1, stream_arguments=self.constrained)

    @property
    def constrained(self) -> bool:
        """A grammar writes the calls (required, named, or auto's lazy grammar): their arguments stream."""
        return self.params.structured is not None and self.params.structured.field == "tools"


def detected_format(tok, render) -> Detected:
    """The call format of the tokenizer's template (cached per template text); runs the template."""
    source = tok.chat_template or ""
    with _lock:
        hit = _detected.get(source)
    if hit is None:
        def go(messages, tools):
            return tok.apply_chat_template(messages, add_generation_prompt=False, render=render,
                                           **({"tools": tools} if tools is not None else {}))
        hit = detect(go)
        with _lock:
            _detected[source] = hit
    return hit


def _refuse_special_text(tok, choice: ToolChoice | None, messages: list[dict]) -> None:
    """Special-token text in what a template renders outside message contents would be parsed as the
    tokens themselves (a forged turn): refused. Contents are safe (encode_chat reads them as text)."""
    if choice is not None and tok.special_text_in(list(choice.tools)):
        raise InvalidRequestError("tools: contains the text of a special token", "tools")
    for i, m in enumerate(messages):
        if tok.special_text_in(m.get("tool_calls")):
            raise InvalidRequestError(f"messages[{i}].tool_calls: contains the text of a special token", "messages")


def plan(body, tok, render, params: SamplingParams, template_input: list[dict]) -> ToolPlan:
    """Everything tool calling changes about one request (runs templates: call on the executor)."""
    choice = tool_choice(body.tools, body.tool_choice, body.parallel_tool_calls)
    raw = [m.model_dump() for m in body.messages]
    messages = template_messages(template_input, raw)
    _refuse_special_text(tok, choice, messages)
    detected = detected_format(tok, render)
    fmt = detected.format
    extra: dict = {}
    if detected.generic:
        messages = generic_messages(messages, choice)
    elif choice is not None:
        extra["tools"] = list(choice.tools)
    specials = {i: m for m in fmt.markers if (i := tok.token_id(m)) is not None}
    if choice is not None and choice.mode != "none":
        if any(i in tok.special_ids for i in specials) and params.skip_special_tokens:
            # the markers are special tokens: keep special tokens in the text (the parser drops the rest)
            params = dataclasses.replace(params, skip_special_tokens=False)
        if not params.skip_special_tokens:
            specials.update({i: tok.id_to_token(i) for i in tok.special_ids})
        ids = {m: i for i, m in specials.items() if m in fmt.markers}
        if fmt.body == "harmony":  # its grammar writes every harmony marker by id
            ids.update({m: i for m in HARMONY_TOKENS if (i := tok.token_id(m)) is not None})
        params = _constrain(choice, detected, params, ids)
    return ToolPlan(choice, detected, messages, extra, specials, params)


def _constrain(choice: ToolChoice, detected: Detected, params: SamplingParams, ids: dict[str, int]) -> SamplingParams:
    fmt = detected.format
    if choice.mode == "auto":  # the calls are constrained once their marker appears; the text is free
        if not lazily_constrained(fmt) or params.structured is not None:
            if choice.strict:  # never fail open: a strict schema that nothing enforces is refused
                why = (f"this model's call format ({fmt.name}) cannot be constrained under auto yet"
                       if params.structured is None else f"auto beside {params.structured.field} is not constrained")
                raise InvalidRequestError(f"tools: strict calls cannot be enforced: {why}; drop strict, or use "
                                          "tool_choice required where the format allows it", "tools",
                                          code="unsupported_parameter")
            return params  # parsed as written (a response_format constrains the whole reply instead)
        try:
            grammar = auto_grammar(fmt, choice.callable, choice.parallel, ids)
        except NotConstrainable as e:
            if choice.strict:
                raise InvalidRequestError(f"tools: strict calls cannot be enforced: {e}", "tools",
                                          code="unsupported_parameter") from None
            return params  # parsed as written, as on a format nothing constrains
        return dataclasses.replace(params, structured=StructuredOutputs(grammar=grammar, field="tools"))
    if choice.mode not in ("required", "named"):
        return params
    if not fmt.constrainable:
        raise InvalidRequestError(f"tool_choice: {choice.mode} cannot be enforced for this model's call format "
                                  f"({fmt.name}) yet; use auto", "tool_choice", code="unsupported_parameter")
    missing = [m for m in HARMONY_TOKENS[:5] if m not in ids] if fmt.body == "harmony" else []
    if missing:
        raise InvalidRequestError(f"tool_choice: {choice.mode} on harmony calls needs {', '.join(missing)} as tokens "
                                  "of the tokenizer; this one writes them as text", "tool_choice",
                                  code="unsupported_parameter")
    if params.structured is not None:
        raise InvalidRequestError(f"tool_choice: {choice.mode} cannot be combined with "
                                  f"{params.structured.field}", "tool_choice")
    try:
        grammar = call_grammar(fmt, choice.callable, choice.parallel, ids)
    except NotConstrainable as e:
        raise InvalidRequestError(f"tool_choice: {choice.mode} cannot be enforced: {e}", "tool_choice",
                                  code="unsupported_parameter") from None
    return dataclasses.replace(params, structured=StructuredOutputs(grammar=grammar, field="tools"))
