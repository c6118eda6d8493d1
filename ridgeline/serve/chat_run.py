"""A chat completion as every API that maps onto one runs it: OpenAI's chat route, and the Responses,
Anthropic Messages and ollama APIs, which translate their bodies into a ChatCompletionRequest and the
results back. start_chat checks, renders, admits and starts the job; ChatRun.deltas() streams each
choice's parsed pieces in OpenAI's delta shape, ChatRun.choices() waits for the whole reply. Both go
through the same per-choice parser (reasoning split, tool calls), so the streamed and the whole reply
agree whatever the chunking."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from ridgeline.sampling_params import SamplingParams
from ridgeline.serve import reasoning
from ridgeline.serve.generate import Job, Prompt, accept, admitted, compile_structured, request_namespace
from ridgeline.serve.limits import TextBound
from ridgeline.serve.logprobs import TokenTexts, chat_logprobs
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.tools import ToolPlan, plan as tool_plan
from ridgeline.tool_calls.parser import ToolCall


@dataclass
class Choice:
    """One choice of a finished reply, parsed."""
    index: int
    content: str | None
    reasoning: str | None  # None: no reasoning section (or include_reasoning false)
    tool_calls: list[ToolCall]
    finish_reason: str | None  # "tool_calls" where the reply ended in calls
    logprobs: object  # chat_logprobs' JSON text, or None
    num_tokens: int

    def message(self) -> dict:
        """OpenAI's assistant message."""
        message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:  # both names: vLLM moved from reasoning_content to reasoning
            message["reasoning_content"] = message["reasoning"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [call.openai() for call in self.tool_calls]
        return message


@dataclass
class Delta:
    """One streamed piece of a choice. delta: OpenAI's ({"content"}, {"reasoning_content", "reasoning"},
    {"tool_calls": [one call]} or {} carrying only logprobs or the finish reason). A call comes whole, or,
    where a grammar writes it, as its head ({index, id, type, function: {name, arguments: ""}}) then
    pieces of its arguments ({index, function: {arguments}})."""
    index: int
    delta: dict
    logprobs: object = None
    finish_reason: str | None = None


class ChatRun:
    """One started chat job: its id, its response head and its choices' parsers."""

    def __init__(self, job: Job, rid: str, head: dict, params: SamplingParams, tok, rp, tools: ToolPlan | None):
        self.job, self.rid, self.head, self.params, self.tok = job, rid, head, params, tok
        self._rp, self._tools = rp, tools

    def parser(self):
        """A new per-choice reply parser (None: the reply is plain content)."""
        return reasoning.reply_parser(self._rp, self._tools)

    @property
    def n(self) -> int:
        return self.params.n

    def usage(self) -> dict:
        return self.job.usage()

    async def choices(self, request: Request) -> list[Choice]:
        """Wait for the whole reply (aborted if the client goes away); closes the job."""
        [out] = await self.job.results(request)
        texts = TokenTexts(self.tok)
        result = []
        for c in out.outputs:
            logprobs = chat_logprobs(texts, c.logprobs)
            parser = self.parser()
            if parser is None:
                result.append(Choice(c.index, c.text, None, [], c.finish_reason, logprobs, len(c.token_ids)))
                continue
            thought, content, calls = parser.whole(c.token_ids, c.text)
            finish = "tool_calls" if calls and (parser.done or c.finish_reason == "stop") else c.finish_reason
            result.append(Choice(c.index, content, thought, calls, finish, logprobs, len(c.token_ids)))
        return result

    async def deltas(self, whole_calls: bool = False) -> AsyncIterator[Delta]:
        """The choices' pieces as they come; whole_calls: each call in one delta once complete (for APIs
        that stream no arguments in pieces). The caller closes the job (sse_response does)."""
        texts = TokenTexts(self.tok)
        parsers = [self.parser() for _ in range(self.n)]
        async for out in self.job:
            for c in out.outputs:
                parser = parsers[c.index]
                logprobs = chat_logprobs(texts, c.logprobs)
                if parser is not None:
                    for d in _parsed_deltas(parser, c, logprobs, whole_calls):
                        yield d
                elif c.text or c.logprobs or c.finish_reason:
                    yield Delta(c.index, {"content": c.text} if c.text else {}, logprobs, c.finish_reason)


async def start_chat(state, body: ChatCompletionRequest, request: Request, rid: str, route: str) -> ChatRun:
    """Check the body (400s name its fields), render the conversation through the model's template (tools,
    reasoning variables), admit and start the job. route: the path named in logs."""
    params = accept(state, body, route)
    tok = state.engine.tokenizer
    messages = [m.as_template_input() for m in body.messages]
    extra = reasoning.template_variables(body, tok)  # chat_template_kwargs, reasoning_effort
    tools: ToolPlan | None = None
    if uses_tools(body):
        tools = await state.offload(rid, tool_plan, body, tok, state.render, params, messages)
        messages, params = tools.messages, tools.params
        extra.update(tools.extra)
    rp, params = reasoning.plan(reasoning.reasoning_format(state.settings.reasoning_parser, tok), tok, params,
                                tools.specials if tools is not None else None, body)
    with admitted(state, 1, params.n) as hold:
        prompt = await state.offload(rid, render_prompt, tok, messages, state.render, state.text_bound, extra)
        params = reasoning.after_prompt(rp, prompt.text, params)  # a constraint starts after the reasoning
        await compile_structured(state, params, rid)
        job = await Job.start(state, rid, [prompt], params, body.max_tokens_field,
                              request_namespace(state, request, body.cache_salt), hold)
    head = {"id": rid, "created": int(time.time()), "model": body.model,
            "system_fingerprint": state.system_fingerprint}
    return ChatRun(job, rid, head, params, tok, rp, tools)


def uses_tools(body: ChatCompletionRequest) -> bool:
    return (body.tools is not None or body.tool_choice is not None or body.parallel_tool_calls is not None
            or any(m.role == "tool" or m.tool_calls or m.tool_call_id is not None for m in body.messages))


def render_prompt(tok, messages: list[dict], render=None, bound: TextBound | None = None,
                  extra: dict | None = None) -> Prompt:
    """Render and tokenize (on the server's executor: a long conversation takes a while). render: the
    server's bounded renderer (None: in this thread); bound: rendered text longer cannot fit; extra:
    more template variables (tools)."""
    extra = extra or {}
    text = tok.apply_chat_template(messages, render=render, **extra)
    if bound is not None:
        bound.check(text, "messages")
    return Prompt(tok.encode_chat(messages, rendered=text, render=render, **extra), text)  # contents never parse specials


def _delta(event: dict, whole_calls: bool) -> dict | None:
    """A parser event as OpenAI's delta (None: nothing to send)."""
    if "reasoning" in event:
        return {"reasoning_content": event["reasoning"], "reasoning": event["reasoning"]}
    if "content" in event:
        return {"content": event["content"]}
    if whole_calls:
        return {"tool_calls": [event["tool_call"].delta()]} if "tool_call" in event else None
    if "tool_call_start" in event:
        return {"tool_calls": [event["tool_call_start"].delta()]}
    if "tool_call_arguments" in event:
        piece = event["tool_call_arguments"]
        return {"tool_calls": [{"index": piece["index"], "function": {"arguments": piece["arguments"]}}]}
    return None if event.get("streamed") else {"tool_calls": [event["tool_call"].delta()]}


def _parsed_deltas(parser, c, logprobs, whole_calls: bool):
    """One engine delta through the choice's parser: Deltas, the logprobs on the first, the finish reason
    on the last."""
    events = parser.feed(c.token_ids, c.text)
    if c.finish_reason:
        events += parser.finish()
    deltas = [d for e in events if (d := _delta(e, whole_calls)) is not None]
    finish = c.finish_reason
    if finish and parser.calls and (parser.done or finish == "stop"):
        finish = "tool_calls"
    if not deltas and (logprobs or finish):
        deltas = [{}]
    for k, d in enumerate(deltas):
        yield Delta(c.index, d, logprobs if k == 0 else None, finish if k == len(deltas) - 1 else None)
