"""Harmony replies (GPT-OSS) as one grammar: the analysis message (the reasoning) first, optional, its
text free up to <|end|> (at most `budget` tokens, the marker forced there), then the constrained message:

    analysis:  <|channel|>analysis<|message|> TEXT <|end|><|start|>assistant
    a call:    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|> ARGUMENTS <|call|>
    an answer: <|channel|>final<|message|> CONSTRAINT <|return|>

A call is a commentary message addressed to one of the tools, its body the tool's arguments schema
(HarmonySplitter reads it back as the call); an answer is the final channel, its body a JSON schema, a
JSON object or a choice. So a speculative window across the end of the analysis is ordinary grammar
state. Every harmony marker is a token, written by id; <|constrain|> and <|return|> as tokens where the
tokenizer has them (<|constrain|> as text otherwise; no <|return|>: the answer ends with the grammar)."""
from __future__ import annotations

import json
from collections.abc import Mapping

from ridgeline.tool_calls.formats import CallFormat

CONSTRAIN, RETURN = "<|constrain|>", "<|return|>"
TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", CONSTRAIN, RETURN)  # written by id
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _tok(text: str, ids: Mapping[str, int]) -> str:
    return f"<[{ids[text]}]>" if text in ids else json.dumps(text)


def call_rules(fmt: CallFormat, tools: Mapping[str, dict], ids: Mapping[str, int]) -> str:
    """`start: call`, one message addressed to any of tools, its body the tool's arguments. One call per
    reply: <|call|> ends the turn (the client sends the result and asks again), so parallel calls are one."""
    constrain = _tok(CONSTRAIN, ids)
    rules, alts = [], []
    for k, (name, schema) in enumerate(tools.items()):
        head = json.dumps(f"commentary to=functions.{name} ", ensure_ascii=False)
        rules.append(f"call{k}: {_tok(fmt.start, ids)} {head} {constrain} \"json\" {_tok('<|message|>', ids)} "
                     f"args{k} {_tok(fmt.end, ids)}")
        rules.append(f"args{k}: %json {json.dumps({**schema, 'x-guidance': COMPACT}, ensure_ascii=False)}")
        alts.append(f"call{k}")
    return "\n".join(["start: call", f"call: {' | '.join(alts)}", *rules]) + "\n"


def auto_rules(fmt: CallFormat, tools: Mapping[str, dict], ids: Mapping[str, int]) -> str:
    """tool_choice auto: commentary preambles to the user (free text), then either one call (as call_rules')
    or the final channel's answer (free text). The analysis message before them is with_analysis's."""
    from ridgeline.tool_calls.xml_grammar import NotConstrainable
    missing = [m for m in TOKENS[:5] if m not in ids]
    if missing:
        raise NotConstrainable(f"harmony calls under auto need {', '.join(missing)} as tokens of the tokenizer")
    calls = call_rules(fmt, tools, ids).split("\n", 1)[1]  # its rules without `start: call`
    end = f" {_tok(RETURN, ids)}?" if RETURN in ids else ""
    return "\n".join([
        "start: preamble* (call | answer)",
        f"preamble: {_tok('<|channel|>', ids)} \"commentary\" {_tok('<|message|>', ids)} FREE_TEXT "
        f"{_tok('<|end|>', ids)} {_tok('<|start|>', ids)} \"assistant\"",
        f"answer: {_tok('<|channel|>', ids)} \"final\" {_tok('<|message|>', ids)} FREE_TEXT{end}",
        "FREE_TEXT: /(.|\\n)*/", calls]).rstrip("\n") + "\n"


def final_rules(body: str, ids: Mapping[str, int]) -> str:
    """`start: answer`: the final channel's message, its body the Lark expression `body`."""
    end = f" {_tok(RETURN, ids)}" if RETURN in ids else ""
    return (f"start: answer\nanswer: {_tok('<|channel|>', ids)} \"final\" {_tok('<|message|>', ids)} "
            f"final_body{end}\nfinal_body: {body}\n")


def with_analysis(grammar: str, ids: Mapping[str, int], budget: int | None = None) -> str:
    """grammar (its first line its start rule) after an optional analysis message. ids: harmony's markers
    (all tokens: the caller checked). budget: the analysis text's tokens at most."""
    first, _, rest = grammar.partition("\n")
    if not first.startswith("start:"):
        raise ValueError("the grammar's first line must be its start rule")
    text = f"analysis_text[max_tokens={int(budget)}]: ANALYSIS_TEXT" if budget is not None else \
        "analysis_text: ANALYSIS_TEXT"
    analysis = (f"analysis: {_tok('<|channel|>', ids)} \"analysis\" {_tok('<|message|>', ids)} analysis_text "
                f"{_tok('<|end|>', ids)} {_tok('<|start|>', ids)} \"assistant\"")
    return "\n".join([f"start: analysis? ({first[len('start:'):].strip()})", analysis, text,
                      "ANALYSIS_TEXT: /(.|\\n)*/", rest]).rstrip("\n") + "\n"
