"""Grammar compiles tried first in a child process at the lowest CPU priority, under a deadline.

A compile runs inside llguidance (Rust, the GIL released): a thread running one cannot be stopped, so a
grammar that compiles for long would hold a core and a server thread after its request was refused. The
server's compiles (serve/generate.py: compile_structured) therefore go first to a worker process, niced
to 19: it compiles the grammar against the same token table and answers "ok" or the error; past the
deadline it is killed (and restarted for the next compile), the request refused. Only a grammar the
worker compiled in time is compiled again in the server's process, into the cache (a second compile of
a grammar known to be quick: typically under a millisecond). Offline use (LLM.generate) compiles in
process directly.

The channel: utils/pipe_frames.py's frames over the child's stdin/stdout. Parent -> child: the token
table once ({"tokenizer": JSON text, "n_vocab", "eos"}), then {"kind", "text"} per compile; child ->
parent: {"ready"} once the table is built, then {"ok": true} or {"error": text}."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ridgeline.utils.pipe_frames import FrameTimeout, child_output, frame, recv, serve_jobs, write

START_TIMEOUT_S = 60.0  # interpreter, llguidance and the token table: not counted in a compile's deadline
REPLY_LIMIT = 1 << 16


class CompileTimeout(Exception):
    """The worker did not finish compiling within the deadline (it was killed)."""


class CompileWorker:
    """One child process, started when first needed and after a kill; check() is thread-safe (compiles
    queue behind one another: one core at the lowest priority is all they get)."""

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_ids: list[int]):
        self._table = {"tokenizer": tokenizer_json, "n_vocab": n_vocab, "eos": list(eos_ids)}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.kills = 0  # compiles that ran past their deadline

    def _start(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIDGELINE_")}  # no API key or secret
        proc = subprocess.Popen([sys.executable, "-m", "ridgeline.structured.compile_worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                cwd=Path(__file__).resolve().parents[2])  # imports this process's ridgeline
        try:
            write(proc.stdin.fileno(), frame(self._table))
            ready = recv(proc.stdout.fileno(), 1024, time.monotonic() + START_TIMEOUT_S)
        except (EOFError, OSError, ValueError, FrameTimeout):
            ready = {}
        if ready.get("ready") is not True:
            _kill(proc)
            raise RuntimeError(f"the grammar-compile worker did not start: {ready.get('error', 'no reply')}")
        return proc

    def check(self, kind: str, text: str, timeout: float) -> str | None:
        """None if (kind, text) compiles within timeout seconds, else llguidance's error; CompileTimeout
        past the deadline. The worker's start is not counted in the deadline."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            try:
                write(proc.stdin.fileno(), frame({"kind": kind, "text": text}))
                reply = recv(proc.stdout.fileno(), REPLY_LIMIT, time.monotonic() + timeout)
            except FrameTimeout:
                self.kills += 1
                self._proc = None
                _kill(proc)
                raise CompileTimeout() from None
            except (EOFError, OSError, ValueError):
                self._proc = None
                _kill(proc)
                return "the compile failed (its worker process exited)"
        return None if reply.get("ok") is True else str(reply.get("error", "the compile failed"))

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                _kill(self._proc)
                self._proc = None


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdin.close()
    proc.stdout.close()


# ---- the child ---------------------------------------------------------------------------------
def _compile(tok, job: dict) -> dict:
    import llguidance as llg

    from ridgeline.structured.llg_grammar import grammar_of_key, limits
    kind, text = job.get("kind"), job.get("text")
    if not isinstance(kind, str) or not isinstance(text, str):
        return {"error": "a malformed compile job"}
    try:
        m = llg.LLMatcher(tok, grammar_of_key(kind, text), log_level=0, limits=limits())
    except ValueError as e:
        return {"error": str(e)}
    return {"error": m.get_error()} if m.is_error() else {"ok": True}


def main() -> int:
    out = child_output()
    try:
        os.nice(19)
    except OSError:
        pass
    import llguidance as llg
    table = recv(0, 1 << 30, None)
    try:
        tok = llg.LLTokenizer(table["tokenizer"], n_vocab=table["n_vocab"], eos_token=table["eos"])
    except (KeyError, TypeError, ValueError) as e:
        write(out, frame({"error": str(e)[:200]}))
        return 1
    write(out, frame({"ready": True}))
    return serve_jobs(out, 1 << 30, lambda job: frame(_compile(tok, job)))


if __name__ == "__main__":
    sys.exit(main())
