"""Reasoning models and template options on the chat route: `chat_template_kwargs` and
`reasoning_effort` as template variables (each one the template reads, else a 400 naming it: a
variable the template ignores would be an option silently dropped), the reasoning format
(--reasoning-parser: found in the template, named, or none), whether the prompt left a section open,
a constraint moved after the section, and the reply parser of each choice."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams
from ridgeline.tool_calls.reasoning import (REASONING_FORMATS, BudgetNeedsToken, HarmonyFormat, HarmonySplitter,
                                            ReasoningFormat, ReasoningSplitter, budget_only, detect_reasoning,
                                            opens_reasoning, with_reasoning, wrap_tool_grammar)
from ridgeline.tool_calls.harmony_grammar import TOKENS as HARMONY_TOKENS
from ridgeline.tool_calls.reply import ReplyParser

PARSERS = ("auto", "none", *REASONING_FORMATS)
# variables the server sets itself: a client's chat_template_kwargs may not replace them
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now", "reasoning_effort"})
MAX_KWARGS = 32
EFFORTS = ("none", "minimal", "low", "medium", "high")


def _reads(template: str | None, name: str) -> bool:
    return bool(template) and re.search(rf"\b{re.escape(name)}\b", template) is not None


def template_variables(body, tok) -> dict:
    """chat_template_kwargs and reasoning_effort as template variables, each checked against the template."""
    out: dict = {}
    kwargs = body.chat_template_kwargs or {}
    if not isinstance(kwargs, dict):
        raise InvalidRequestError("chat_template_kwargs: must be an object", "chat_template_kwargs")
    if len(kwargs) > MAX_KWARGS:
        raise InvalidRequestError(f"chat_template_kwargs: at most {MAX_KWARGS} keys", "chat_template_kwargs")
    for key, value in kwargs.items():
        where = f"chat_template_kwargs.{key}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", key) or key in RESERVED:
            raise InvalidRequestError(f"{where}: not a variable a request may set", "chat_template_kwargs")
        if not _reads(tok.chat_template, key):
            raise InvalidRequestError(f"{where}: this model's chat template does not read {key}",
                                      "chat_template_kwargs", code="unsupported_parameter")
        if tok.special_text_in(value):
            raise InvalidRequestError(f"{where}: contains the text of a special token", "chat_template_kwargs")
        out[key] = value
    effort = body.reasoning_effort
    if effort is not None:
        if effort not in EFFORTS:
            raise InvalidRequestError(f"reasoning_effort: one of {', '.join(EFFORTS)}, got {ascii(effort)[:20]}",
                                      "reasoning_effort")
        if not _reads(tok.chat_template, "reasoning_effort"):
            raise InvalidRequestError("reasoning_effort: this model's chat template takes no reasoning effort",
                                      "reasoning_effort", code="unsupported_parameter")
        out["reasoning_effort"] = effort
    return out


def reasoning_format(setting: str, tok) -> ReasoningFormat | None:
    if setting == "none":
        return None
    if setting == "auto":
        return detect_reasoning(tok.chat_template)
    return REASONING_FORMATS[setting]


@dataclass
class ReasoningPlan:
    fmt: ReasoningFormat
    specials: dict[int, str]  # tokens the splitter matches by id
    token_ids: dict[str, int]  # the markers that are tokens
    keep: bool  # include_reasoning
    budget: tuple[str, int] | None = None  # (the field that set it, tokens): the section's tokens at most
    plain: frozenset[str] = frozenset()  # of specials, the texts a decode keeps (added tokens not special)
    opened: bool = False  # the prompt left a section open (set once it is rendered)


def _budget(body) -> tuple[str, int] | None:
    given = [(name, v) for name in ("thinking_token_budget", "max_reasoning_tokens")
             if (v := getattr(body, name, None)) is not None]
    if len(given) > 1:
        raise InvalidRequestError("max_reasoning_tokens: give one of thinking_token_budget and max_reasoning_tokens",
                                  "max_reasoning_tokens")
    if given and given[0][1] < 0:
        raise InvalidRequestError(f"{given[0][0]}: must be >= 0, got {given[0][1]}", given[0][0])
    return given[0] if given else None


def plan(fmt: ReasoningFormat | None, tok, params: SamplingParams, tool_specials: dict[int, str] | None,
         body) -> tuple[ReasoningPlan | None, SamplingParams]:
    """body: the chat request (include_reasoning, the thinking budget)."""
    include_reasoning, budget = body.include_reasoning, _budget(body)
    if fmt is None:
        for name, given in (("include_reasoning", include_reasoning is False), (budget and budget[0], budget)):
            if given:
                raise InvalidRequestError(f"{name}: this model has no reasoning section", name,
                                          code="unsupported_parameter")
        return None, params
    ids = {m: i for m in fmt.markers if (i := tok.token_id(m)) is not None}
    if isinstance(fmt, HarmonyFormat):
        missing = [m for m in fmt.markers if m not in ids]
        if missing:
            raise InvalidRequestError(f"reasoning: harmony needs {', '.join(missing)} as tokens of the tokenizer; "
                                      "this one writes them as text (use --reasoning-parser none)", "reasoning")
        if budget is not None and params.structured is None:
            raise InvalidRequestError(f"{budget[0]}: a thinking budget on harmony replies needs a constraint "
                                      "(tool_choice required or named, or a response_format) yet",
                                      budget[0], code="unsupported_parameter")
    if budget is not None and fmt.end not in ids:
        raise InvalidRequestError(f"{budget[0]}: a thinking budget needs the end marker {fmt.end} to be one token "
                                  "of the tokenizer; this one writes it as text", budget[0],
                                  code="unsupported_parameter")
    if any(i in tok.special_ids for i in ids.values()) and params.skip_special_tokens:
        params = dataclasses.replace(params, skip_special_tokens=False)  # the markers' text must be there
    specials = {i: m for m, i in ids.items()} | dict(tool_specials or {})
    if not params.skip_special_tokens:
        specials.update({i: tok.id_to_token(i) for i in tok.special_ids if i not in specials})
    plain = frozenset(t for i, t in specials.items() if i not in tok.special_ids)
    if isinstance(fmt, HarmonyFormat):  # the grammars also write <|constrain|>, <|return|>, <|call|> by id
        ids.update({m: i for m in HARMONY_TOKENS if (i := tok.token_id(m)) is not None})
    return ReasoningPlan(fmt, specials, ids, include_reasoning is not False, budget, plain), params


def after_prompt(rp: ReasoningPlan | None, prompt_text: str, params: SamplingParams) -> SamplingParams:
    """With the prompt rendered: whether it opened a section; a constraint starts after the section."""
    if rp is None:
        return params
    rp.opened = opens_reasoning(rp.fmt, prompt_text)
    spec, budget = params.structured, rp.budget[1] if rp.budget else None
    harmony = isinstance(rp.fmt, HarmonyFormat)  # a reply is messages: any constraint is one of them
    try:
        if spec is None:
            if budget is None:
                return params
            spec = budget_only(rp.fmt, rp.token_ids, rp.opened, budget)
        elif spec.field == "tools":  # the tool-call grammars (serve/tools.py): ours, start rule first
            spec = dataclasses.replace(spec, grammar=wrap_tool_grammar(spec.grammar, rp.fmt, rp.token_ids,
                                                                       rp.opened, budget))
        elif spec.kind in ("json", "json_object", "choice") or rp.opened or budget is not None or harmony:
            spec = with_reasoning(spec, rp.fmt, rp.token_ids, rp.opened, budget)  # other kinds: refused
    except BudgetNeedsToken:  # checked in plan(); here for a format given by flag
        raise InvalidRequestError(f"{rp.budget[0]}: a thinking budget needs the end marker as one token",
                                  rp.budget[0], code="unsupported_parameter") from None
    return dataclasses.replace(params, structured=spec)


def reply_parser(rp: ReasoningPlan | None, tools) -> ReplyParser | None:
    """The choice's parser (None: no reasoning and no tools: the text is the content as it comes)."""
    tool_parser = tools.parser() if tools is not None else None
    if rp is None and tool_parser is None:
        return None
    # the answer keeps the tokens the tool-call parser reads, or, without one, what a plain decode would show
    forward = set(tool_parser.specials.values()) if tool_parser is not None else (set(rp.plain) if rp else set())
    if rp is None:
        splitter = None
    elif isinstance(rp.fmt, HarmonyFormat):
        splitter = HarmonySplitter(rp.fmt, rp.specials, forward, calls=tool_parser is not None)
    else:
        splitter = ReasoningSplitter(rp.fmt, rp.specials, rp.opened, forward)
    return ReplyParser(splitter, tool_parser, rp.keep if rp is not None else True)
