"""Chat-template rendering with a deadline and an output cap: in child processes (Linux, macOS).

A template runs Python-level loops, filters and string operations that no in-process sandbox can
interrupt or size (`{{ 'x' | center(10**10) }}` is one C call), so the server renders in a worker
process: it is killed at the deadline, stops producing output past the cap, and has its address
space limited, so a template that loops or grows without end costs one worker and at most the
deadline of CPU, never the server's memory or a stuck thread.

The channel is the child's stdin/stdout pipes (private to the two processes): utils/pipe_frames.py's
frames, sizes checked before reading. Parent -> child:
{"template", "context"}; child -> parent: {"ready"} once, then {"text"} or {"error"} per job.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ridgeline.utils.pipe_frames import FrameTimeout, child_output, frame, recv, serve_jobs, write
from ridgeline.weights.chat_template import TemplateFailure, compile_template, render

START_TIMEOUT_S = 60.0  # a worker's start (interpreter and jinja2 import), not counted in a render's deadline
_MEMORY_BASE = 1 << 30  # address space a worker may add to what it has at start, plus 16 x max_bytes


class _Worker:
    def __init__(self, max_bytes: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIDGELINE_")}  # no API key or secret
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ridgeline.weights.template_worker", str(max_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            cwd=Path(__file__).resolve().parents[2])  # imports this process's ridgeline
        self.reply_limit = 6 * max_bytes + 4096  # JSON escapes a control character in 6 bytes
        try:
            ready = recv(self.proc.stdout.fileno(), 1024, time.monotonic() + START_TIMEOUT_S)
        except (EOFError, OSError, ValueError, FrameTimeout):
            ready = {}
        if ready.get("ready") is not True:
            self.kill()
            raise RuntimeError("the chat-template worker process did not start")

    def call(self, job: dict, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        write(self.proc.stdin.fileno(), frame(job))
        return recv(self.proc.stdout.fileno(), self.reply_limit, deadline)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class TemplateWorkers:
    """Up to `size` worker processes, started when first needed; render() fits Tokenizer's Render.
    Thread-safe (the server renders on its executor's threads)."""

    def __init__(self, timeout: float, max_bytes: int, size: int = 4):
        self.timeout, self.max_bytes = timeout, max_bytes
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._closed = False

    def render(self, source: str, context: dict) -> str:
        with self._slots:
            worker = self._take()
            try:
                reply = worker.call({"template": source, "context": context}, self.timeout)
            except FrameTimeout:
                worker.kill()
                raise TemplateFailure(f"the chat template did not finish rendering these messages within "
                                      f"{self.timeout:g}s (--chat-template-timeout)") from None
            except (EOFError, OSError, ValueError):
                worker.kill()  # it died (its memory limit) or sent what it must not: never reused
                raise TemplateFailure("the chat template failed on these messages (its worker process "
                                      "exited)") from None
            self._give(worker)
        if isinstance(reply.get("text"), str):
            return reply["text"]
        raise TemplateFailure(str(reply.get("error", "the chat template failed on these messages")))

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the chat-template workers are closed")
            if self._idle:
                return self._idle.pop()
        return _Worker(self.max_bytes)

    def _give(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        """Stop the idle workers; a busy one stops when its render ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


# ---- the child ---------------------------------------------------------------------------------
def _limit_memory(max_bytes: int) -> None:
    try:
        import resource
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = now + _MEMORY_BASE + 16 * max_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, OSError, ValueError):  # no /proc or no RLIMIT_AS: the deadline still holds
        pass


def _job(job: dict, compiled: dict, max_bytes: int) -> dict:
    source, context = job.get("template"), job.get("context")
    if not isinstance(source, str) or not isinstance(context, dict):
        return {"error": "a malformed chat-template job"}
    try:
        if source not in compiled:
            if len(compiled) >= 4:
                compiled.clear()
            compiled[source] = compile_template(source)
        return {"text": render(compiled[source], context, max_bytes)}
    except TemplateFailure as e:
        return {"error": str(e)}


def _reply(job: dict, compiled: dict, max_bytes: int) -> bytes:
    reply = _job(job, compiled, max_bytes)
    try:
        return frame(reply)
    except UnicodeEncodeError:  # a lone surrogate the template made up
        return frame({"error": "the chat template produced text that is not valid Unicode"})
    except MemoryError:
        return frame({"error": "the chat template ran out of memory on these messages"})


def main(argv: list[str]) -> int:
    max_bytes = int(argv[0])
    out = child_output()
    _limit_memory(max_bytes)
    compiled: dict = {}
    write(out, frame({"ready": True}))
    return serve_jobs(out, 1 << 31, lambda job: _reply(job, compiled, max_bytes))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
