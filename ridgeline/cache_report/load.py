"""Logged request bodies (one OpenAI-style JSON body per line) -> prompt token ids, as the server
would tokenize them: chat bodies through the model's chat template, completion bodies as given. Only
the prompt is read, with the checks the server and the offline API share (ridgeline/inputs.py): the
rest of a body (sampling fields, anything unknown) is not the report's concern."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import RidgelineError
from ridgeline.inputs import chat_messages, prompt_list


@dataclass
class LoggedPrompt:
    line: int  # 1-based line number in the file
    ids: list[int]
    salt: str | None  # the body's cache_salt


def load_prompts(path: str | Path, tokenizer) -> tuple[list[LoggedPrompt], list[str]]:
    """(prompts in file order, one problem message per line that could not be used)."""
    prompts: list[LoggedPrompt] = []
    problems: list[str] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise RidgelineError(f"cannot read {path}: {e.strerror}") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = _parse(line)
            prompts += [LoggedPrompt(no, ids, body.get("cache_salt")) for ids in _tokenize(body, tokenizer)]
        except (ValueError, RidgelineError) as e:
            problems.append(f"line {no}: {_short(e)}")
    return prompts, problems


def _parse(line: str) -> dict:
    try:
        body = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


def _tokenize(body: dict, tokenizer) -> list[list[int]]:
    if "messages" in body:
        text = tokenizer.apply_chat_template(chat_messages(body["messages"]))
        return [tokenizer.encode(text, add_special_tokens=False)]
    if "prompt" in body:
        prompts = prompt_list(body["prompt"], "prompt")
        if not prompts:
            raise ValueError("prompt: must not be empty")
        return [tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    raise ValueError("neither `messages` (chat) nor `prompt` (completion)")


def _short(e: Exception) -> str:
    if isinstance(e, RidgelineError):
        return e.message
    return str(e).splitlines()[0][:120]
