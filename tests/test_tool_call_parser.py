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


def parse(fmt, specials, schemas, chunks, stream=False):
    ids = itertools.count()
    p = ToolCallParser(fmt, specials, schemas=schemas, new_id=lambda: f"call_{next(ids)}", stream_arguments=stream)
    events = []
    for chunk_ids, text in chunks:
        events += p.feed(chunk_ids, text)
    events += p.finish()
    content = "".join(e["content"] for e in events if "content" in e)
    calls = [e["tool_call"] for e in events if "tool_call" in e]
    assert calls == p.calls and content == "".join(p.content)
    assert_pieces_make_the_calls(events, calls)
    return content or None, [(c.index, c.id, c.name, json.loads(c.arguments)) for c in calls]


def assert_pieces_make_the_calls(events, calls):
    """A streamed call: its head first (id, name, no arguments), its argument pieces, then the whole call,
    whose arguments are the pieces' concatenation; no other call's pieces in between."""
    open_call, pieces = None, ""
    for e in events:
        if "tool_call_start" in e:
            assert open_call is None and e["tool_call_start"].arguments == ""
            open_call, pieces = e["tool_call_start"], ""
        elif "tool_call_arguments" in e:
            assert e["tool_call_arguments"]["index"] == open_call.index
            pieces += e["tool_call_arguments"]["arguments"]
        elif e.get("streamed"):
            call = e["tool_call"]
            assert (call.index, call.id, call.name) == (open_call.index, open_call.id, open_call.name)
            assert call.arguments == pieces
            open_call = None
        elif "tool_call" in e:
            assert open_call is None
    assert open_call is None


# harmony's calls are read by its channel splitter, not from markers in text (tests/test_reasoning.py)
TEXT_FORMATS = sorted(n for n, f in FORMATS.items() if f.body != "harmony")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(TEXT_FORMATS), by_id=st.booleans(), before=WORDS, between=WORDS, after=WORDS,
       calls=CALLS.filter(_consistent), cuts=st.lists(st.integers(0, 10_000), max_size=12),
       lags=st.lists(st.floats(0, 1, allow_subnormal=False), min_size=1, max_size=5), stream=st.booleans())
def test_any_chunking_gives_the_whole_reply(fmt, by_id, before, between, after, calls, cuts, lags, stream):
    """stream: arguments come out in pieces as they are written (where a grammar writes the calls)."""
    fmt = FORMATS[fmt]
    text, content = reply(fmt, before, calls, between, after)
    toks, specials = tokens(text, fmt, by_id)
    schemas = _schemas(calls)
    whole = parse(fmt, specials, schemas, [([i for i, _ in toks], "".join(p for _, p in toks))], stream)
    expected_calls = [(k, f"call_{k}", n, a) for k, (n, a) in enumerate(calls)]
    assert whole[1] == expected_calls, text
    assert "".join((whole[0] or "").split()) == "".join((content or "").split()), text  # up to whitespace
    assert parse(fmt, specials, schemas, [([i], p) for i, p in toks], stream) == whole
    assert parse(fmt, specials, schemas, chunked(toks, cuts, lags), stream) == whole


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


JSON_FORMATS = sorted(n for n, f in FORMATS.items() if f.body == "json")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(JSON_FORMATS), calls=CALLS, cut=st.integers(1, 10_000),
       cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_streamed_arguments_come_in_pieces_and_a_cut_call_keeps_them(fmt, calls, cut, cuts):
    """Token by token, each call's arguments arrive in as many pieces as they have characters; a reply
    cut anywhere (max_tokens) gives, in any chunking, the same calls, the last keeping the arguments
    written before the cut."""
    fmt = FORMATS[fmt]
    text, _ = reply(fmt, "Hi.", calls, " ", "")
    events = []
    p = ToolCallParser(fmt, stream_arguments=True)
    for ch in text:
        events += p.feed([], ch)
    events += p.finish()
    for call in p.calls:
        n = sum(1 for e in events if e.get("tool_call_arguments", {}).get("index") == call.index)
        assert n == len(call.arguments)
    cut_text = text[:cut % (len(text) + 1)]

    def streamed(chunks):
        q = ToolCallParser(fmt, stream_arguments=True)
        evs = [e for c in chunks for e in q.feed([], c)] + q.finish()
        assert_pieces_make_the_calls(evs, q.calls)
        return [(c.name, c.arguments) for c in q.calls]

    whole = streamed([cut_text])
    bounds = sorted(set(c % (len(cut_text) + 1) for c in cuts)) + [len(cut_text)]
    assert streamed([cut_text[a:b] for a, b in zip([0] + bounds, bounds)]) == whole
    written = [(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]
    assert len(whole) <= len(written)
    for k, (name, args) in enumerate(whole):  # every call written before the cut, the last maybe cut short
        assert name == written[k][0] and written[k][1].startswith(args)
