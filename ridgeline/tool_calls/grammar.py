"""The grammars (llguidance's Lark) of calls in a format, each call's arguments the tool's JSON schema
(`%json`, compact): for `tool_choice` required and named the reply is nothing but calls; for `auto` it
is free text whose calls, from the format's opening marker on, are constrained (a lazy trigger). Either
way arguments are valid by construction. Markers the tokenizer has as tokens are written by id (`<[id]>`),
the rest as text. parallel false: exactly one call; true: one or more."""
from __future__ import annotations

import json
from collections.abc import Mapping

from ridgeline.tool_calls import harmony_grammar
from ridgeline.tool_calls.formats import LEADING_SPACE, CallFormat
from ridgeline.tool_calls.xml_grammar import NotConstrainable, xml_calls

__all__ = ["NotConstrainable", "auto_grammar", "call_grammar", "lazily_constrained"]

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lit(text: str, token_ids: Mapping[str, int]) -> str:
    if not text:
        return ""
    return f"<[{token_ids[text]}]>" if text in token_ids else json.dumps(text, ensure_ascii=False)


def _calls(fmt: CallFormat, tools: Mapping[str, dict]) -> list[str]:
    """The `call` rule: one call of any of tools, its arguments the tool's schema."""
    if fmt.body == "xml":
        return xml_calls(tools)
    rules, alts = [], []
    for k, (name, schema) in enumerate(tools.items()):
        schema = {**schema, "x-guidance": COMPACT}
        head = '{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{fmt.args_key}": '
        rules.append(f"call{k}: {json.dumps(head, ensure_ascii=False)} args{k} \"}}\"")
        rules.append(f"args{k}: %json {json.dumps(schema, ensure_ascii=False)}")
        alts.append(f"call{k}")
    return [f"call: {' | '.join(alts)}", *rules]


def _after_marker(fmt: CallFormat, parallel: bool, ids: Mapping[str, int]) -> tuple[str, bool]:
    """(what follows the block's opening marker up to its end, whether blocks may repeat one after
    another): a JSON list [call, call], or one call per block, or calls one after another."""
    sep = json.dumps(fmt.call_sep)
    if fmt.listed:
        more = f" ({sep} call)*" if parallel else ""
        return f'"[" call{more} "]" {_lit(fmt.end or "", ids)}', False
    if fmt.end:
        return f'"\\n" call "\\n" {_lit(fmt.end, ids)}', parallel
    more = f" ({sep} call)*" if parallel else ""
    return f"call{more}", False


def call_grammar(fmt: CallFormat, tools: Mapping[str, dict], parallel: bool,
                 token_ids: Mapping[str, int] | None = None) -> str:
    """The reply is nothing but calls (tool_choice required, named). tools: name -> parameters schema
    (the callable ones, in order). token_ids: marker -> token id for the markers that are tokens."""
    if not fmt.constrainable:
        raise ValueError(f"the {fmt.name} format cannot be constrained")
    ids = token_ids or {}
    if fmt.body == "harmony":  # a message addressed to the function (harmony_grammar.py)
        return harmony_grammar.call_rules(fmt, tools, ids)
    rest, repeats = _after_marker(fmt, parallel, ids)
    block = f"{_lit(fmt.writes, ids)} {rest}"
    body = f'{block} ("\\n" {block})*' if repeats else block
    return "\n".join([f"start: {' '.join(body.split())}", *_calls(fmt, tools)]) + "\n"


def lazily_constrained(fmt: CallFormat) -> bool:
    """tool_choice auto can be constrained from the format's opening marker on: the marker is what the
    format writes, or (Llama 3's bare JSON calls) a reply that begins with "{" is calls and the
    <|python_tag|> marker opens them after text, or (harmony) the reply is messages, one of them a call."""
    return fmt.constrainable and bool(fmt.start) and (fmt.opener is None or fmt.leading_json)


# text that does not begin (after LEADING_SPACE) with "{": what the parser reads as content in a format whose
# reply beginning with "{" is calls (ToolCallParser: leading_json)
_SPACE = LEADING_SPACE.encode("unicode_escape").decode()
_NOT_LEADING_JSON = f"[{_SPACE}]*([^{_SPACE}{{](.|\\n)*)?"


def _leading_json_auto(fmt: CallFormat, tools: Mapping[str, dict], parallel: bool, ids: Mapping[str, int]) -> str:
    """Llama 3.x under auto: the reply is calls from its first byte ("{"), or text that does not begin with
    "{", optionally followed by the marker and calls to the end of the reply."""
    more = f" ({json.dumps(fmt.call_sep)} call)*" if parallel else ""
    if fmt.start in ids:  # a token: the text cannot contain it
        tagged = [f"tagged: PROSE {_lit(fmt.start, ids)} block"]
    else:  # the marker as text: the prose runs to its first occurrence
        tagged = ["tagged: trig block", f"trig[lazy]: PROSE {_lit(fmt.start, ids)}"]
    return "\n".join(["start: LEAD? block | PROSE | tagged", f"LEAD: /[{_SPACE}]+/", f"PROSE: /{_NOT_LEADING_JSON}/",
                      *tagged, f"block: call{more}", *_calls(fmt, tools)]) + "\n"


def auto_grammar(fmt: CallFormat, tools: Mapping[str, dict], parallel: bool,
                 token_ids: Mapping[str, int] | None = None) -> str:
    """tool_choice auto: free text until the format's opening marker appears (a lazy trigger: the text
    ends at the marker's first occurrence, or the marker token), from there a block of calls of the
    tools, their arguments each tool's schema; then free text again (and more blocks) with parallel
    calls, else the reply ends after its one block. A block without an end marker runs to the end."""
    if not lazily_constrained(fmt):
        raise ValueError(f"the {fmt.name} format cannot be constrained from a marker")
    ids = token_ids or {}
    if fmt.leading_json:
        return _leading_json_auto(fmt, tools, parallel, ids)
    if fmt.body == "harmony":  # one call per reply whatever parallel says: <|call|> ends the turn
        return harmony_grammar.auto_rules(fmt, tools, ids)
    rest, _ = _after_marker(fmt, parallel, ids)
    if fmt.start in ids:  # a token: free text cannot contain it, so the text simply runs up to it
        trig = f"trig: TEXT {_lit(fmt.start, ids)}"
    else:
        trig = f"trig[lazy]: TEXT {_lit(fmt.start, ids)}"
    again = parallel and fmt.end is not None and not fmt.listed
    start = "start: block* TEXT" if again else "start: TEXT | block"
    return "\n".join([start, "TEXT: /(.|\\n)*/", trig, f"block: trig {' '.join(rest.split())}",
                      *_calls(fmt, tools)]) + "\n"
