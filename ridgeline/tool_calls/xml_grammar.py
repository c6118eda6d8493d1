"""Qwen3-Coder's XML calls as grammar rules, each call's parameters its tool's schema:

    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>

The parameters come in the schema's order, the required ones always, the optional ones or not. A string
parameter's value is its text as written (what the parser reads back: parser._xml_value), any text
without the markers that would end it early, within minLength / maxLength, or one of its enum / const
values; any other type is the JSON of its schema (`%json`, compact), which the parser reads back as JSON.
An object schema without properties takes any parameters, as strings. What the text form cannot hold to the
schema (a string's pattern or format, a key with `>` or a newline) is NotConstrainable."""
from __future__ import annotations

import json
from collections.abc import Mapping

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# a string value may not contain what ends it (or its call, or the block) in the parser's reading
_ENDS = ("</parameter>", "</function>", "</tool_call>")
_ANY = "(.|\\n)"
_KEY = "[A-Za-z_][A-Za-z0-9_.\\-]*"


class NotConstrainable(ValueError):
    """A tool's schema the call format's grammar cannot enforce; the message says which part."""


def _lark_regex_literal(text: str) -> str:
    """text as a Lark regex body (between slashes), every character literal."""
    return "".join(c if c.isalnum() or c == " " else ("\\n" if c == "\n" else f"\\{c}" if c in "/\\.^$*+?()[]{}|-"
                                                       else c) for c in text)


def _string_value(name: str, key: str, schema: dict) -> str:
    """The Lark expression of a string parameter's value."""
    for word in ("pattern", "format", "contentEncoding"):
        if word in schema:
            raise NotConstrainable(f"{name}: parameter {key!r} has a string {word}, which the XML call format cannot "
                                   "enforce")
    options = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if options is not None:
        if not options or not all(isinstance(o, str) for o in options):
            raise NotConstrainable(f"{name}: parameter {key!r} has an enum of other values than strings")
        return " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    count = f"{{{lo},{'' if hi is None else int(hi)}}}" if lo or hi is not None else "*"
    ends = "|".join(_lark_regex_literal(e) for e in _ENDS)
    return f"/{_ANY}{count}/ & ~/{_ANY}*({ends}){_ANY}*/"


def _parameter(tag: str, head: str, string: str | None, schema: dict) -> list[str]:
    """The rules of one parameter `p<tag>`. string: a string value's token expression (None: JSON of schema).
    A string's text is one lazy lexeme up to the closing marker's first occurrence (a greedy one would run
    into the marker and could not end before it)."""
    if string is None:
        value = f"%json {json.dumps({**schema, 'x-guidance': COMPACT}, ensure_ascii=False)}"
        return [f"p{tag}: {head} v{tag} \"\\n</parameter>\\n\"", f"v{tag}: {value}"]
    if " | " in string or string.startswith('"'):  # enum / const: literal alternatives
        return [f"p{tag}: {head} ({string}) \"\\n</parameter>\\n\""]
    token = f"S{tag}".upper()
    return [f"p{tag}: {head} s{tag}", f"s{tag}[lazy]: {token} \"\\n</parameter>\\n\"", f"{token}: {string}"]


def _is_string(schema) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string"


def xml_calls(tools: Mapping[str, dict]) -> list[str]:
    """The `call` rule and its helpers: one <function=...> block of any of tools."""
    rules, alts = [], []
    for k, (name, schema) in enumerate(tools.items()):
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        parts = []
        for j, (key, sub) in enumerate(props.items()):
            if not isinstance(key, str) or ">" in key or "\n" in key or not key:
                raise NotConstrainable(f"{name}: parameter {key!r} cannot be written as an XML parameter name")
            if sub is False:
                continue
            sub = sub if isinstance(sub, dict) else {}
            head = json.dumps(f"<parameter={key}>\n", ensure_ascii=False)
            rules += _parameter(f"{k}_{j}", head, _string_value(name, key, sub) if _is_string(sub) else None, sub)
            parts.append(f"p{k}_{j}" + ("" if key in required else "?"))
        if not props and schema.get("additionalProperties", True) is not False:  # any parameters, as strings
            rules += _parameter(f"{k}_any", f'"<parameter=" /{_KEY}/ ">\\n"', _string_value(name, "any", {}), {})
            parts.append(f"p{k}_any*")
        head = json.dumps(f"<function={name}>\n", ensure_ascii=False)
        rules.append(f"call{k}: {head} {' '.join(parts)} \"</function>\"")
        alts.append(f"call{k}")
    return [f"call: {' | '.join(alts)}", *rules]
