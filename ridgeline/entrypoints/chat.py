"""`ridgeline chat`: a conversation in the terminal, replies streamed, on the offline engine.

Everything the user sees (prompt, replies, command answers) goes to stdout; start-up logs go to stderr.
"""
from __future__ import annotations

import itertools
import sys
from collections.abc import Callable

from ridgeline.entrypoints.stream import stream_replies, write_stdout
from ridgeline.errors import RidgelineError
from ridgeline.sampling_params import SamplingParams

try:
    import readline  # noqa: F401  line editing and history for input(), which then prompts on stdout
except ImportError:  # not on every platform
    readline = None

HELP = """commands:
  /help, /?      this list
  /reset         forget the conversation so far (asks first)
  /bye, /exit    quit (Ctrl-D too)
Ctrl-C stops a reply. To send a message that starts with '/', type it with '//' (one '/' is dropped)."""

Reader = Callable[[str], "str | None"]


def read_line(prompt: str) -> str | None:
    """One line of input after `prompt` on stdout; None at the end of input. On a terminal without the
    readline module input() would print the prompt on stderr, so it is written here instead."""
    try:
        if readline is None and sys.stdin.isatty() and sys.stdout.isatty():
            write_stdout(prompt)
            return input()
        return input(prompt)
    except EOFError:
        return None


def interactive_chat(llm, params: SamplingParams, system: str | None = None, read: Reader = read_line,
                     write: Callable[[str], None] = write_stdout) -> None:
    start = [{"role": "system", "content": system}] if system else []
    history = list(start)
    write("ridgeline chat: type a message; /help lists the commands, /bye or Ctrl-D quits\n")
    turns = itertools.count()
    while True:
        line = read(">>> ")
        if line is None:
            write("\n")
            return
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and not text.startswith("//"):
            command = text.split()[0].lower()
            if command in ("/bye", "/exit"):
                return
            if command in ("/help", "/?"):
                write(HELP + "\n")
            elif command == "/reset":
                answer = read("forget the conversation so far? [y/N] ")
                if answer is None:
                    write("\n")
                    return
                forget = answer.strip().lower() in ("y", "yes")
                history = list(start) if forget else history
                write("(conversation forgotten)\n" if forget else "(kept)\n")
            else:
                write(f"unknown command {command}; /help lists the commands\n")
            continue
        content = text[1:] if text.startswith("//") else text
        history.append({"role": "user", "content": content})
        reply = _reply(llm, history, params, f"chat-{next(turns)}", write)
        if reply is None:
            history.pop()
        else:
            history.append({"role": "assistant", "content": reply})


def _reply(llm, history: list[dict], params: SamplingParams, rid: str, write) -> str | None:
    """Stream one reply; None when the engine refused the conversation (the user turn is then dropped)."""
    try:
        llm.engine.add_request(rid, llm.tokenizer.encode_chat(history), params)
    except RidgelineError as e:
        write(f"error: {e.message}" + ("; /reset starts over" if len(history) > 1 else "") + "\n")
        return None
    shown: list[str] = []

    def tee(s: str) -> None:
        shown.append(s)
        write(s)

    try:
        return stream_replies(llm.engine, [rid], tee)[0]
    except KeyboardInterrupt:  # the reply stops here (stream_replies aborted it); the chat goes on
        write("\n")
        return "".join(shown)
