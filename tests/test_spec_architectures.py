"""Every proposer on every supported architecture besides Llama (whose tests are the proposers' own):
Qwen2 (biases, a tied head), Mistral (a sliding window shorter than the replies), Qwen3 (q/k norms,
a head_dim apart from hidden / heads) and the three MoE families. Greedy output is token for token
the plain engine's, whole prompts and in chunks of 7 tokens, the KV books balanced after every step;
the EAGLE head is trained here for each target by `ridgeline train-draft`."""
from __future__ import annotations

import pytest

from conftest import make_tiny_model
from ridgeline import LLM
from test_multi_token_steps import _params, _run

ARCHS = ["qwen2", "mistral", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"]
BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


@pytest.fixture(scope="module", params=ARCHS)
def target(request, tmp_path_factory):
    """(target folder, a one-layer draft of the same family, an EAGLE head trained for the target, the
    plain engine's outputs)."""
    from ridgeline.cli import main
    d = tmp_path_factory.mktemp(f"spec-{request.param}")
    folder = make_tiny_model(d / "target", request.param, num_hidden_layers=3)
    draft = make_tiny_model(d / "draft", request.param, seed=1, num_hidden_layers=1)
    head = d / "head"
    assert main(["train-draft", str(folder), "--out", str(head), "--tokens", "1500", "--seed", "3", "--epochs", "1",
                 "--max-reply-tokens", "32", "--dtype", "float32", "--draft-vocab", "200", "--quiet"]) == 0
    return folder, draft, head, _run(LLM(str(folder), **BASE), _params())


@pytest.mark.parametrize("chunk", [None, 7], ids=["whole", "chunked"])
@pytest.mark.parametrize("method", ["ngram", "layer-skip", "draft", "eagle"])
def test_greedy_output_is_the_plain_engines(target, method, chunk):
    folder, draft, head, plain = target
    kw = {"ngram": {}, "layer-skip": dict(speculative_layers=1), "draft": dict(draft_model=str(draft)),
          "eagle": dict(draft_model=str(head))}[method]
    opts = {} if chunk is None else dict(max_num_batched_tokens=chunk)
    llm = LLM(str(folder), speculative_method=method, num_speculative_tokens=3, speculative_controller="off", **kw,
              **BASE, **opts)
    assert _run(llm, _params()) == plain
    assert llm.engine.spec_stats.proposed > 0
