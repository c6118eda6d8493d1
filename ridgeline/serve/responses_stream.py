"""The Responses API's event stream: a ChatRun's deltas as OpenAI's semantic SSE events
(`event: <type>` / `data: {...}`, each with its sequence_number).

  response.created, response.in_progress
  reasoning item:  output_item.added, content_part.added, reasoning_text.delta..., reasoning_text.done,
                   content_part.done, output_item.done
  message item:    output_item.added, content_part.added, output_text.delta..., output_text.done,
                   content_part.done, output_item.done
  function calls:  output_item.added, function_call_arguments.delta, function_call_arguments.done,
                   output_item.done (one each)
  response.completed, or response.incomplete (cut at max_output_tokens); an error: error, response.failed

Items stream in the whole reply's order (responses_output.py): the reasoning item closes when the
answer starts, the message at the end of the reply, and the function calls (each parsed whole) are
sent after it, so the terminal event's response equals the non-streamed one but for ids and times."""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from ridgeline.serve.chat_run import ChatRun
from ridgeline.serve.json_body import dumps
from ridgeline.serve.responses_output import (call_item, finished, message_item, message_status, new_id,
                                              reasoning_item, reasoning_part, response_usage, text_part)
from ridgeline.tool_calls.parser import ToolCall


def frame(event: dict) -> str:
    return f"event: {event['type']}\ndata: {dumps(event)}\n\n"


class _Open:
    """An item being streamed: its output index, id and text so far."""

    def __init__(self, index: int, item_id: str):
        self.index, self.id, self.text = index, item_id, ""


class ResponseEvents:
    """One response's events; `failed` gives the in-band events for an error (sse_response's on_error)."""

    def __init__(self, run: ChatRun, head: dict, tok):
        self.run, self.head, self.tok = run, head, tok
        self.seq = 0
        self.opened = 0  # output indexes handed out
        self.done: dict[int, dict] = {}  # finished items by output index
        self.reasoning: _Open | None = None
        self.message: _Open | None = None
        self.thought: str | None = None  # the reasoning item's whole text, once closed
        self.calls: list[ToolCall] = []

    def event(self, kind: str, **fields) -> dict:
        e = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return e

    async def events(self) -> AsyncIterator[dict]:
        yield self.event("response.created", response=self.head)
        yield self.event("response.in_progress", response=self.head)
        finish = None
        async for d in self.run.deltas():
            for e in self._delta(d.delta):
                yield e
            finish = d.finish_reason or finish
        for e in self._end(finish):
            yield e

    def failed(self, e) -> list[dict]:
        # the response's error code is one of OpenAI's few; the error event carries Ridgeline's own
        code = {400: "invalid_prompt", 429: "rate_limit_exceeded"}.get(e.status, "server_error")
        error = {"code": code, "message": e.message}
        return [self.event("error", code=e.code or e.type, message=e.message, param=e.param),
                self.event("response.failed", response={**self.head, "status": "failed", "error": error,
                                                        "output": self.output()})]

    def output(self) -> list[dict]:
        return [self.done[i] for i in sorted(self.done)]

    def _open(self, prefix: str) -> _Open:
        self.opened += 1
        return _Open(self.opened - 1, new_id(prefix))

    def _delta(self, delta: dict) -> Iterator[dict]:
        if delta.get("reasoning_content"):
            yield from self._reasoning_text(delta["reasoning_content"])
        elif delta.get("content"):
            yield from self._close_reasoning()
            yield from self._text(delta["content"])
        for call in delta.get("tool_calls") or ():  # a call's head, then pieces of its arguments
            fn = call["function"]
            if "id" in call:
                self.calls.append(ToolCall(call["index"], call["id"], fn["name"], fn["arguments"]))
            else:
                head = self.calls[-1]
                self.calls[-1] = ToolCall(head.index, head.id, head.name, head.arguments + fn["arguments"])

    def _reasoning_text(self, text: str) -> Iterator[dict]:
        r = self.reasoning
        if r is None:
            r = self.reasoning = self._open("rs")
            yield self.event("response.output_item.added", output_index=r.index,
                             item={"type": "reasoning", "id": r.id, "summary": [], "content": []})
            yield self.event("response.content_part.added", item_id=r.id, output_index=r.index, content_index=0,
                             part=reasoning_part(""))
        r.text += text
        yield self.event("response.reasoning_text.delta", item_id=r.id, output_index=r.index, content_index=0,
                         delta=text)

    def _close_reasoning(self) -> Iterator[dict]:
        r = self.reasoning
        if r is None or self.thought is not None:
            return
        self.thought = r.text
        common = dict(item_id=r.id, output_index=r.index, content_index=0)
        yield self.event("response.reasoning_text.done", **common, text=r.text)
        yield self.event("response.content_part.done", **common, part=reasoning_part(r.text))
        item = self.done[r.index] = reasoning_item(r.id, r.text)
        yield self.event("response.output_item.done", output_index=r.index, item=item)

    def _text(self, text: str) -> Iterator[dict]:
        m = self.message
        if m is None:
            m = self.message = self._open("msg")
            yield self.event("response.output_item.added", output_index=m.index,
                             item=message_item(m.id, None, "in_progress"))
            yield self.event("response.content_part.added", item_id=m.id, output_index=m.index, content_index=0,
                             part=text_part(""))
        m.text += text
        yield self.event("response.output_text.delta", item_id=m.id, output_index=m.index, content_index=0,
                         delta=text, logprobs=[])

    def _end(self, finish: str | None) -> Iterator[dict]:
        yield from self._close_reasoning()
        if self.message is None and not self.calls:
            yield from self._text("")  # the reply said nothing: an empty message, as the whole reply has
        m = self.message
        if m is not None:
            common = dict(item_id=m.id, output_index=m.index, content_index=0)
            yield self.event("response.output_text.done", **common, text=m.text, logprobs=[])
            yield self.event("response.content_part.done", **common, part=text_part(m.text))
            item = self.done[m.index] = message_item(m.id, m.text, message_status(finish))
            yield self.event("response.output_item.done", output_index=m.index, item=item)
        for call in self.calls:
            yield from self._call(call)
        usage = response_usage(self.run.usage(), self.thought, self.tok)
        response = finished(self.head, self.output(), finish, usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield self.event(kind, response=response)

    def _call(self, call: ToolCall) -> Iterator[dict]:
        index, item_id = self.opened, new_id("fc")
        self.opened += 1
        yield self.event("response.output_item.added", output_index=index,
                         item=call_item(item_id, call, "", "in_progress"))
        yield self.event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                         delta=call.arguments)
        yield self.event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                         name=call.name, arguments=call.arguments)
        item = self.done[index] = call_item(item_id, call)
        yield self.event("response.output_item.done", output_index=index, item=item)
