"""The grammar (llguidance's Lark) that makes a reply nothing but calls in a format, each call's
arguments the tool's JSON schema (`%json`, compact), so `tool_choice` required and named give
arguments valid by construction. Markers the tokenizer has as tokens are written by id (`<[id]>`),
the rest as text. parallel false: exactly one call; true: one or more."""
from __future__ import annotations

import json
from collections.abc import Mapping

from ridgeline.tool_calls.formats import CallFormat

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lit(text: str, token_ids: Mapping[str, int]) -> str:
    if not text:
        return ""
    return f"<[{token_ids[text]}]>" if text in token_ids else json.dumps(text, ensure_ascii=False)


def call_grammar(fmt: CallFormat, tools: Mapping[str, dict], parallel: bool,
                 token_ids: Mapping[str, int] | None = None) -> str:
    """tools: name -> parameters schema (the callable ones, in order). token_ids: marker -> token id
    for the markers that are tokens."""
    if not fmt.constrainable:
        raise ValueError(f"the {fmt.name} format cannot be constrained")
    ids = token_ids or {}
    rules, alts = [], []
    for k, (name, schema) in enumerate(tools.items()):
        schema = {**schema, "x-guidance": COMPACT}
        head = '{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{fmt.args_key}": '
        rules.append(f"call{k}: {json.dumps(head, ensure_ascii=False)} args{k} \"}}\"")
        rules.append(f"args{k}: %json {json.dumps(schema, ensure_ascii=False)}")
        alts.append(f"call{k}")
    sep = json.dumps(fmt.call_sep)
    if fmt.listed:  # one block: [call, call]
        more = f" ({sep} call)*" if parallel else ""
        body = f'{_lit(fmt.writes, ids)} "[" call{more} "]" {_lit(fmt.end or "", ids)}'
    elif fmt.end:  # one block per call
        block = f'{_lit(fmt.writes, ids)} "\\n" call "\\n" {_lit(fmt.end, ids)}'
        body = f"{block} (\"\\n\" {block})*" if parallel else block
    else:  # calls one after another
        more = f" ({sep} call)*" if parallel else ""
        body = f"{_lit(fmt.writes, ids)} call{more}"
    return "\n".join([f"start: {' '.join(body.split())}", f"call: {' | '.join(alts)}", *rules]) + "\n"
