"""The editing workloads: "rename this identifier in the code" (code-edit) and "rewrite this text
with one change" (text-edit). The reply repeats the prompt's code or text almost token for token, as
edits do, which is where drafting from the prompt (n-gram lookup) pays. Built from the shipped
corpora, deterministic per (seed, request)."""
from __future__ import annotations

import random
import re

from ridgeline.bench import code_corpus, corpus
from ridgeline.bench.chat_encode import chat_encoder

_INSTRUCTIONS = [
    'Rewrite the text below exactly as it is, but replace the word "{old}" with "{new}" everywhere. '
    "Reply with the rewritten text only.\n\n{text}",
    'Here is a paragraph from our documentation:\n\n{text}\n\nCopy it back with one change: every "{old}" '
    'becomes "{new}". Change nothing else.',
    'Edit this text: change "{old}" to "{new}" and keep every other word the same.\n\n{text}',
]
_NEW_WORDS = ["banana", "window", "engine", "planet", "marble", "violin", "lantern", "harbor", "pencil", "garden"]
_WORD = re.compile(r"\b[a-z]{5,}\b")


_CODE_INSTRUCTIONS = [
    "Rename `{old}` to `{new}` in this Python code. Reply with the complete code only.\n\n```python\n{code}```",
    "```python\n{code}```\n\nRefactor: the name `{old}` should be `{new}`. Show the whole updated code.",
    "In the code below, replace the identifier `{old}` with `{new}` and change nothing else.\n\n"
    "```python\n{code}```",
]
_NEW_NAMES = ["values", "store", "amount", "board", "memo", "table", "pending", "subtotal"]


def code_edit_workload(tokenizer, num_requests: int, seed: int = 0) -> list[list[int]]:
    """num_requests chat prompts (token ids): a shipped program and the rename of one identifier."""
    encode = chat_encoder(tokenizer)
    prompts = []
    for i in range(num_requests):
        rng = random.Random(f"code-edit/{seed}/{i}")
        old, code = code_corpus.SNIPPETS[(seed + i) % len(code_corpus.SNIPPETS)]
        new = rng.choice([w for w in _NEW_NAMES if w != old])
        body = rng.choice(_CODE_INSTRUCTIONS).format(old=old, new=new, code=code)
        prompts.append(encode([{"role": "user", "content": body}]))
    return prompts


def text_edit_workload(tokenizer, num_requests: int, seed: int = 0) -> list[list[int]]:
    """num_requests chat prompts (token ids): a corpus passage and the edit of one of its words."""
    encode = chat_encoder(tokenizer)
    prompts = []
    for i in range(num_requests):
        rng = random.Random(f"code-edit/{seed}/{i}")  # the seeds of the earlier prose-only code-edit
        _, text = corpus.PASSAGES[rng.randrange(len(corpus.PASSAGES))]
        words = sorted(set(_WORD.findall(text)))
        old = rng.choice(words)
        new = rng.choice([w for w in _NEW_WORDS if w != old])
        body = rng.choice(_INSTRUCTIONS).format(old=old, new=new, text=text)
        prompts.append(encode([{"role": "user", "content": body}]))
    return prompts
