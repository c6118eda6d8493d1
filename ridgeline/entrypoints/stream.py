"""Replies written to a terminal as the engine produces them: in request order, all requests in one batch."""
from __future__ import annotations

import sys
from collections.abc import Callable


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def stream_replies(engine, request_ids: list[str], write: Callable[[str], None] = write_stdout) -> list[str]:
    """Step the engine until every request in `request_ids` (already added, n == 1) has finished.

    The first unfinished request's text is written as it grows; the texts of later requests are kept
    and written when their turn comes, so each reply appears whole, in order, ended by a newline,
    while the engine decodes them all together. Returns the final texts in order. Whatever is still
    running when this returns or raises (Ctrl-C) is aborted, so no KV block stays held."""
    texts = {rid: "" for rid in request_ids}
    finished: set[str] = set()
    turn, shown = 0, 0  # request_ids[turn] is being written; `shown` characters of it are out
    try:
        while turn < len(request_ids):
            for out in engine.step():
                if out.request_id in texts:
                    texts[out.request_id] += "".join(c.text for c in out.outputs)  # deltas
                    if out.finished:
                        finished.add(out.request_id)
            while turn < len(request_ids):
                text = texts[request_ids[turn]]
                if len(text) > shown:
                    write(text[shown:])
                    shown = len(text)
                if request_ids[turn] not in finished:
                    break
                write("\n")
                turn, shown = turn + 1, 0
    finally:
        for rid in request_ids[turn:]:
            engine.abort_request(rid)  # a no-op for requests that finished
    return [texts[rid] for rid in request_ids]
