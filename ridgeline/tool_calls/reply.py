"""One parser per choice for a chat reply: the reasoning section split off first (reasoning.py), the
answer then through the tool-call parser (parser.py) where the request has tools. Events, in order:
{"reasoning": text}, {"content": text}, {"tool_call": ToolCall}. A whole reply is one feed and a
finish, so the streamed and the unstreamed reply agree whatever the chunking."""
from __future__ import annotations

from collections.abc import Sequence

from ridgeline.tool_calls.parser import ToolCall, ToolCallParser
from ridgeline.tool_calls.reasoning import ReasoningSplitter


class ReplyParser:
    def __init__(self, reasoning: ReasoningSplitter | None, tools: ToolCallParser | None,
                 keep_reasoning: bool = True):
        self.reasoning, self.tools, self.keep_reasoning = reasoning, tools, keep_reasoning
        self.content: list[str] = []
        self.reasoning_text: list[str] = []

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools is not None else []

    @property
    def done(self) -> bool:
        """No more calls will be taken (parallel_tool_calls false and its call is in)."""
        return self.tools is not None and self.tools.done

    def feed(self, ids: Sequence[int], text: str) -> list[dict]:
        if self.reasoning is None:
            return self._answer(list(ids), text, final=False)
        thought, answer, answer_ids = self.reasoning.feed(ids, text)
        return self._thought(thought) + self._answer(answer_ids, answer, final=False) + self._taken()

    def finish(self) -> list[dict]:
        out: list[dict] = []
        if self.reasoning is not None:
            thought, answer, answer_ids = self.reasoning.finish()
            out = self._thought(thought) + self._answer(answer_ids, answer, final=False) + self._taken()
        return out + self._answer([], "", final=True)

    def _taken(self) -> list[dict]:
        """Calls the splitter read itself (harmony's messages addressed to a function), into the tool parser."""
        if self.tools is None:
            return []
        events = self.tools.take_events(self.reasoning.take_call_events())
        self.content.extend(e["content"] for e in events if "content" in e)
        return events

    def _thought(self, text: str) -> list[dict]:
        if not text or not self.keep_reasoning:
            return []
        self.reasoning_text.append(text)
        return [{"reasoning": text}]

    def _answer(self, ids: list[int], text: str, final: bool) -> list[dict]:
        if self.tools is None:
            if text:
                self.content.append(text)
                return [{"content": text}]
            return []
        events = self.tools.feed(ids, text) if (ids or text) else []
        if final:
            events += self.tools.finish()
        self.content.extend(e["content"] for e in events if "content" in e)
        return events

    def whole(self, ids: Sequence[int], text: str) -> tuple[str | None, str | None, list[ToolCall]]:
        """A whole reply: (reasoning or None, content or None, calls)."""
        self.feed(ids, text)
        self.finish()
        return "".join(self.reasoning_text) or None, "".join(self.content) or None, self.calls
