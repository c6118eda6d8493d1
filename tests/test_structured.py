"""Structured outputs in the engine: every output of a random-weight model matches its schema (the
mask forces it), greedy and seeded-sampled, n > 1; speculation (n-gram, a draft model), chunked
prefill, the prefix cache and preemption leave greedy constrained output unchanged; the mask wins
over logit_bias; logprobs stay the model's raw ones; max_tokens reached first is "length"; what
cannot be enforced is refused by name."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams
from ridgeline.structured_params import StructuredOutputs

CORPUS = json.loads((Path(__file__).parent / "data" / "structured_schemas.json").read_text())
MAX_TOKENS = 400  # every corpus schema's longest output (compact JSON, bounded strings and arrays) fits
PROMPT = "Reply in JSON: "
SUBSET = ["person", "array_of_objects", "enum_array", "anyof_objects", "ref_array", "fn_book_flight",
          "pattern_words", "fn_add_todo"]


def engine(folder, **kw) -> LLMEngine:
    opts = dict(progress=False, dtype="float32", kv_cache_memory="8MiB")
    return LLMEngine(EngineConfig.from_kwargs(str(folder), **{**opts, **kw}))


def run(eng: LLMEngine, requests: dict[str, tuple[str, SamplingParams]]) -> dict[str, list]:
    """request id -> [(text, token ids, finish_reason, logprobs)] per choice, all requests batched."""
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    out = {}
    while eng.has_unfinished():
        for o in eng.step(emit_unfinished=False):
            out[o.request_id] = [(c.text, list(c.token_ids), c.finish_reason, c.logprobs) for c in o.outputs]
    eng.kv.check_integrity()
    return out


def greedy(schema, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured=StructuredOutputs(json=schema), **kw)


@pytest.fixture(scope="module")
def eng(tiny_llama):
    return engine(tiny_llama)


def test_every_corpus_output_validates(eng):
    assert len(CORPUS) >= 40
    reqs = {}
    for name, schema in CORPUS.items():
        reqs[f"{name}/greedy"] = (PROMPT + name, greedy(schema))
        reqs[f"{name}/sampled"] = (PROMPT + name, SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=MAX_TOKENS,
                                                                 structured=StructuredOutputs(json=schema)))
    out = run(eng, reqs)
    for rid, choices in out.items():
        validator = Draft202012Validator(CORPUS[rid.split("/")[0]], format_checker=FormatChecker())
        for text, _, finish, _ in choices:
            assert finish == "stop", (rid, text)
            validator.validate(json.loads(text))


def test_one_at_a_time_equals_batched_and_logprobs_keep_the_tokens(eng, plain_greedy):
    """Batch 1 gives the batched greedy outputs (each validates); asking for logprobs (the full sampler,
    not the fused masked head) picks the same tokens."""
    for name in SUBSET[:4]:
        alone = run(eng, {name: (PROMPT + name, greedy(CORPUS[name]))})[name]
        assert alone == plain_greedy[name]
        Draft202012Validator(CORPUS[name], format_checker=FormatChecker()).validate(json.loads(alone[0][0]))
        with_lp = run(eng, {name: (PROMPT + name, greedy(CORPUS[name], logprobs=2))})[name]
        assert with_lp[0][1] == alone[0][1]


def test_seeded_sampling_is_reproducible(eng):
    p = SamplingParams(temperature=1.0, seed=11, max_tokens=MAX_TOKENS, structured=StructuredOutputs(json=CORPUS["person"]))
    a = run(eng, {"a": (PROMPT, p)})["a"]
    assert run(eng, {"b": (PROMPT, p)})["b"] == a


def _greedy_subset(eng) -> dict:
    return run(eng, {name: (PROMPT + name, greedy(CORPUS[name])) for name in SUBSET})


@pytest.fixture(scope="module")
def plain_greedy(eng):
    return _greedy_subset(eng)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    from conftest import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("tiny-draft"), "llama", seed=1)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_keeps_greedy_output(tiny_llama, draft_model, plain_greedy, method):
    kw = dict(speculative_method=method, num_speculative_tokens=3, speculative_controller="off")
    if method == "ngram":
        kw["ngram_min"] = 1
    else:
        kw["draft_model"] = str(draft_model)
    spec = engine(tiny_llama, **kw)
    assert _greedy_subset(spec) == plain_greedy
    stats = spec.spec_stats
    assert stats.proposed > 0 and stats.accepted > 0  # it did speculate on constrained requests
    # sampled constrained requests stay valid under drafts drawn from a distribution (draft) too
    out = run(spec, {n: (PROMPT, SamplingParams(temperature=1.0, seed=3, max_tokens=MAX_TOKENS,
                                                structured=StructuredOutputs(json=CORPUS[n]))) for n in SUBSET})
    for name, [(text, _, finish, _)] in out.items():
        assert finish == "stop"
        Draft202012Validator(CORPUS[name]).validate(json.loads(text))


def test_forced_tokens_are_drafted_first_whatever_the_proposer(tiny_llama, plain_greedy):
    """A proposer that never drafts: every draft a constrained request gets is its grammar's forced text,
    asked before the proposer; the proposer is not asked for it that step; greedy output unchanged."""
    from ridgeline.engine.proposal import PROPOSERS, Proposer

    asked = []

    class Silent(Proposer):
        def propose(self, requests):
            asked.extend(r.req_id for r in requests)
            return [[] for _ in requests]

    PROPOSERS["silent-test"] = Silent
    try:
        spec = engine(tiny_llama, speculative_method="silent-test", num_speculative_tokens=4,
                      speculative_controller="off")
        assert _greedy_subset(spec) == plain_greedy
        stats = spec.spec_stats
        assert stats.proposed > 0 and stats.accepted > 0.8 * stats.proposed  # forced text: the model keeps it
        assert stats.accepted <= spec.structured.stats.forced_tokens  # every kept draft was a forced token
        assert asked  # the proposer is asked where nothing is forced
    finally:
        PROPOSERS.pop("silent-test", None)


def test_chunked_prefill_and_prefix_cache_keep_output(tiny_llama, eng):
    long = "a fairly long prompt that spans several blocks of the cache " * 3
    p = greedy(CORPUS["fn_create_event"])
    want = run(eng, {"x": (long, p)})["x"]
    assert run(eng, {"y": (long, p)})["y"] == want  # a prefix-cache hit this time
    chunked = engine(tiny_llama, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert run(chunked, {"z": (long, p)})["z"] == want


def test_preemption_and_recompute_keep_output(tiny_llama, plain_greedy):
    small = engine(tiny_llama, kv_cache_memory="160KiB")
    assert _greedy_subset(small) == plain_greedy
    assert small.scheduler.num_preemptions > 0


def test_choices_regex_grammar_and_n(eng):
    out = run(eng, {
        "choice": ("Pick: ", SamplingParams(temperature=1.0, seed=1, n=4, max_tokens=20,
                                            structured=StructuredOutputs(choice=["yes", "no", "maybe"]))),
        "regex": ("Code: ", SamplingParams(temperature=0, max_tokens=20,
                                           structured=StructuredOutputs(regex=r"[A-Z]{2}-[0-9]{3}"))),
        "lark": ("Sum: ", SamplingParams(temperature=0, max_tokens=40, structured=StructuredOutputs(
            grammar='start: num "+" num\nnum: /[0-9]{1,3}/'))),
        "gbnf": ("Bool: ", SamplingParams(temperature=0, max_tokens=20, structured=StructuredOutputs(
            grammar='root ::= "true" | "false"'))),
        "object": ("Obj: ", SamplingParams(temperature=0, max_tokens=200, structured=StructuredOutputs(json_object=True))),
    })
    assert len(out["choice"]) == 4 and all(t in ("yes", "no", "maybe") and f == "stop" for t, _, f, _ in out["choice"])
    import re
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", out["regex"][0][0])
    assert re.fullmatch(r"[0-9]{1,3}\+[0-9]{1,3}", out["lark"][0][0])
    assert out["gbnf"][0][0] in ("true", "false")
    text, _, finish, _ = out["object"][0]
    assert finish in ("stop", "length")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)


def test_mask_wins_over_logit_bias_and_logprobs_stay_raw(eng):
    tok = eng.tokenizer
    z = tok.encode("z")[0]
    st = StructuredOutputs(choice=["yes", "no"])
    out = run(eng, {"b": ("Q: ", SamplingParams(temperature=0, max_tokens=8, structured=st, logit_bias={z: 100},
                                                logprobs=5))})
    text, ids, finish, lps = out["b"][0]
    assert text in ("yes", "no") and finish == "stop"
    raw = eng.prompt_logits(tok.encode("Q: "))[-1].log_softmax(-1)  # the model's own first-position logprobs
    assert math.isclose(lps[0].logprob, raw[ids[0]].item(), rel_tol=1e-4, abs_tol=1e-4)
    top_ids = [t for t, _ in lps[0].top]
    assert top_ids[0] == int(raw.argmax())  # unbiased, unmasked: whatever the model prefers


def test_max_tokens_first_gives_length(eng):
    out = run(eng, {"l": (PROMPT, SamplingParams(temperature=0, max_tokens=3,
                                                 structured=StructuredOutputs(json=CORPUS["person"])))})
    assert out["l"][0][2] == "length"


@pytest.mark.parametrize("kw,needle", [
    (dict(json={"$ref": "http://example.com/s.json"}), "example.com"),
    (dict(json={"type": "string", "format": "no-such-format"}), "format"),
    (dict(json={"type": "string", "pattern": "(?=a)b"}), "look-around"),
    (dict(regex="(a)\\1"), "backreference"),
    (dict(grammar="start: undefined_rule"), "undefined_rule"),
    (dict(grammar="root ::= ("), "grammar"),
])
def test_what_cannot_be_enforced_is_refused(eng, kw, needle):
    with pytest.raises(InvalidRequestError) as e:
        eng.add_request("bad", "x", SamplingParams(structured=StructuredOutputs(**kw)))
    assert e.value.param == "structured_outputs" and needle in e.value.message
    assert not eng.has_unfinished()


@pytest.mark.parametrize("kw,needle", [
    (dict(), "exactly one"), (dict(regex="a", choice=["a"]), "exactly one"), (dict(json=[1]), "JSON object"),
    (dict(json="not json"), "not valid JSON"), (dict(choice=[]), "empty"), (dict(choice=["a", "a"]), "twice"),
    (dict(choice="ab"), "list"), (dict(regex=""), "non-empty"), (dict(json={"x": "y" * 300_000}), "KiB"),
])
def test_bad_specs_are_refused_at_construction(kw, needle):
    with pytest.raises(InvalidRequestError) as e:
        StructuredOutputs(**kw)
    assert needle in e.value.message


def test_compiles_are_cached(eng):
    backend = eng.structured.backend
    spec = StructuredOutputs(json={"type": "object", "properties": {"cached": {"type": "boolean"}}})
    before = backend.compiles
    for _ in range(3):
        backend.create(spec)
    assert backend.compiles == before + 1


def test_structural_tags_constrain_each_tagged_segment(eng):
    """Free text, but every trigger starts its tag: begin, JSON of the tag's schema, end."""
    import re
    tag = {"triggers": ["x"], "structures": [
        {"begin": "x=", "schema": {"type": "integer", "minimum": 0, "maximum": 9}, "end": ";"},
        {"begin": "xy", "schema": {"enum": ["a", "b"]}, "end": "!"}]}
    outs = run(eng, {str(s): (PROMPT, SamplingParams(temperature=1.5, seed=s, max_tokens=60, ignore_eos=True,
                                                     logit_bias={ord("x"): 4.0},
                                                     structured=StructuredOutputs(structural_tag=tag)))
                     for s in range(12)})
    tagged = 0
    for (text, _, reason, _), in outs.values():
        tagged += len(re.findall(r'x=\d;|xy"[ab]"!', text))
        rest = re.sub(r'x=\d;|xy"[ab]"!', "", text)
        assert "x" not in rest[:-4], text  # the last few characters may be a tag cut by max_tokens
    assert tagged > 0  # the test saw tags


def test_structural_tag_shapes_are_checked():
    for bad, needle in (({"triggers": [], "structures": [{"begin": "a"}]}, "triggers"),
                        ({"triggers": ["<f"], "structures": [{"begin": "<g>", "schema": {}}]}, "none of the triggers"),
                        ({"triggers": ["<f"], "structures": []}, "structures"),
                        ({"format": {"type": "tag"}}, "format"),
                        ({"triggers": ["<f"], "structures": [{"begin": "<f>", "schema": [1]}]}, "JSON object")):
        with pytest.raises(InvalidRequestError, match=needle):
            StructuredOutputs(structural_tag=bad)
