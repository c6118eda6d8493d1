"""`ridgeline generate` and `ridgeline chat`: replies stream as the engine steps; chat commands stay local."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.cli import main
from ridgeline.entrypoints.chat import interactive_chat
from ridgeline.entrypoints.stream import stream_replies

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ["--dtype", "float32", "--kv-cache-memory", "16MiB"]
PROMPTS = ["Tell me about the sea.", "And the mountains?"]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), dtype="float32", kv_cache_memory="16MiB")


def _expected(llm, prompts, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return [o.outputs[0].text for o in llm.chat([[{"role": "user", "content": p}] for p in prompts], params,
                                                 use_tqdm=False)]


def test_replies_stream_during_the_steps_in_prompt_order(llm, monkeypatch):
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=12)
    want = _expected(llm, PROMPTS, 12)
    steps, writes = [0], []
    step = engine.step

    def counting_step(*a, **kw):
        steps[0] += 1
        return step(*a, **kw)

    monkeypatch.setattr(engine, "step", counting_step)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"s{i}", llm.tokenizer.encode_chat([{"role": "user", "content": p}]), params)
    got = stream_replies(engine, ["s0", "s1"], lambda s: writes.append((steps[0], s)))
    assert got == want
    assert "".join(s for _, s in writes) == want[0] + "\n" + want[1] + "\n"
    first = writes[:[s for _, s in writes].index("\n")]
    assert len({n for n, _ in first}) > 3  # the first reply came out over many steps, not at the end
    assert not engine.requests and not engine.has_unfinished()
    engine.kv.check_integrity()


def test_cli_generate_prints_each_reply_in_order(tiny_llama, llm, capsys):
    assert main(["generate", *PROMPTS, "--model", str(tiny_llama), *ENGINE, "--max-tokens", "12"]) == 0
    assert capsys.readouterr().out == "".join(t + "\n" for t in _expected(llm, PROMPTS, 12))


class Script:
    """Scripted terminal input; records every prompt shown."""

    def __init__(self, *lines: str):
        self.lines, self.prompts = list(lines), []

    def __call__(self, prompt: str) -> str | None:
        self.prompts.append(prompt)
        return self.lines.pop(0) if self.lines else None


def _chat(llm, script, monkeypatch, write=None):
    """Run a chat; returns the conversations the engine was given (decoded) and what was written."""
    sent, out = [], []
    add = llm.engine.add_request

    def recording_add(rid, ids, *a, **kw):
        add(rid, ids, *a, **kw)
        sent.append(llm.tokenizer.decode(ids))

    monkeypatch.setattr(llm.engine, "add_request", recording_add)
    interactive_chat(llm, SamplingParams(temperature=0, max_tokens=4), read=script, write=write or out.append)
    return sent, "".join(out)


def test_chat_commands_are_not_sent_to_the_model(llm, monkeypatch):
    script = Script("/help", "hello", "/reset", "n", "again", "/reset", "yes", "//slash", "/nope", "/bye", "unread")
    sent, out = _chat(llm, script, monkeypatch)
    assert len(sent) == 3
    assert "hello" in sent[0] and "hello" in sent[1] and "again" in sent[1]  # "/reset" + "n" kept it
    assert "hello" not in sent[2] and "/slash" in sent[2]  # forgotten; '//' sends one '/'
    assert "/reset" in out and "/bye" in out  # the /help text
    assert "(kept)" in out and "(conversation forgotten)" in out and "unknown command /nope" in out
    assert script.lines == ["unread"]  # /bye quit
    assert script.prompts.count(">>> ") == 8 and len(script.prompts) == 10  # 2 confirmations
    assert not llm.engine.requests


def test_chat_ctrl_c_stops_the_reply_and_the_chat_goes_on(llm, monkeypatch):
    out = []

    def write(s: str) -> None:
        if len(out) == 1:  # the banner is out; the first piece of the first reply is interrupted
            out.append("^C")
            raise KeyboardInterrupt
        out.append(s)

    sent, _ = _chat(llm, Script("first", "second", "/exit"), monkeypatch, write)
    assert len(sent) == 2 and "second" in sent[1]
    assert not llm.engine.requests
    llm.engine.kv.check_integrity()


def test_chat_too_long_a_message_is_an_error_and_the_chat_goes_on(llm, monkeypatch):
    sent, out = _chat(llm, Script("x" * 5000, "short", "/exit"), monkeypatch)
    assert "error: " in out and len(sent) == 1 and "x" * 100 not in sent[0]


def test_chat_prompt_and_replies_on_stdout(tiny_llama):
    proc = subprocess.run([sys.executable, "-m", "ridgeline.cli", "chat", "--model", str(tiny_llama), *ENGINE,
                           "--max-tokens", "4"], input="hi\n/help\n/exit\n", capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ridgeline chat:") and proc.stdout.count(">>> ") == 3
    assert "/reset" in proc.stdout and ">>>" not in proc.stderr and "Traceback" not in proc.stderr
