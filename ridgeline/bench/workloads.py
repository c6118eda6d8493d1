"""Deterministic benchmark workloads: token-id prompts built from the shipped corpus.

Every prompt is a chat conversation rendered with the model's own chat template, so it tokenizes
like real traffic (template tokens, system prompt, prose). Each request draws its target length
uniformly from [min_len, max_len] with its own seeded RNG, so request i is the same whatever
num_requests is (a 64-request run is a prefix of a 256-request run), and the same seed always
gives the same token ids for the same tokenizer.

Workloads:
- chat:          mixed single questions, "summarize/explain this" tasks and short multi-turn chats.
- long-prompt:   document-style tasks (summarize/review a long text); use e.g. 1000-2000 tokens.
- shared-prefix: one long common system prompt (a support handbook) + short unique questions.
- multi-turn:    8-turn conversations; each turn resends the whole history (system prompt, earlier
                 questions and replies) plus a new question. Conversations run 8 at a time, turns
                 interleaved (turn 1 of each, then turn 2 of each, ...).
- code-edit:     "rename this identifier in the code" (bench/edit_workload.py): the reply repeats the prompt.
- text-edit:     "rewrite this text with one change": the same, with prose.
- structured, structured-permissive, structured-restrictive, structured-unbounded: prompts asking for
                 JSON, each constrained to its schema; structured-mix: one such to three chat requests;
                 tools: tool calling, tool_choice required (bench/structured_workload.py).
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable

from ridgeline.bench import corpus
from ridgeline.bench.chat_encode import chat_encoder
from ridgeline.errors import InvalidRequestError

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TOPIC_ASKS = ["Can you tell me about {t}?", "What should I know about {t}?", "Explain {t} briefly.",
               "I'm curious about {t}. Where do I start?"]
_NAMES = ["Ana", "Ben", "Chiara", "Dmitri", "Emeka", "Fatima", "Grace", "Hiro", "Ines", "Jonas", "Kavya", "Liam",
          "Mei", "Noor", "Oskar", "Priya", "Rafael", "Sofia", "Tomasz", "Yara"]


class _Filler:
    """A stream of corpus words from a random starting passage on, remembering sentence ends."""

    def __init__(self, rng: random.Random, words_needed: int):
        order = list(range(len(corpus.PASSAGES)))
        rng.shuffle(order)
        self.topic = corpus.PASSAGES[order[0]][0].replace("-", " ")
        self.units: list[str] = []  # each word with the separator that follows it
        self.sentence_ends: list[int] = [0]  # unit counts that end a sentence
        i = 0
        while len(self.units) < words_needed:
            sentences = _SENTENCE_END.split(corpus.PASSAGES[order[i % len(order)]][1])
            if i == 0:  # start anywhere in the first passage's first half
                sentences = sentences[rng.randrange((len(sentences) + 1) // 2):]
            for j, sentence in enumerate(sentences):
                words = sentence.split()
                last_sep = "\n\n" if j == len(sentences) - 1 else " "
                self.units += [w + " " for w in words[:-1]] + [words[-1] + last_sep]
                self.sentence_ends.append(len(self.units))
            i += 1

    def text(self, k: int) -> str:
        return "".join(self.units[:k]).rstrip()

    def sentence_bounds(self, k: int) -> tuple[int, int]:
        """The sentence ends at or before k and at or after k."""
        before = max(e for e in self.sentence_ends if e <= k)
        after = min((e for e in self.sentence_ends if e >= k), default=len(self.units))
        return before, after


def _fit(build: Callable[[str], list[dict]], filler: _Filler, encode, target: int, min_len: int,
         max_len: int, min_k: int = 0) -> list[int] | None:
    """Token ids of build(first k filler words), k >= min_k chosen so the length lands near `target`,
    snapped to a sentence end when that stays within [min_len, max_len]; None if k=min_k is too long."""
    cache: dict[int, list[int]] = {}

    def ids(k: int) -> list[int]:
        if k not in cache:
            cache[k] = encode(build(filler.text(k)))
        return cache[k]

    if len(ids(min_k)) > max_len:
        return None
    lo, hi = min_k, len(filler.units)
    if len(ids(hi)) < target:
        raise InvalidRequestError(f"the corpus is too short for a {target}-token prompt")
    while lo < hi:  # smallest k with len(ids(k)) >= target
        mid = (lo + hi) // 2
        if len(ids(mid)) >= target:
            hi = mid
        else:
            lo = mid + 1
    k = lo
    before, after = filler.sentence_bounds(k)
    for cand in (after, before):
        if cand >= min_k and min_len <= len(ids(cand)) <= max_len:
            return ids(cand)
    while k > min_k and len(ids(k)) > max_len:  # tokens per word can jump; step back to fit
        k -= 1
    return ids(k)


def _chat_request(rng: random.Random, encode, target: int, min_len: int, max_len: int,
                  kinds: tuple[str, ...]) -> list[int]:
    kind = rng.choice(kinds)
    system = rng.choice(corpus.SYSTEM_PROMPTS) if rng.random() < 0.7 else None
    filler = _Filler(rng, words_needed=max(64, int(max_len * 1.2)))
    task = rng.choice(corpus.TASKS)
    ask = rng.choice(_TOPIC_ASKS).format(t=filler.topic)
    follow = rng.choice(corpus.FOLLOW_UPS)
    question = rng.choice(corpus.QUESTIONS)

    def with_system(msgs: list[dict], sys_prompt: str | None) -> list[dict]:
        return ([{"role": "system", "content": sys_prompt}] if sys_prompt else []) + msgs

    def builder(kind: str, sys_prompt: str | None) -> Callable[[str], list[dict]]:
        if kind == "task":
            return lambda text: with_system([{"role": "user", "content": task.format(text=text)}], sys_prompt)
        if kind == "multi-turn":
            return lambda text: with_system([{"role": "user", "content": ask},
                                             {"role": "assistant", "content": text},
                                             {"role": "user", "content": follow}], sys_prompt)
        # "question": a bare question; filler text becomes context the user pastes before it
        return lambda text: with_system(
            [{"role": "user", "content": f"{text}\n\n{question}" if text else question}], sys_prompt)

    # Short targets are served by a bare question when it fits; otherwise the drawn kind.
    q_ids = encode(builder("question", system)(""))
    if min_len <= len(q_ids) <= max_len and len(q_ids) >= target - 8:
        return q_ids
    for k, s in ((kind, system), (kind, None), ("question", None)):
        min_k = filler.sentence_ends[1] if k == "multi-turn" else 0  # the assistant turn is never empty
        ids = _fit(builder(k, s), filler, encode, target, min_len, max_len, min_k)
        if ids is not None:
            return ids
    raise InvalidRequestError(f"a prompt of at most {max_len} tokens cannot hold the chat template around the "
                              "shortest question: ask for longer prompts")


def chat_workload(tokenizer, num_requests: int, min_len: int = 50, max_len: int = 200, seed: int = 0,
                  kinds: tuple[str, ...] = ("task", "task", "multi-turn", "question")) -> list[list[int]]:
    """num_requests chat prompts (token ids) of mixed lengths, each within [min_len, max_len] when the
    template allows (a prompt is never shorter than its chat template around a question)."""
    if not 1 <= min_len <= max_len:
        raise InvalidRequestError(f"prompt lengths: need 1 <= shortest <= longest, got {min_len} and {max_len} tokens")
    encode = chat_encoder(tokenizer)
    prompts, seen = [], set()
    for i in range(num_requests):
        for attempt in range(8):  # redraw duplicates (request i depends only on requests before it)
            rng = random.Random(f"chat/{seed}/{i}/{attempt}")
            target = rng.randint(min_len, max_len)
            ids = _chat_request(rng, encode, target, min_len, max_len, kinds)
            if tuple(ids) not in seen:
                break
        seen.add(tuple(ids))
        prompts.append(ids)
    return prompts


def long_prompt_workload(tokenizer, num_requests: int, min_len: int = 1000, max_len: int = 2000,
                         seed: int = 0) -> list[list[int]]:
    """Document-style prompts: an instruction wrapped around a long text."""
    return chat_workload(tokenizer, num_requests, min_len, max_len, seed, kinds=("task",))


def shared_prefix_workload(tokenizer, num_requests: int, prefix_len: int = 1024,
                           seed: int = 0) -> list[list[int]]:
    """A common system prompt of at most about prefix_len tokens (the support handbook, paragraph by
    paragraph, then background passages if more is needed), followed by a short, unique customer
    question per request."""
    encode = chat_encoder(tokenizer)
    background = [f"Background reading:\n\n{corpus.PASSAGES[0][1]}"] + [p for _, p in corpus.PASSAGES[1:]]
    paragraphs = [corpus.HANDBOOK_TITLE, *corpus.HANDBOOK, *background * 20]

    def length(n: int) -> int:
        system = "\n\n".join(paragraphs[:n])
        return len(encode([{"role": "system", "content": system}, {"role": "user", "content": "?"}]))

    n = 2  # the title and the first rule at least
    while n < len(paragraphs) and length(n + 1) <= prefix_len:
        n += 1
    system = "\n\n".join(paragraphs[:n])
    prompts = []
    for i in range(num_requests):
        rng = random.Random(f"shared/{seed}/{i}")
        question = rng.choice(corpus.HANDBOOK_QUESTIONS)
        user = f"Hi, this is {rng.choice(_NAMES)} (order {rng.randint(10000, 99999)}). {question}"
        prompts.append(encode([{"role": "system", "content": system}, {"role": "user", "content": user}]))
    return prompts


def multi_turn_workload(tokenizer, num_requests: int, turns: int = 8, concurrent: int = 8,
                        reply_words: tuple[int, int] = (30, 80), seed: int = 0) -> list[list[int]]:
    """Requests of `concurrent` conversations at a time: turn t of each conversation, for t = 1..turns,
    then the next `concurrent` conversations. Turn t's prompt is turn t-1's prompt + its (scripted)
    assistant reply + a new user message, so request i does not depend on num_requests."""
    if turns < 1 or concurrent < 1 or not 1 <= reply_words[0] <= reply_words[1]:
        raise InvalidRequestError(f"need turns, concurrent >= 1 and 1 <= reply_words, got {turns}, {concurrent}, "
                                  f"{reply_words}")
    encode = chat_encoder(tokenizer)
    prompts: list[list[int]] = []
    group = 0
    while len(prompts) < num_requests:
        convs = [_conversation(seed, group * concurrent + c, turns, reply_words) for c in range(concurrent)]
        for t in range(turns):
            for msgs in convs:
                prompts.append(encode(msgs[:2 * t + 2]))  # system + t (user, assistant) pairs + user
        group += 1
    return prompts[:num_requests]


def _conversation(seed: int, index: int, turns: int, reply_words: tuple[int, int]) -> list[dict]:
    """[system, user, assistant, user, assistant, ...]: `turns` user messages, a reply after each."""
    rng = random.Random(f"multi/{seed}/{index}")
    filler = _Filler(rng, words_needed=turns * reply_words[1] + 1)
    asks = [rng.choice(_TOPIC_ASKS).format(t=filler.topic)]
    asks += [rng.choice(corpus.FOLLOW_UPS + corpus.QUESTIONS) for _ in range(turns - 1)]
    msgs = [{"role": "system", "content": rng.choice(corpus.SYSTEM_PROMPTS)}]
    used = 0
    for ask in asks:
        n = rng.randint(*reply_words)
        msgs += [{"role": "user", "content": ask},
                 {"role": "assistant", "content": "".join(filler.units[used:used + n]).rstrip()}]
        used += n
    return msgs


WORKLOADS = ("chat", "long-prompt", "shared-prefix", "multi-turn", "code-edit", "text-edit", "structured",
             "structured-permissive", "structured-restrictive", "structured-unbounded", "structured-mix", "tools")


def make_workload(name: str, tokenizer, num_requests: int, *, min_len: int = 50, max_len: int = 200,
                  prefix_len: int = 1024, seed: int = 0, conversations: int = 8, turns: int = 8) -> list[list[int]]:
    if name == "chat":
        return chat_workload(tokenizer, num_requests, min_len, max_len, seed)
    if name == "long-prompt":
        return long_prompt_workload(tokenizer, num_requests, min_len, max_len, seed)
    if name == "shared-prefix":
        return shared_prefix_workload(tokenizer, num_requests, prefix_len, seed)
    if name == "multi-turn":
        return multi_turn_workload(tokenizer, num_requests, turns=turns, concurrent=conversations, seed=seed)
    if name == "code-edit":
        from ridgeline.bench.edit_workload import code_edit_workload
        return code_edit_workload(tokenizer, num_requests, seed=seed)
    if name == "text-edit":
        from ridgeline.bench.edit_workload import text_edit_workload
        return text_edit_workload(tokenizer, num_requests, seed=seed)
    if name == "structured-mix":
        from ridgeline.bench.structured_workload import mixed_workload
        return mixed_workload(chat_workload(tokenizer, num_requests, min_len, max_len, seed), tokenizer, seed)
    if name in WORKLOADS and (name.startswith("structured") or name == "tools"):
        from ridgeline.bench.structured_workload import structured_workload
        return structured_workload(name, tokenizer, num_requests, seed=seed)
    raise InvalidRequestError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
