"""The call grammars, matched by llguidance against a byte-level tokenizer, with the markers as text and
as special tokens: `auto` leaves text free until the format's marker and from there admits only calls
of the given tools with arguments valid against their schemas; parallel false ends the reply after its
one block; `required` admits nothing but calls; every format's own call text is accepted."""
from __future__ import annotations

import json

import llguidance as llg
import pytest
from conftest import _byte_tokenizer

from ridgeline.tool_calls.formats import FORMATS
from ridgeline.tool_calls.grammar import auto_grammar, call_grammar, lazily_constrained

TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"], "additionalProperties": False},
         "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                 "required": ["a", "b"], "additionalProperties": False}}
LAZY = [f for f in FORMATS.values() if lazily_constrained(f) and not f.leading_json and f.body != "harmony"]  # below
MARKERS = sorted({m for f in FORMATS.values() for m in f.markers})


def _tokenizer(specials: bool):
    tok = _byte_tokenizer()
    if specials:
        tok.add_special_tokens(MARKERS)
    eos = tok.token_to_id("</s>")
    return tok, llg.LLTokenizer(tok.to_str(), n_vocab=tok.get_vocab_size(), eos_token=[eos]), eos


def _ids(tok, specials: bool) -> dict[str, int]:
    return {m: tok.token_to_id(m) for m in MARKERS} if specials else {}


def _walk(ltok, grammar: str, ids: list[int]) -> tuple[int, llg.LLMatcher]:
    """(how many of ids the grammar takes, in order, the matcher after them)."""
    m = llg.LLMatcher(ltok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    for n, t in enumerate(ids):
        if not m.consume_token(t):
            return n, m
    return len(ids), m


def call(fmt, name, args) -> str:
    """The call as the constrained writer emits it: compact JSON with the writer's separators."""
    text = fmt.call_text(name, args)
    return text.replace(json.dumps(args, ensure_ascii=False), json.dumps(args, separators=(", ", ": ")))


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("fmt", LAZY, ids=lambda f: f.name)
def test_auto_leaves_text_free_and_constrains_each_call(fmt, specials):
    tok, ltok, eos = _tokenizer(specials)
    ids = _ids(tok, specials)
    g = auto_grammar(fmt, TOOLS, parallel=True, token_ids=ids)

    def enc(text):
        return tok.encode(text, add_special_tokens=False).ids

    free = enc("Just text, no call: {\"name\": 1} <tool ca")
    n, m = _walk(ltok, g, free)
    assert n == len(free) and m.is_accepting()  # free text, even JSON-looking, may end the reply
    good = enc("Let me check. " + call(fmt, "get_weather", {"city": "Paris", "days": 2}))
    n, m = _walk(ltok, g, good)
    assert n == len(good), tok.decode(good[:n + 1])
    bad_args = enc("Let me check. " + call(fmt, "get_weather", {"city": "Paris", "days": "two"}))
    assert _walk(ltok, g, bad_args)[0] < len(bad_args)  # arguments against the schema are refused
    unknown = enc("Let me check. " + call(fmt, "delete_everything", {}))
    assert _walk(ltok, g, unknown)[0] < len(unknown)  # only the tools given
    trigger = len(enc("Let me check. " + fmt.start))
    assert _walk(ltok, g, unknown)[0] >= trigger  # the text before the marker was free


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("fmt", [f for f in LAZY if f.end and not f.listed], ids=lambda f: f.name)
def test_auto_with_parallel_false_ends_after_one_block(fmt, specials):
    tok, ltok, eos = _tokenizer(specials)
    ids = _ids(tok, specials)
    one = call(fmt, "add", {"a": 1, "b": 2})
    two = tok.encode("ok " + one + "\n" + one, add_special_tokens=False).ids
    first = tok.encode("ok " + one, add_special_tokens=False).ids
    g = auto_grammar(fmt, TOOLS, parallel=False, token_ids=ids)
    n, m = _walk(ltok, g, first)
    assert n == len(first) and m.is_accepting() and m.is_stopped()  # one block, then nothing but the end
    assert _walk(ltok, g, two)[0] == len(first)
    n, _ = _walk(ltok, auto_grammar(fmt, TOOLS, parallel=True, token_ids=ids), two)
    assert n == len(two)  # parallel: a second block is welcome


@pytest.mark.parametrize("fmt", LAZY, ids=lambda f: f.name)
def test_required_admits_only_calls(fmt):
    tok, ltok, _ = _tokenizer(True)
    g = call_grammar(fmt, TOOLS, parallel=False, token_ids=_ids(tok, True))
    good = tok.encode(call(fmt, "add", {"a": 1, "b": 2}), add_special_tokens=False).ids
    n, m = _walk(ltok, g, good)
    assert n == len(good) and m.is_accepting()
    prose = tok.encode("Sure! " + call(fmt, "add", {"a": 1, "b": 2}), add_special_tokens=False).ids
    assert _walk(ltok, g, prose)[0] == 0


def test_harmony_auto_needs_its_markers_as_tokens():
    from ridgeline.tool_calls.grammar import NotConstrainable
    assert lazily_constrained(FORMATS["harmony"])  # the reply is messages, at most one of them a call
    with pytest.raises(NotConstrainable, match="as tokens"):
        auto_grammar(FORMATS["harmony"], TOOLS, True)


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
def test_llama3_auto_constrains_a_leading_call_and_calls_after_the_tag_and_the_parser_reads_them(specials, parallel):
    """Llama 3.x under auto: a reply that begins with "{" (after whitespace) is calls, held to the tools'
    schemas; other text is free, and after <|python_tag|> calls run to the end. What the grammar admits, the
    parser reads as the same calls (or as content)."""
    from ridgeline.tool_calls.parser import ToolCallParser, parse_all
    fmt = FORMATS["llama3_json"]
    assert lazily_constrained(fmt)
    tok, ltok, _ = _tokenizer(specials)
    ids = _ids(tok, specials)
    g = auto_grammar(fmt, TOOLS, parallel, ids)
    one, args = call(fmt, "add", {"a": 1, "b": 2}), {"a": 1, "b": 2}
    specials_by_id = {i: m for m, i in ids.items()}

    def admits(text: str) -> tuple[bool, bool]:
        t = tok.encode(text, add_special_tokens=False).ids
        n, m = _walk(ltok, g, t)
        return n == len(t), n == len(t) and m.is_accepting()

    def parsed(text: str):
        t = tok.encode(text, add_special_tokens=False).ids
        return parse_all(ToolCallParser(fmt, specials_by_id), t, tok.decode(t, skip_special_tokens=False))

    for text, calls in [("", 0), ("  \n", 0), ('Just text: {"name": 1} and more', 0), (one, 1), ("\n " + one, 1),
                        ("Let me see. <|python_tag|>" + one, 1), ("<|python_tag|>" + one, 1)]:
        assert admits(text) == (True, True), text
        content, got = parsed(text)
        assert [(c.name, json.loads(c.arguments)) for c in got] == [("add", args)] * calls, text
    two = one + "; " + one
    assert admits(two) == ((True, True) if parallel else (False, False))
    if parallel:
        assert [c.name for c in parsed(two)[1]] == ["add", "add"]
    for text in [call(fmt, "add", {"a": "x", "b": 2}), call(fmt, "delete_everything", {}), "{hello}", " {oops"]:
        assert not admits(text)[0], text  # a leading "{" is a call of the tools given, its arguments valid
    assert not admits("ok <|python_tag|>" + call(fmt, "add", {"a": 1}))[0]  # b is required


XML_TOOLS = {"edit": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 12},
                                                       "code": {"type": "string"},
                                                       "mode": {"type": "string", "enum": ["add", "drop"]},
                                                       "lines": {"type": "array", "items": {"type": "integer"}}},
                      "required": ["path", "code"], "additionalProperties": False},
             "anything": {"type": "object"}}


@pytest.mark.parametrize("args, ok", [
    ({"path": "a.py", "code": "if a < b:\n    x = '</div>'\n"}, True),  # markup that is not the closer is text
    ({"path": "a.py", "code": "x", "mode": "drop", "lines": [1, 2]}, True),
    ({"path": "a.py", "code": "x</parameter>y"}, False),  # would end the value early in the parser's reading
    ({"path": "a-very-long-name.py", "code": "x"}, False),  # maxLength 12
    ({"path": "a.py", "code": "x", "mode": "move"}, False),  # not in the enum
    ({"path": "a.py", "code": "x", "lines": ["one"]}, False),  # items are integers
    ({"code": "x"}, False),  # path is required
])
def test_xml_calls_are_held_to_the_schema_and_read_back_as_written(args, ok):
    from ridgeline.tool_calls.parser import ToolCallParser
    fmt = FORMATS["qwen3_coder"]
    tok, ltok, _ = _tokenizer(True)
    g = call_grammar(fmt, XML_TOOLS, parallel=False, token_ids=_ids(tok, True))
    text = fmt.call_text("edit", args)
    ids = tok.encode(text, add_special_tokens=False).ids
    n, m = _walk(ltok, g, ids)
    assert (n == len(ids) and m.is_accepting()) == ok, tok.decode(ids[:n + 1])
    if ok:  # what the grammar let through, the parser reads back as the arguments written
        p = ToolCallParser(fmt, None, schemas=XML_TOOLS)
        p.feed([], text)
        p.finish()
        assert [json.loads(c.arguments) for c in p.calls] == [args]


def test_xml_free_objects_take_any_parameters_and_unenforceable_strings_are_named():
    from ridgeline.tool_calls.grammar import NotConstrainable
    fmt = FORMATS["qwen3_coder"]
    tok, ltok, _ = _tokenizer(True)
    g = call_grammar(fmt, XML_TOOLS, parallel=False, token_ids=_ids(tok, True))
    ids = tok.encode(fmt.call_text("anything", {"q": "hi", "k2": "there"}), add_special_tokens=False).ids
    n, m = _walk(ltok, g, ids)
    assert n == len(ids) and m.is_accepting()
    for bad in ({"type": "string", "pattern": "^a+$"}, {"type": "string", "format": "email"}):
        with pytest.raises(NotConstrainable, match="x"):
            call_grammar(fmt, {"t": {"type": "object", "properties": {"x": bad}}}, parallel=False)
