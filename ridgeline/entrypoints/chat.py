"""Interactive streaming chat in the terminal, on the offline engine."""
from __future__ import annotations

import sys

from ridgeline.sampling_params import SamplingParams


def interactive_chat(llm, params: SamplingParams, system: str | None = None) -> None:
    engine, tok = llm.engine, llm.tokenizer
    history: list[dict] = [{"role": "system", "content": system}] if system else []
    print("ridgeline chat: type a message, Ctrl-D to quit, /reset to forget the conversation", file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        if not line.strip():
            continue
        if line.strip() == "/reset":
            history = history[:1] if system else []
            continue
        history.append({"role": "user", "content": line})
        rid = f"chat-{turn}"
        turn += 1
        engine.add_request(rid, tok.encode_chat(history), params)
        shown = 0
        text = ""
        try:
            while engine.has_unfinished():
                for out in engine.step():
                    text = out.outputs[0].text
                    sys.stdout.write(text[shown:])
                    sys.stdout.flush()
                    shown = len(text)
        except KeyboardInterrupt:
            engine.abort_request(rid)
        print()
        history.append({"role": "assistant", "content": text})
