"""The tool-call parser of every format: a reply fed in any chunking (token by token, in one piece,
at random splits with the text lagging the ids as a detokenizer's does) gives the same content and
calls as the whole reply, and those are the calls that were written, several per message included;
with markers as special tokens they are matched by id and other special tokens leave the content."""
from __future__ import annotations

import itertools
import json

from hypothesis import HealthCheck, given, settings, strategies as st

from ridgeline.tool_calls.formats import FORMATS, HERMES, LLAMA3_JSON, CallFormat
from ridgeline.tool_calls.parser import ToolCallParser, parse_all

EOT = "<|eot|>"
WORDS = st.text(alphabet="abcdefghij XYZ.,!?\n", min_size=1, max_size=12).filter(lambda s: s.strip())
VALUES = st.one_of(st.integers(-99, 999), st.text(alphabet="abc xyz-", max_size=8))
ARGS = st.dictionaries(st.sampled_from(["city", "n", "unit", "q"]), VALUES, max_size=3)
CALLS = st.lists(st.tuples(st.sampled_from(["get_weather", "search", "add"]), ARGS), min_size=1, max_size=3)


def _schemas(calls) -> dict:
    """Per tool, the types its XML values are read as (the last call's argument types)."""
    out: dict = {}
    for name, args in calls:
        props = out.setdefault(name, {"type": "object", "properties": {}})["properties"]
        for k, v in args.items():
            props[k] = {"type": "string" if isinstance(v, str) else "integer"}
    return out


def _consistent(calls) -> bool:
    types: dict = {}
    return all(types.setdefault((n, k), type(v)) is type(v) for n, a in calls for k, v in a.items())


def reply(fmt: CallFormat, before: str, calls, between: str, after: str) -> tuple[str, str | None]:
    """(the reply's text, the content it should parse to)."""
    if fmt.leading_json:
        return "; ".join(fmt.call_text(n, a) for n, a in calls), None
    if fmt.listed:
        items = ", ".join(fmt.call_text(n, a)[len(fmt.start):len(fmt.call_text(n, a)) - len(fmt.end or "")][1:-1]
                          for n, a in calls)
        block = f"{fmt.start}[{items}]{fmt.end or ''}"
        tail = after if fmt.end else ""
        return f"{before}\n{block}{tail}", before + tail
    text = before + "\n" + f"\n{between}\n".join(fmt.call_text(n, a) for n, a in calls) + after
    return text, before + (between * (len(calls) - 1)) + after


def tokens(text: str, fmt: CallFormat, by_id: bool) -> tuple[list[tuple[int, str]], dict[int, str]]:
    """One token per character, each marker (and a closing end-of-turn token) one token by id."""
    specials = {900 + i: m for i, m in enumerate(fmt.markers)} if by_id else {}
    out, i = [], 0
    ids = {m: k for k, m in specials.items()}
    while i < len(text):
        m = next((m for m in sorted(ids, key=len, reverse=True) if text.startswith(m, i)), None)
        if m is not None:
            out.append((ids[m], m))
            i += len(m)
        else:
            out.append((ord(text[i]), text[i]))
            i += 1
    if by_id:
        specials[999] = EOT
        out.append((999, EOT))
    return out, specials


def chunked(toks, cuts: list[int], lags: list[float]):
    """Chunks of ids ending at each cut; each chunk's text ends somewhere at or before its ids'."""
    ends = sorted(set(c % (len(toks) + 1) for c in cuts)) + [len(toks)]
    pos = list(itertools.accumulate(len(p) for _, p in toks))
    text = "".join(p for _, p in toks)
    chunks, t_at, prev = [], 0, 0
    for k, end in enumerate(ends):
        ids = [i for i, _ in toks[prev:end]]
        limit = pos[end - 1] if end else 0
        t_end = len(text) if end == len(toks) else t_at + int((limit - t_at) * lags[k % len(lags)])
        chunks.append((ids, text[t_at:t_end]))
        t_at, prev = t_end, end
    return chunks


def parse(fmt, specials, schemas, chunks):
    ids = itertools.count()
    p = ToolCallParser(fmt, specials, schemas=schemas, new_id=lambda: f"call_{next(ids)}")
    events = []
    for chunk_ids, text in chunks:
        events += p.feed(chunk_ids, text)
    events += p.finish()
    content = "".join(e["content"] for e in events if "content" in e)
    calls = [e["tool_call"] for e in events if "tool_call" in e]
    assert calls == p.calls and content == "".join(p.content)
    return content or None, [(c.index, c.id, c.name, json.loads(c.arguments)) for c in calls]


# harmony's calls are read by its channel splitter, not from markers in text (tests/test_reasoning.py)
TEXT_FORMATS = sorted(n for n, f in FORMATS.items() if f.body != "harmony")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(TEXT_FORMATS), by_id=st.booleans(), before=WORDS, between=WORDS, after=WORDS,
       calls=CALLS.filter(_consistent), cuts=st.lists(st.integers(0, 10_000), max_size=12),
       lags=st.lists(st.floats(0, 1, allow_subnormal=False), min_size=1, max_size=5))
def test_any_chunking_gives_the_whole_reply(fmt, by_id, before, between, after, calls, cuts, lags):
    fmt = FORMATS[fmt]
    text, content = reply(fmt, before, calls, between, after)
    toks, specials = tokens(text, fmt, by_id)
    schemas = _schemas(calls)
    whole = parse(fmt, specials, schemas, [([i for i, _ in toks], "".join(p for _, p in toks))])
    expected_calls = [(k, f"call_{k}", n, a) for k, (n, a) in enumerate(calls)]
    assert whole[1] == expected_calls, text
    assert "".join((whole[0] or "").split()) == "".join((content or "").split()), text  # up to whitespace
    assert parse(fmt, specials, schemas, [([i], p) for i, p in toks]) == whole
    assert parse(fmt, specials, schemas, chunked(toks, cuts, lags)) == whole


def test_a_marker_typed_as_text_is_text_when_markers_are_tokens():
    """The tokenizer has <tool_call> as a token: the same characters spelled out are content."""
    p = ToolCallParser(HERMES, {900: "<tool_call>", 901: "</tool_call>"})
    text = 'see <tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert parse_all(p, [ord(c) for c in text], text) == (text, [])


def test_a_block_that_does_not_parse_is_content():
    p = ToolCallParser(HERMES)
    assert parse_all(p, [], "x <tool_call>{not json}</tool_call>") == ("x <tool_call>{not json}</tool_call>", [])


def test_max_calls_drops_the_rest():
    text = "".join(HERMES.call_text(n, {}) for n in "abc") + "and more"
    p = ToolCallParser(HERMES, max_calls=1)
    content, calls = parse_all(p, [], text)
    assert [c.name for c in calls] == ["a"] and content is None and p.done


def test_llama_reply_that_is_plain_json_stays_content():
    p = ToolCallParser(LLAMA3_JSON)
    assert parse_all(p, [], '{"answer": 42}') == ('{"answer": 42}', [])
