"""One incremental parser per reply: feed it each delta's token ids and text, it returns content text
outside calls and each call once it is complete; finish() flushes the rest. A whole reply is one
feed and a finish, so streamed and non-streamed results agree whatever the chunking.

Markers that are special tokens of the tokenizer are matched by id: the reply is decoded with its
special tokens kept (their text appears where they were generated), and a special token's text is
read as that token only after its id arrived, so a marker typed as ordinary text after the last
special id is plain text, and no detokenizer split can cut a marker (a partial one is held back).
Special tokens that are no marker (an end-of-turn token) are dropped from the content.

Whitespace-only content next to calls is dropped; a block that does not parse comes back as
content, as it was written, so nothing the model wrote is lost.

With stream_arguments (the calls are written by a grammar, so a call that begins is a call), JSON
calls come out as they are written (arg_stream.py): {"tool_call_start": ToolCall with empty
arguments}, then {"tool_call_arguments": {"index", "arguments": piece}} as the text arrives, then the
whole {"tool_call": ToolCall, "streamed": True}; the arguments are the text the model wrote. Without
it, each call comes out whole once its block closed, its arguments re-serialized."""
from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ridgeline.tool_calls.arg_stream import ArgStream
from ridgeline.tool_calls.formats import LEADING_SPACE, CallFormat

_TEXT, _CALL, _DONE = 0, 1, 2
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_SEPARATORS = " \t\r\n;,"


@dataclass(frozen=True)
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str  # JSON text of an object

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def delta(self) -> dict:
        return {"index": self.index, **self.openai()}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of text that is a proper start of one of markers."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def _first(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str]:
    hits = [(i, m) for m in markers if (i := text.find(m, start)) >= 0]
    return min(hits, key=lambda h: (h[0], -len(h[1]))) if hits else (-1, "")


class ToolCallParser:
    """fmt: the call format. specials: the tokens matched by id (id -> their text, which the fed text
    carries where they were generated): the format's markers the tokenizer has as tokens, and, when
    the text is decoded with special tokens kept, every special token (those that are no marker are
    dropped). None: every marker is matched as text.
    schemas: tool name -> its parameters schema (types the XML format's values). max_calls: calls
    kept at most (parallel_tool_calls false: 1); after the last, the rest of the reply is dropped.
    stream_arguments: JSON calls come out as they are written (the module's docstring)."""

    def __init__(self, fmt: CallFormat, specials: Mapping[int, str] | None = None, *,
                 schemas: Mapping[str, dict] | None = None, max_calls: int | None = None,
                 new_id: Callable[[], str] = new_call_id, stream_arguments: bool = False):
        self.fmt, self.schemas, self.max_calls, self.new_id = fmt, schemas or {}, max_calls, new_id
        self._streams = stream_arguments and fmt.body == "json"
        self.streams_taken = stream_arguments and fmt.body == "harmony"  # take_events: arguments in pieces
        self._taken_name: str | None = None  # the function of the call take_events has open
        self._scan: ArgStream | None = None  # the open block's scanner (stream_arguments)
        self._started: ToolCall | None = None  # the call whose arguments are coming
        self.specials = dict(specials or {})
        special_texts = set(self.specials.values())
        self._by_id = {m for m in fmt.markers if m in special_texts}
        self._by_text = [m for m in (fmt.start, *fmt.also_starts) if m not in self._by_id]
        self._end_by_text = fmt.end is not None and fmt.end not in self._by_id
        self._pending: Counter[str] = Counter()  # special tokens whose id came, their text not yet
        self._raw = ""  # fed text not yet split into special tokens and plain text
        self._text = ""  # plain text not yet given out (TEXT) or the block's body (CALL)
        self._opened = ""  # the marker that opened the current block
        self._ws = ""  # whitespace-only content held back
        self._state = _TEXT
        self._seen_text = False  # any non-whitespace content or call so far
        self.calls: list[ToolCall] = []
        self.content: list[str] = []

    @property
    def done(self) -> bool:
        """max_calls calls are in: nothing more will come out."""
        return self._state == _DONE

    def feed(self, ids: Sequence[int], text: str) -> list[dict]:
        """One delta -> events: {"content": str} and {"tool_call": ToolCall}, in order."""
        out: list[dict] = []
        if self._state == _DONE:
            return out
        for i in ids:
            t = self.specials.get(i)
            if t is not None:
                self._pending[t] += 1
        self._raw += text
        self._split(out, final=False)
        return out

    def finish(self) -> list[dict]:
        out: list[dict] = []
        if self._state != _DONE:
            self._split(out, final=True)
            if self._state == _CALL:
                body, self._text = self._text, ""
                self._close_block(out, body, "")
        if not self.calls and self._ws:
            out.append({"content": self._ws})
            self.content.append(self._ws)
        self._ws = ""
        return out

    # ---- special tokens out of the raw text ---------------------------------------------------
    def _split(self, out: list[dict], final: bool) -> None:
        while self._raw and self._state != _DONE:
            live = [t for t, n in self._pending.items() if n > 0]
            i, special = _first(self._raw, live)
            if i < 0:
                keep = 0 if final else _held(self._raw, live)
                plain, self._raw = self._raw[:len(self._raw) - keep], self._raw[len(self._raw) - keep:]
                self._plain(out, plain, final)
                return
            plain, self._raw = self._raw[:i], self._raw[i + len(special):]
            self._pending[special] -= 1
            self._plain(out, plain, True)
            self._special(out, special)
        if final and self._state != _DONE:
            self._plain(out, "", True)

    def _special(self, out: list[dict], token: str) -> None:
        if token not in self._by_id or self._state == _DONE:
            return  # an end-of-turn or other special token: not content
        if self._state == _TEXT and token in (self.fmt.start, *self.fmt.also_starts):
            self._open(out, token)
        elif self._state == _CALL and token == self.fmt.end:
            body, self._text = self._text, ""
            self._close_block(out, body, token)
        elif self._state == _CALL:
            self._text += token
        else:
            self._content(out, token)  # an end marker outside a block: as written

    # ---- plain text through the state machine -------------------------------------------------
    def _plain(self, out: list[dict], text: str, final: bool) -> None:
        self._text += text
        while self._state != _DONE:
            if self._state == _CALL:
                j = self._text.find(self.fmt.end) if self._end_by_text else -1
                if self._scan is not None:  # up to the end marker, or what cannot still become one
                    upto = j if j >= 0 else len(self._text) - (
                        _held(self._text, (self.fmt.end,)) if self._end_by_text and not final else 0)
                    self._steps(out, self._scan.advance(self._text[:upto]))
                    if self._state == _DONE:
                        return
                if j < 0:
                    return
                body, self._text = self._text[:j], self._text[j + len(self.fmt.end):]
                self._close_block(out, body, self.fmt.end)
                continue
            if self.fmt.leading_json and not self._seen_text:
                head = self._text.lstrip(LEADING_SPACE)
                if head.startswith("{"):
                    self._ws += self._text[:len(self._text) - len(head)]
                    self._text = head
                    self._open(out, "")
                    continue
                if not head and not final:
                    return  # whitespace so far: a call may still begin
            i, marker = _first(self._text, self._by_text)
            if i < 0:
                keep = 0 if final else _held(self._text, self._by_text)
                self._content(out, self._text[:len(self._text) - keep])
                self._text = self._text[len(self._text) - keep:]
                return
            before, self._text = self._text[:i], self._text[i + len(marker):]
            self._content(out, before)
            self._open(out, marker)

    def _open(self, out: list[dict], marker: str) -> None:
        self._opened, self._state = marker, _CALL
        self._scan = ArgStream() if self._streams else None

    def _close_block(self, out: list[dict], body: str, closer: str) -> None:
        """body: the block's text between its markers (self._text already holds what follows)."""
        self._state = _TEXT
        scan, self._scan = self._scan, None
        if scan is not None and scan.opened:  # its calls are out; what follows the last is read whole
            self._steps(out, scan.finish())
            rest = body[scan.pos:]
            if self._state != _DONE and rest.strip(_SEPARATORS + "[]}"):
                calls = self._json_calls(rest.lstrip(_SEPARATORS + "]}"))
                if calls is None:
                    self._content(out, rest + closer)
                else:
                    self._add_calls(out, calls)
            return
        calls = self._calls(body)
        if calls is None:
            self._content(out, self._opened + body + closer)
            return
        self._add_calls(out, calls)

    def take(self, name: str, arguments: str) -> list[dict]:
        """A call another reader found (harmony's channels: the function it is addressed to and the message
        body): kept as this parser keeps its own, arguments a JSON object; anything else is content."""
        out: list[dict] = []
        if self._state == _DONE:
            return out
        call = self._json_call({"name": name, "arguments": arguments.strip()})
        if call is None:
            self._content(out, arguments)
        else:
            self._add_calls(out, [call])
        return out

    def take_events(self, events: list[tuple[str, str]]) -> list[dict]:
        """Calls another reader found as they came (HarmonySplitter.take_call_events): with streams_taken, the
        call opens at its start, its arguments follow in the reply's pieces and it closes with the text written
        (a grammar held it to the schema); as take() otherwise."""
        out: list[dict] = []
        if self.streams_taken:
            self._steps(out, [e for e in events if e[0] != "piece" or e[1]])
            return out
        for kind, text in events:
            if kind == "open":
                self._taken_name = text  # the call's close may come in a later feed
            elif kind == "close" and self._taken_name is not None:
                out += self.take(self._taken_name, text)
                self._taken_name = None
        return out

    def _steps(self, out: list[dict], steps: list[tuple[str, str]]) -> None:
        """The scanner's steps as events (arg_stream.py): a call opens, its arguments come, it closes."""
        for kind, text in steps:
            if self._state == _DONE:
                return
            if kind == "open":
                self._seen_text, self._ws = True, ""
                self._started = ToolCall(len(self.calls), self.new_id(), text, "")
                out.append({"tool_call_start": self._started})
            elif kind == "piece":
                out.append({"tool_call_arguments": {"index": self._started.index, "arguments": text}})
            else:
                call = dataclasses.replace(self._started, arguments=text)
                self._started = None
                self.calls.append(call)
                out.append({"tool_call": call, "streamed": True})
                if self.max_calls is not None and len(self.calls) >= self.max_calls:
                    self._state, self._text, self._raw = _DONE, "", ""

    def _add_calls(self, out: list[dict], calls: list[tuple[str, str]]) -> None:
        self._seen_text = True
        for name, args in calls:
            self._ws = ""
            call = ToolCall(len(self.calls), self.new_id(), name, args)
            self.calls.append(call)
            out.append({"tool_call": call})
            if self.max_calls is not None and len(self.calls) >= self.max_calls:
                self._state, self._text, self._raw = _DONE, "", ""
                return

    def _content(self, out: list[dict], text: str) -> None:
        if not text:
            return
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        text, self._ws = self._ws + body, text[len(body):]  # trailing whitespace waits for what follows
        self._seen_text = True
        out.append({"content": text})
        self.content.append(text)

    # ---- a block's body -> calls ------------------------------------------------------------------
    def _calls(self, body: str) -> list[tuple[str, str]] | None:
        return self._xml_calls(body) if self.fmt.body == "xml" else self._json_calls(body)

    def _json_calls(self, body: str) -> list[tuple[str, str]] | None:
        decoder, calls, i = json.JSONDecoder(), [], 0
        while True:
            while i < len(body) and body[i] in _SEPARATORS:
                i += 1
            if i == len(body):
                return calls or None
            try:
                value, i = decoder.raw_decode(body, i)
            except (ValueError, RecursionError):
                return None
            for item in value if isinstance(value, list) else [value]:
                call = self._json_call(item)
                if call is None:
                    return None
                calls.append(call)

    def _json_call(self, item) -> tuple[str, str] | None:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get(self.fmt.args_key, item.get("arguments", item.get("parameters", {})))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        return item["name"], json.dumps(args, ensure_ascii=False)

    def _xml_calls(self, body: str) -> list[tuple[str, str]] | None:
        found = list(_FUNCTION.finditer(body))
        if not found or _FUNCTION.sub("", body).strip():
            return None
        calls = []
        for f in found:
            name = f.group(1).strip()
            props = (self.schemas.get(name) or {}).get("properties") or {}
            args = {p.group(1).strip(): _xml_value(p.group(2), props.get(p.group(1).strip()))
                    for p in _PARAMETER.finditer(f.group(2))}
            calls.append((name, json.dumps(args, ensure_ascii=False)))
        return calls


def _xml_value(raw: str, schema) -> object:
    """A parameter's text as its schema's type (a string stays as written)."""
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def parse_all(parser: ToolCallParser, ids: Sequence[int], text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole reply: (content or None, calls)."""
    parser.feed(ids, text)
    parser.finish()
    content = "".join(parser.content)
    return (content or None), parser.calls
