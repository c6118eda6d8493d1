"""Teacher-forced training data for an EAGLE head: the target's hidden states over fixed text.

One prefill of a chunk gives the target's final hidden state at every position of it (what its LM
head reads, so the head's targets are still the target's own predictions), thousands of tokens per
second where sampling replies gives tens. Two shapes of the same text:

- `text:FILE`: the file's paragraphs packed into chunks of at most `chunk_tokens` tokens, plain text;
- `chat:FILE`: each paragraph the assistant's reply to a short user turn ("Describe {topic} in a
  few sentences.", the topic the paragraph's title line when it has one), rendered with the
  model's chat template, so the head also sees the template's turns as chat traffic has them.

FILE is a path, or `calibration`: the package's public-domain calibration text (World Factbook
country profiles, ridgeline/data/texts/README.md), which shares no paragraph with the held-out
text `ridgeline eval` scores nor with the benchmark workloads' corpus."""
from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import torch

from ridgeline.errors import InvalidRequestError
from ridgeline.data.corpus import TEXTS
from ridgeline.speculative.train_data import ASKS, Sample

# user turns of `chat:` conversations; written for this project, none of them a benchmark prompt
TITLE_WORDS = 8  # a paragraph of at most this many words is a title: the topic of those after it


def resolve_text(name: str) -> Path:
    if name == "calibration":
        return TEXTS / "calibration.txt"
    path = Path(name)
    if not path.is_file():
        raise InvalidRequestError(f"training text {name!r} is not a file (or 'calibration', the bundled text)", "data")
    if path.resolve().name == "heldout.txt" and path.resolve().parent.name == "texts":
        raise InvalidRequestError("heldout.txt is what `ridgeline eval` scores; train on other text", "data")
    return path


def paragraphs(path: Path) -> list[tuple[str | None, str]]:
    """(title or None, paragraph) for each paragraph (blank-line separated) longer than a title."""
    out, title = [], None
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        text = " ".join(block.split())
        if not text:
            continue
        if len(text.split()) <= TITLE_WORDS:
            title = text
        else:
            out.append((title, text))
    return out


def plain_chunks(tok, paras: list[tuple[str | None, str]], chunk_tokens: int) -> list[list[int]]:
    """Paragraphs in order, packed into chunks of at most chunk_tokens (a longer paragraph is cut)."""
    chunks, cur = [], []
    for _, text in paras:
        ids = tok.encode(text, add_special_tokens=False)
        if cur and len(cur) + len(ids) > chunk_tokens:
            chunks.append(cur)
            cur = []
        cur = (cur + ids)[:chunk_tokens]
    return chunks + ([cur] if cur else [])


def chat_conversations(tok, paras: list[tuple[str | None, str]], seed: int, max_tokens: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for title, text in paras:
        ask = rng.choice(ASKS).format(topic=title or "this subject")
        msgs = [{"role": "user", "content": ask}, {"role": "assistant", "content": text}]
        if tok.chat_template:
            ids = tok.encode_chat(msgs, add_generation_prompt=False)
        else:
            ids = tok.encode(f"user: {ask}\nassistant: {text}\n")
        out.append(ids[:max_tokens])
    return out


def source_sequences(tok, spec: str, seed: int, max_tokens: int) -> list[list[int]]:
    """Token sequences of one `text:FILE` / `chat:FILE` source, shuffled by seed."""
    kind, _, name = spec.partition(":")
    paras = paragraphs(resolve_text(name))
    seqs = plain_chunks(tok, paras, max_tokens) if kind == "text" else chat_conversations(tok, paras, seed, max_tokens)
    random.Random(seed).shuffle(seqs)
    return [s for s in seqs if len(s) > 2]


def teacher_forced(eng, seqs: list[list[int]], num_tokens: int, desc: str, progress: bool = True) -> Iterator[Sample]:
    """The target's hidden states over seqs, in order, until their tokens reach num_tokens."""
    from tqdm import tqdm
    done = 0
    with tqdm(total=min(num_tokens, sum(map(len, seqs))), unit="tok", desc=desc, disable=not progress) as bar:
        for ids in seqs:
            if done >= num_tokens:
                return
            hidden = eng.prompt_hidden(ids)
            yield Sample(torch.tensor(ids), hidden.to("cpu", torch.bfloat16))  # trained on the CPU
            done += len(ids)
            bar.update(len(ids))
