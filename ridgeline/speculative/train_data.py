"""Self-distillation data for an EAGLE head: the target's own sampled replies to varied prompts, and
its final hidden state at every position of prompt + reply.

Prompts come from the shipped seeds (spec/prompts/: every template filled with every topic, written
for this project, public domain), shuffled by the seed, each rendered as a user turn with the
model's chat template (plain text without one). Replies are sampled from the target (temperature,
top-p, a seed per request derived from the run's seed), so the data is reproducible."""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

import torch

from ridgeline.sampling_params import SamplingParams


@dataclass
class Sample:
    tokens: torch.Tensor  # [n] int64, prompt + reply
    hidden: torch.Tensor  # [n, H] bf16, the target's final hidden state at each position


def seed_prompts(seed: int) -> list[str]:
    base = resources.files("ridgeline.speculative") / "prompts"
    templates = [t for t in (base / "templates.txt").read_text().splitlines() if t.strip()]
    topics = [t for t in (base / "topics.txt").read_text().splitlines() if t.strip()]
    prompts = [t.replace("{topic}", topic) for t in templates for topic in topics]
    random.Random(seed).shuffle(prompts)
    return prompts


def _prompt_text(name: str) -> str:
    return (resources.files("ridgeline.speculative") / "prompts" / name).read_text()


def _prompt_lines(name: str) -> list[str]:
    return [t for t in _prompt_text(name).splitlines() if t.strip()]


# asks about a paragraph's topic (the two-turn conversations of doc_task_prompts)
ASKS = ["Describe {topic} in a few sentences.", "Give me an overview of {topic}.",
        "Write a short paragraph about {topic}.", "Summarize what is known about {topic}.",
        "What is the background of {topic}?", "Tell me something about {topic}."]


def doc_task_prompts(paras: list[tuple[str | None, str]], seed: int) -> list[list[dict]]:
    """Conversations over a text's paragraphs (the `tasks:FILE` source), shuffled by seed: for each
    paragraph, every shipped document task with the paragraph pasted in (after a system prompt one
    time in two), and one two-turn conversation (the paragraph as the assistant's first answer, then
    a follow-up) per task, so about half the conversations of each kind."""
    tasks = [t.strip("\n") for t in _prompt_text("doc_tasks.txt").split("\n---\n") if t.strip()]
    systems, follow_ups = _prompt_lines("systems.txt"), _prompt_lines("follow_ups.txt")
    rng = random.Random(seed)
    out = []
    for title, text in paras:
        topic = title or "this subject"
        for task in tasks:
            msgs = [{"role": "user", "content": task.replace("{text}", text)}]
            if rng.random() < 0.5:
                msgs.insert(0, {"role": "system", "content": rng.choice(systems)})
            out.append(msgs)
            out.append([{"role": "user", "content": rng.choice(ASKS).format(topic=topic)},
                        {"role": "assistant", "content": text},
                        {"role": "user", "content": rng.choice(follow_ups)}])
    rng.shuffle(out)
    return out


def _encode(tok, prompt: str | list[dict]) -> list[int]:
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if tok.chat_template:
        return tok.encode_chat(msgs)
    if isinstance(prompt, str):
        return tok.encode(prompt)  # a bare user turn stays plain text without a template
    return tok.encode("".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:")


def self_distill(eng, num_tokens: int, seed: int, max_tokens: int = 256, temperature: float = 0.8,
                 top_p: float = 0.95, batch: int = 16, progress: bool = True, start: int = 0,
                 prompts: list | None = None, desc: str = "self-distillation data") -> Iterator[Sample]:
    """Samples until their tokens (prompt + reply) reach num_tokens; replies sampled `batch` at a time.
    Sample n is the reply to prompt n with its own seed whatever the batching, so `start` continues
    an earlier run that stopped after `start` samples. prompts: user turns (str) or conversations
    (lists of messages); default the shipped seeds (seed_prompts). A prompt longer than the model's
    context is cut to fit."""
    from tqdm import tqdm

    from ridgeline.engine.run import run_to_completion
    tok = eng.tokenizer
    prompts = seed_prompts(seed) if prompts is None else prompts
    limit = eng.max_model_len - 1
    bar = tqdm(total=num_tokens, unit="tok", desc=desc, disable=not progress)
    done, i = 0, start
    try:
        while done < num_tokens:
            texts = [prompts[(i + j) % len(prompts)] for j in range(batch)]
            ids = [_encode(tok, t)[:limit - 1] for t in texts]
            params = [SamplingParams(temperature=temperature, top_p=top_p, seed=seed * 1_000_003 + i + j,
                                     max_tokens=min(max_tokens, limit - len(p))) for j, p in enumerate(ids)]
            i += batch
            for p, out in zip(ids, run_to_completion(eng, ids, params)):
                seq = p + list(out.outputs[0].token_ids)
                hidden = eng.prompt_hidden(seq)
                yield Sample(torch.tensor(seq), hidden.to("cpu", torch.bfloat16))  # trained on the CPU
                done += len(seq)
                bar.update(len(seq))
                if done >= num_tokens:
                    return
    finally:
        bar.close()


def frequent_tokens(samples: list[Sample], k: int, vocab_size: int, always: tuple[int, ...] = ()) -> torch.Tensor | None:
    """The k most frequent token ids of the data (always-included ids first), sorted; None when k
    covers the vocabulary (draft over all of it). Ties, such as the many ids a small data set never
    shows, go to the lower id: a BPE vocabulary numbers its merges roughly from the most frequent in
    the tokenizer's own corpus."""
    if k <= 0 or k >= vocab_size:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for s in samples:
        counts += torch.bincount(s.tokens, minlength=vocab_size)
    counts[list(always)] = counts.max() + 1
    score = counts * vocab_size + (vocab_size - 1 - torch.arange(vocab_size))
    return score.topk(k).indices.sort().values
