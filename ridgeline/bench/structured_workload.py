"""The `structured` bench workloads: chat prompts that ask for a JSON object, each carrying the schema
its reply is constrained to (`ConstrainedPrompt`: the prompt's token ids, a list like every workload's,
with the schema beside them), so every bench that runs prompts runs them constrained.

- structured:             the corpus (ridgeline/data/structured_schemas.json; the tests' too), request i
                          on schema i mod its size: every string and array bounded.
- structured-permissive:  one schema of long free strings (a title and a story): the mask's cheapest case.
- structured-restrictive: one schema of enums, bounded numbers and booleans in an array: the mask allows
                          few tokens at every position.
- structured-unbounded:   schemas with unbounded strings and arrays: may end at max_tokens.
- structured-mix:         request i constrained (the corpus) when i mod 4 == 0, else the chat workload's
                          request i: one constrained request to three plain ones.
- tools:                  tool calling with tool_choice required: two tools from the corpus's
                          function-calling schemas (fn_*) described in the generic format's system message,
                          the reply constrained to one call of either (tool_calls/grammar.py), as the server
                          constrains it for a template without tools; `tools` carries the request's tools.

`forced_share` replays outputs through the constraint: the share of tokens the grammar forced (what a
`grammar` draft proposes), per schema."""
from __future__ import annotations

import json
import random
from importlib import resources

from ridgeline.bench import corpus
from ridgeline.bench.chat_encode import chat_encoder
from ridgeline.structured_params import StructuredOutputs

PERMISSIVE = {"type": "object", "additionalProperties": False, "required": ["title", "story"],
              "properties": {"title": {"type": "string", "maxLength": 80},
                             "story": {"type": "string", "maxLength": 6000}}}
RESTRICTIVE = {"type": "object", "additionalProperties": False, "required": ["items"], "properties": {
    "items": {"type": "array", "minItems": 1, "maxItems": 40, "items": {
        "type": "object", "additionalProperties": False, "required": ["color", "size", "count", "ok"],
        "properties": {"color": {"enum": ["red", "green", "blue", "yellow", "black", "white"]},
                       "size": {"enum": ["S", "M", "L", "XL"]},
                       "count": {"type": "integer", "minimum": 0, "maximum": 999},
                       "ok": {"type": "boolean"}}}}}}
UNBOUNDED = {
    "notes": {"type": "object", "required": ["notes"], "additionalProperties": False,
              "properties": {"notes": {"type": "array", "items": {"type": "string"}}}},
    "essay": {"type": "object", "required": ["title", "body"], "additionalProperties": False,
              "properties": {"title": {"type": "string"}, "body": {"type": "string"}}},
    "records": {"type": "array", "items": {"type": "object", "required": ["name", "values"],
                                           "additionalProperties": False,
                                           "properties": {"name": {"type": "string"},
                                                          "values": {"type": "array", "items": {"type": "number"}}}}},
}
WORKLOADS = ("structured", "structured-permissive", "structured-restrictive", "structured-unbounded", "tools")
MIX_EVERY = 4  # structured-mix: one constrained request in this many


def corpus_schemas() -> dict[str, dict]:
    """The bounded corpus: name -> JSON schema (at least 40; each feature in several)."""
    return json.loads(resources.files("ridgeline.data").joinpath("structured_schemas.json").read_text())


def schemas_of(workload: str) -> dict[str, dict]:
    if workload == "structured":
        return corpus_schemas()
    if workload == "structured-permissive":
        return {"permissive": PERMISSIVE}
    if workload == "structured-restrictive":
        return {"restrictive": RESTRICTIVE}
    if workload == "structured-unbounded":
        return dict(UNBOUNDED)
    raise ValueError(f"not a structured workload: {workload!r}")


class ConstrainedPrompt(list):
    """A prompt's token ids, with the schema its reply must match (`structured`; None: unconstrained), the
    schema's name, and optionally its own max_tokens (None: the run's)."""

    def __init__(self, ids: list[int], structured: StructuredOutputs | None, schema: str,
                 max_tokens: int | None = None, tools: list[dict] | None = None, chat: list[dict] | None = None):
        super().__init__(ids)
        self.structured, self.schema, self.max_tokens, self.tools = structured, schema, max_tokens, tools
        self.chat = chat  # the messages a client sends (None: those the ids were rendered from)

    def unconstrained(self, max_tokens: int) -> ConstrainedPrompt:
        """The same prompt without its constraint, stopped after max_tokens (ignore_eos: exactly that many)."""
        return ConstrainedPrompt(self, None, self.schema, max_tokens, self.tools, self.chat)


def _ask(name: str, schema: dict, rng: random.Random) -> list[dict]:
    subject = name.removeprefix("fn_").replace("_", " ")
    system = ("You reply with one JSON object and nothing else. It must match this JSON schema:\n"
              + json.dumps(schema, separators=(",", ":")))
    topic = rng.choice(corpus.PASSAGES)[0].replace("-", " ")
    user = rng.choice([f"Give an example of a {subject}, about {topic}.",
                       f"Fill in a {subject} for someone interested in {topic}.",
                       f"Write a {subject} record. Context: {topic}."])
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def tools_workload(tokenizer, num_requests: int, seed: int = 0) -> list[ConstrainedPrompt]:
    from ridgeline.tool_calls.formats import GENERIC, system_prompt
    from ridgeline.tool_calls.grammar import call_grammar
    fns = {k: v for k, v in corpus_schemas().items() if k.startswith("fn_")}
    names = sorted(fns)
    encode = chat_encoder(tokenizer)
    out = []
    for i in range(num_requests):
        rng = random.Random(f"tools/{seed}/{i}")
        pair = [names[i % len(names)], names[(i + 1 + rng.randrange(len(names) - 1)) % len(names)]]
        tools = [{"type": "function", "function": {"name": n.removeprefix("fn_"), "description": n.replace("_", " "),
                                                   "parameters": fns[n]}} for n in pair]
        ask = rng.choice(["Please {t} for me.", "Can you {t}? Use a tool.", "I need to {t}, now."]).format(
            t=pair[0].removeprefix("fn_").replace("_", " "))
        msgs = [{"role": "system", "content": system_prompt(tools)}, {"role": "user", "content": ask}]
        grammar = call_grammar(GENERIC, {t["function"]["name"]: t["function"]["parameters"] for t in tools}, False)
        # a client sends the user message with `tools`: the server writes the system message itself
        out.append(ConstrainedPrompt(encode(msgs), StructuredOutputs(grammar=grammar, field="tools"), pair[0],
                                     tools=tools, chat=msgs[1:]))
    return out


def structured_workload(name: str, tokenizer, num_requests: int, seed: int = 0,
                        only: list[str] | None = None) -> list[ConstrainedPrompt]:
    """Request i: schema i mod the workload's schemas (or those named in `only`, in that order)."""
    if name == "tools":
        return tools_workload(tokenizer, num_requests, seed)
    schemas = schemas_of(name)
    names = list(only) if only else list(schemas)
    encode = chat_encoder(tokenizer)
    specs = {n: StructuredOutputs(json=schemas[n]) for n in names}
    out = []
    for i in range(num_requests):
        n = names[i % len(names)]
        rng = random.Random(f"structured/{seed}/{i}")
        out.append(ConstrainedPrompt(encode(_ask(n, schemas[n], rng)), specs[n], n))
    return out


def mixed_workload(plain: list[list[int]], tokenizer, seed: int = 0) -> list:
    """The chat prompts `plain` with every MIX_EVERY-th replaced by a constrained one."""
    constrained = structured_workload("structured", tokenizer, len(plain), seed)
    return [constrained[i] if i % MIX_EVERY == 0 else plain[i] for i in range(len(plain))]


def forced_share(backend, prompts: list[ConstrainedPrompt], outputs: list[list[int]]) -> dict[str, tuple[int, int]]:
    """schema -> (tokens its grammar forced, tokens), over the outputs of its prompts: a token is forced
    where the constraint's fast-forward tokens start with it."""
    counts: dict[str, list[int]] = {}
    for p, toks in zip(prompts, outputs):
        c = backend.create(p.structured)
        forced = 0
        for t in toks:
            ff = c.forced_tokens()
            forced += bool(ff) and ff[0] == t
            if not c.advance(t):
                break
        agg = counts.setdefault(p.schema, [0, 0])
        agg[0] += forced
        agg[1] += len(toks)
    return {k: (f, n) for k, (f, n) in counts.items()}
