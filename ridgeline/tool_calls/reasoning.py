"""Reasoning models: the section a model thinks in before it answers (`<think>...</think>` for
DeepSeek-R1, Qwen3, QwQ, SmolLM3, GLM; `[THINK]...[/THINK]` for Magistral), split from the answer so
the reply's `reasoning_content` holds it and `content` the answer.

The format is found in the chat template (the end marker's text in its source). A reply starts inside
the section when the rendered prompt left one open (DeepSeek-R1's generation prompt ends in `<think>`);
otherwise a section may open at the very start of the reply (Qwen3 writes `<think>` first). Markers the
tokenizer has as tokens are matched by id, as the tool-call parser does (a marker typed as text after
the last such id stays text, and no detokenizer split can cut one); the others by text, a partial one
held back. The splitter hands the answer on with the special-token ids it carried, so the tool-call
parser downstream sees exactly what it would have seen without reasoning.

`with_reasoning` lets a constraint (a JSON schema, a choice, the tool-call grammars) start after the
section: free text up to the end marker, then the constraint."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ridgeline.structured_params import COMPACT_JSON, StructuredOutputs
from ridgeline.tool_calls import harmony_grammar
from ridgeline.tool_calls.parser import _held


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str
    end: str

    @property
    def markers(self) -> tuple[str, str]:
        return self.start, self.end


@dataclass(frozen=True)
class HarmonyFormat(ReasoningFormat):
    """GPT-OSS's harmony: a reply is messages `<|channel|>NAME<|message|>TEXT<|end|>`, a new one opened by
    `<|start|>assistant`; the `analysis` channel is the reasoning, the others (`final`, `commentary`) the answer.
    Its markers are all tokens, matched by id (HarmonySplitter)."""
    header: str = "<|start|>"
    message: str = "<|message|>"

    @property
    def markers(self) -> tuple[str, ...]:
        return self.header, self.start, self.message, self.end


THINK = ReasoningFormat("think", "<think>", "</think>")
MAGISTRAL = ReasoningFormat("magistral", "[THINK]", "[/THINK]")
HARMONY = HarmonyFormat("harmony", "<|channel|>", "<|end|>")
REASONING_FORMATS = {f.name: f for f in (THINK, MAGISTRAL, HARMONY)}


def detect_reasoning(template: str | None) -> ReasoningFormat | None:
    """The format whose markers the template's source writes (None: not a reasoning template); harmony's
    channel and message markers together, else a section's end marker."""
    if template and HARMONY.start in template and HARMONY.message in template:
        return HARMONY
    for f in (THINK, MAGISTRAL):
        if template and f.end in template:
            return f
    return None


def opens_reasoning(fmt: ReasoningFormat, rendered_prompt: str) -> bool:
    """The prompt ends inside a section: its last start marker comes after its last end marker (harmony: a
    reply always starts with its own channel header)."""
    if isinstance(fmt, HarmonyFormat):
        return False
    return rendered_prompt.rfind(fmt.start) > rendered_prompt.rfind(fmt.end)


_START, _REASONING, _CONTENT = 0, 1, 2


class ReasoningSplitter:
    """feed(ids, text) -> (reasoning text, answer text, the special-token ids the answer carried).
    specials: id -> text of every token matched by id (the reasoning markers that are tokens, and
    whatever the tool-call parser downstream matches by id); in_reasoning: the prompt opened a section;
    forward: the special tokens the answer keeps (those the tool-call parser reads; None: all), others
    (an end of turn) are dropped from it."""

    def __init__(self, fmt: ReasoningFormat, specials: Mapping[int, str], in_reasoning: bool,
                 forward: set[str] | None = None):
        self.fmt = fmt
        self.forward = forward
        self.specials = dict(specials)
        self._ids = {t: i for i, t in self.specials.items()}
        self._by_id = {m for m in fmt.markers if m in self._ids}
        self._pending: Counter[str] = Counter()
        self._raw = ""  # fed text not yet split into special tokens and plain text
        self._text = ""  # plain text held back (a possible partial marker, or leading whitespace)
        self._state = _REASONING if in_reasoning else _START
        self._strip = False  # the answer's leading blank space after a section is dropped

    def take_call_events(self) -> list[tuple[str, str]]:
        """Tool calls this splitter read itself (harmony's, HarmonySplitter): none in a thinking section."""
        return []

    def feed(self, ids: Sequence[int], text: str) -> tuple[str, str, list[int]]:
        for i in ids:
            t = self.specials.get(i)
            if t is not None:
                self._pending[t] += 1
        self._raw += text
        return self._split(final=False)

    def finish(self) -> tuple[str, str, list[int]]:
        return self._split(final=True)

    def _split(self, final: bool) -> tuple[str, str, list[int]]:
        out = {"reasoning": [], "content": [], "ids": []}
        while True:
            live = [t for t, n in self._pending.items() if n > 0]
            hits = [(i, t) for t in live if (i := self._raw.find(t)) >= 0]
            if not hits:
                keep = 0 if final else _held(self._raw, live)
                plain, self._raw = self._raw[:len(self._raw) - keep], self._raw[len(self._raw) - keep:]
                self._plain(out, plain, final)
                break
            i, special = min(hits, key=lambda h: (h[0], -len(h[1])))
            plain, self._raw = self._raw[:i], self._raw[i + len(special):]
            self._pending[special] -= 1
            self._plain(out, plain, False)
            self._special(out, special)
        return "".join(out["reasoning"]), "".join(out["content"]), out["ids"]

    def _special(self, out: dict, token: str) -> None:
        """A token matched by id; the plain text before it is in self._text (held back, if anything)."""
        if token in self._by_id:
            if token == self.fmt.start and self._state == _START and not self._text.strip():
                self._text, self._state = "", _REASONING
                return
            if token == self.fmt.end and self._state == _REASONING:
                out["reasoning"].append(self._text)
                self._text, self._state = "", _CONTENT
                self._strip = True
                return
        if self._state == _START:
            self._flush_start(out)
        elif self._state == _REASONING:
            out["reasoning"].append(self._text)
            self._text = ""
        else:
            out["content"].append(self._text)
            self._text, self._strip = "", False
        if token in self.fmt.markers:  # a reasoning marker that opens or closes nothing here: as written
            out["reasoning" if self._state == _REASONING else "content"].append(token)
        elif self._state == _CONTENT and (self.forward is None or token in self.forward):
            out["content"].append(token)
            out["ids"].append(self._ids[token])
        # any other special token inside the reasoning (an end of turn, a tool-call marker): not reasoning text

    def _flush_start(self, out: dict) -> None:
        out["content"].append(self._text)
        self._text, self._state = "", _CONTENT
        self._strip = False

    def _plain(self, out: dict, text: str, final: bool) -> None:
        self._text += text
        while True:
            if self._state == _START:
                head = self._text.lstrip()
                start_by_text = self.fmt.start not in self._by_id
                if start_by_text and head.startswith(self.fmt.start):
                    self._text, self._state = head[len(self.fmt.start):], _REASONING
                    continue
                if not final and (not head or (start_by_text and self.fmt.start.startswith(head))):
                    return  # whitespace, or a start marker's beginning: a section may still open
                self._flush_start(out)
                continue
            if self._state == _REASONING:
                end_by_text = self.fmt.end not in self._by_id
                j = self._text.find(self.fmt.end) if end_by_text else -1
                if j < 0:
                    keep = _held(self._text, [self.fmt.end]) if end_by_text and not final else 0
                    out["reasoning"].append(self._text[:len(self._text) - keep])
                    self._text = self._text[len(self._text) - keep:]
                    return
                out["reasoning"].append(self._text[:j])
                self._text, self._state = self._text[j + len(self.fmt.end):], _CONTENT
                self._strip = True
                continue
            if self._strip:  # the blank line between the section and the answer
                stripped = self._text.lstrip()
                if not stripped and not final:
                    return
                self._text, self._strip = stripped, False
            out["content"].append(self._text)
            self._text = ""
            return


_HEADER, _BODY, _BETWEEN = 0, 1, 2
CALL_END = "<|call|>"  # harmony: the end of a message addressed to a function
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")  # the function a message is addressed to


class HarmonySplitter(ReasoningSplitter):
    """Harmony replies (GPT-OSS) split by channel: the text of `analysis` messages is the reasoning, that of
    the other channels the answer; headers (`assistant`, `<|channel|>final`, a recipient such as
    ` to=functions.f`) and the markers are not text of either. A reply written without any harmony marker is
    the answer as it is. Same feed / finish contract as ReasoningSplitter, whatever the chunking: every marker
    is a token matched by id.

    calls: a message addressed to a function (`to=functions.NAME` in its header) is a tool call, its body the
    arguments, ended by `<|call|>` (or `<|end|>`, or the reply's end: `<|call|>` stops generation); each call goes
    to `take_call_events()` (it opens, its body's pieces, it closes) instead of the answer. Without calls such a
    message is answer text, as any other channel's."""

    def __init__(self, fmt: HarmonyFormat, specials: Mapping[int, str], forward: set[str] | None = None,
                 calls: bool = False):
        super().__init__(fmt, specials, False, forward)
        self._hstate = _HEADER  # the reply opens in the assistant's header (the prompt wrote <|start|>assistant)
        self._channel: str | None = None  # the header's text after <|channel|>, None before one
        self._pre = ""  # the header's text before <|channel|> (`assistant to=functions.f`)
        self._target = "content"
        self._seen = False  # a harmony marker came: header text is not the answer
        self._calls_on = calls
        self._call: list | None = None  # [function name, its body so far] while in a call's message
        # the calls as they come, in arg_stream's steps: ("open", function name), ("piece", text), ("close",
        # arguments text), in order
        self._call_events: list[tuple[str, str]] = []

    def take_call_events(self) -> list[tuple[str, str]]:
        """The calls since the last take as they came (a call's arguments in the pieces the reply wrote)."""
        out, self._call_events = self._call_events, []
        return out

    def _end_call(self) -> None:
        if self._call is not None:
            self._call_events.append(("close", self._call[1]))
            self._call = None

    def finish(self) -> tuple[str, str, list[int]]:
        out = self._split(final=True)
        self._end_call()  # the reply ended inside a call's message: <|call|> stopped it
        return out

    def _special(self, out: dict, token: str) -> None:
        f = self.fmt
        if token == CALL_END and self._call is not None:  # the call's message ends
            self._end_call()
            self._hstate = _BETWEEN
            return
        if token not in f.markers:  # an end of turn (<|return|>, <|call|>), <|constrain|>: neither text, unless
            if self._hstate == _BODY and self._target == "content" and (self.forward is None
                                                                          or token in self.forward):
                out["content"].append(token)  # a token the answer keeps (one the decode shows as text)
                out["ids"].append(self._ids[token])
            return
        self._seen = True
        if self._hstate == _HEADER and token == f.start:
            self._pre, self._channel, self._text = self._text, "", ""  # a recipient may come before the channel
        elif self._hstate == _HEADER and token == f.message:
            name = (self._channel if self._channel is not None else self._text).strip().split(" ")[0]
            self._target = "reasoning" if name == "analysis" else "content"
            to = _RECIPIENT.search(f"{self._pre} {self._text} {self._channel or ''}")
            if self._calls_on and to is not None:
                self._call, self._target = [to.group(1), ""], "call"
                self._call_events.append(("open", to.group(1)))
            self._hstate, self._text = _BODY, ""
        elif self._hstate == _BODY and token == f.end:
            self._end_call()
            self._hstate = _BETWEEN
        elif token == f.header:
            self._hstate, self._channel, self._text, self._pre = _HEADER, None, "", ""
        # any other marker out of place (a <|message|> inside a message): not text, the state unchanged

    def _plain(self, out: dict, text: str, final: bool) -> None:
        if self._hstate == _BODY:
            if text and self._call is not None:
                self._call[1] += text
                self._call_events.append(("piece", text))
            elif text:
                out[self._target].append(text)
            return
        if self._hstate == _HEADER:
            if self._channel is not None:
                self._channel += text
            else:
                self._text += text
            if final and not self._seen and self._text:  # no harmony at all: the reply is the answer
                out["content"].append(self._text)
                self._text = ""
        # between messages: nothing is text


def with_reasoning(spec: StructuredOutputs, fmt: ReasoningFormat, token_ids: Mapping[str, int],
                   opened: bool, budget: int | None = None) -> StructuredOutputs:
    """spec, applied after the reasoning section: free text to the end marker (the section the prompt
    opened, or one the reply may open with the start marker), then the constraint; harmony: after the
    analysis message, the final channel's message is the constraint. A JSON schema, JSON object or choice;
    other kinds are refused (their grammar cannot be nested here yet)."""
    body = _constraint_body(spec)
    if isinstance(fmt, HarmonyFormat):
        grammar = harmony_grammar.with_analysis(harmony_grammar.final_rules(body, token_ids), token_ids, budget)
    else:
        grammar = wrap_grammar(f"start: {body}\n", fmt, token_ids, opened, budget)
    return StructuredOutputs(grammar=grammar, field=spec.field)


def _constraint_body(spec: StructuredOutputs) -> str:
    """The constraint as one Lark expression."""
    if spec.kind == "json":
        return f"%json {json.dumps({**json.loads(spec.json), 'x-guidance': COMPACT_JSON})}"
    if spec.kind == "json_object":
        return f"%json {json.dumps({'type': 'object', 'x-guidance': COMPACT_JSON})}"
    if spec.kind == "choice":
        return " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
    from ridgeline.errors import InvalidRequestError
    raise InvalidRequestError(f"{spec.field}: a {spec.kind.replace('_', ' ')} cannot be enforced after a "
                              "reasoning section yet; give a JSON schema or choices, or turn thinking off "
                              "(chat_template_kwargs)", spec.field, code="unsupported_parameter")


def wrap_tool_grammar(grammar: str, fmt: ReasoningFormat, token_ids: Mapping[str, int], opened: bool,
                      budget: int | None = None) -> str:
    """A tool-call grammar (grammar.py's, or harmony_grammar's calls) after the reasoning section."""
    if isinstance(fmt, HarmonyFormat):
        return harmony_grammar.with_analysis(grammar, token_ids, budget)
    return wrap_grammar(grammar, fmt, token_ids, opened, budget)


def budget_only(fmt: ReasoningFormat, token_ids: Mapping[str, int], opened: bool, budget: int) -> StructuredOutputs:
    """No constraint but a thinking budget: the section ends after `budget` tokens at most, the answer is free."""
    return StructuredOutputs(grammar=wrap_grammar("start: ANSWER\nANSWER: /(.|\\n)*/\n", fmt, token_ids, opened,
                                                  budget), field="thinking_token_budget")


def _lit(text: str, token_ids: Mapping[str, int]) -> str:
    return f"<[{token_ids[text]}]>" if text in token_ids else json.dumps(text, ensure_ascii=False)


def wrap_grammar(grammar: str, fmt: ReasoningFormat, token_ids: Mapping[str, int], opened: bool,
                 budget: int | None = None) -> str:
    """A Lark grammar whose first line is its `start` rule, preceded by the reasoning section: required
    (the prompt opened it: text up to the end marker) or optional (the start marker, text, the end
    marker), then the blank space models write after it. budget: the section's text ends after that
    many tokens at most, the end marker forced there (it must be a token: BudgetNeedsToken otherwise)."""
    first, _, rest = grammar.partition("\n")
    if not first.startswith("start:"):
        raise ValueError("the grammar's first line must be its start rule")
    end = _lit(fmt.end, token_ids)
    opener = "" if opened else _lit(fmt.start, token_ids) + " "
    section = "think" if opened else "think?"
    if budget is not None:
        if fmt.end not in token_ids:
            raise BudgetNeedsToken(fmt.end)
        think = [f"think: {opener}think_text {end}", f"think_text[max_tokens={int(budget)}]: THINK_TEXT"]
    elif fmt.end in token_ids:  # a token: the text before it cannot contain it
        think = [f"think: {opener}THINK_TEXT {end}"]
    else:
        think = [f"think[lazy]: {opener}THINK_TEXT {end}"]
    return "\n".join([f"start: {section} THINK_WS ({first[len('start:'):].strip()})", *think,
                      "THINK_TEXT: /(.|\\n)*/", "THINK_WS: /[ \\t\\r\\n]*/", rest]).rstrip("\n") + "\n"


class BudgetNeedsToken(ValueError):
    """A thinking budget is enforced at a token count, which needs the end marker to be one token."""
