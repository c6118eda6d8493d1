"""Structured-output specs as llguidance grammars, and the parser limits every matcher takes: shared by the
engine's backend (structured/llg.py) and the compile worker's child process (structured/compile_worker.py)."""
from __future__ import annotations

import json

import llguidance as llg

from ridgeline.structured_params import COMPACT_JSON, StructuredOutputs


def limits() -> llg.LLParserLimits:
    """llguidance's own limits (its defaults), errors without the parser's state."""
    return llg.LLParserLimits(verbose_errors=False)


def grammar_of(spec: StructuredOutputs) -> str:
    """spec as an llguidance grammar (text); ValueError when it cannot be built."""
    return grammar_of_key(*spec.key)


def grammar_of_key(kind: str, text: str) -> str:
    """A StructuredOutputs.key (kind, text) as an llguidance grammar; ValueError when it cannot be built."""
    try:
        if kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema('{"type":"object"}', defaults=COMPACT_JSON)
        if kind == "json":
            return llg.LLMatcher.grammar_from_json_schema(text, defaults=COMPACT_JSON)
        if kind == "choice":
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(text)))
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(text)
        if kind == "structural_tag":  # free text; each trigger starts begin, JSON of its schema, end
            tag = json.loads(text)
            return llg.StructTag.to_grammar([
                llg.StructTag(trigger=next(t for t in tag["triggers"] if s["begin"].startswith(t)), begin=s["begin"],
                              grammar={**s["schema"], "x-guidance": COMPACT_JSON}, end=s["end"])
                for s in tag["structures"]])
        if kind == "grammar":
            return llg.grammar_from("grammar", text)  # Lark, or GBNF converted to Lark
        raise ValueError(f"unknown kind {kind!r}")
    except RecursionError as e:
        raise ValueError(str(e)) from None
