"""LoRA adapters (ridgeline/lora): PEFT folders made by peft in the test (B non-zero), each adapter's greedy
output and logits equal to transformers + peft; rows of different adapters and of the base in one step equal
each alone, bitwise; the prefix cache never crosses adapters; an int8 base with an adapter equals the int8 base
plus the adapter computed apart; every bad adapter is a clear error before anything is loaded."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import make_tiny_model
from ridgeline import LLM, LoRARequest, SamplingParams
from ridgeline.errors import InvalidRequestError

peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 33, 2, 41, 8], [9, 9, 30, 61], [12, 44, 7, 19, 3, 27, 50, 11]]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def make_adapter(base, out, seed, r=8, targets=TARGETS, rslora=False, alpha=16):
    """A peft LoRA adapter for the HF model at base, with random non-zero A and B."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                          use_rslora=rslora, init_lora_weights=False)
    torch.manual_seed(seed)
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.15)
    pm.save_pretrained(out)
    return out


def peft_reference(base, adapter, prompt, n=12):
    """Greedy tokens and the last prompt position's logits of transformers + peft."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    ids = torch.tensor([prompt])
    toks = []
    with torch.no_grad():  # plain greedy steps over the whole sequence (no EOS handling, as ignore_eos)
        logits = model(ids).logits[0, -1]
        for _ in range(n):
            toks.append(int(model(torch.tensor([prompt + toks])).logits[0, -1].argmax()))
    return toks, logits


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("lora-base"), "llama")


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    return {"a": make_adapter(base, d / "a", 1), "b": make_adapter(base, d / "b", 2, r=4, targets=["q_proj", "v_proj"]),
            "rs": make_adapter(base, d / "rs", 3, r=16, rslora=True, alpha=8)}


def _llm(base, **kw):
    return LLM(str(base), dtype="float32", enable_lora=True, kv_cache_memory="8MiB", **kw)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("name", ["a", "b", "rs"])
def test_each_adapter_matches_transformers_with_peft(base, adapters, name):
    llm = _llm(base)
    req = LoRARequest(name, 1, str(adapters[name]))
    got = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=req))
    for prompt, toks in zip(PROMPTS, got):
        want, _ = peft_reference(base, adapters[name], prompt)
        assert toks == want
    plain = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert plain != got  # the adapter changes what the model says
    assert plain == [peft_reference(base, None, p)[0] for p in PROMPTS]


def test_prompt_logprobs_under_an_adapter_match_peft(base, adapters):
    llm = _llm(base)
    prompt = PROMPTS[2]
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0, logprobs=5), use_tqdm=False,
                       lora_request=LoRARequest("a", 1, str(adapters["a"])))[0]
    _, logits = peft_reference(base, adapters["a"], prompt)
    want = torch.log_softmax(logits.double(), -1)
    got = out.outputs[0].logprobs[0]
    assert len(got.top) == 5 and got.token_id == got.top[0][0] == int(want.argmax())
    for tok, lp in got.top:
        assert abs(lp - float(want[tok])) < 1e-4


def test_a_mixed_step_equals_each_row_alone_bitwise(base, adapters):
    """Rows of two adapters and of the base in the same steps give what each gives alone, bit for bit, and a
    row's result does not depend on how many rows of its own adapter share the step."""
    llm = _llm(base)
    reqs = {k: LoRARequest(k, i + 1, str(adapters[k])) for i, k in enumerate(("a", "b"))}
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    who = [reqs["a"], reqs["b"], None, reqs["a"], reqs["a"]]
    mixed = llm.generate(prompts, params, use_tqdm=False, lora_request=who)
    for p, r, m in zip(prompts, who, mixed):
        alone = llm.generate([p], params, use_tqdm=False, lora_request=r)[0]
        assert alone.outputs[0].token_ids == m.outputs[0].token_ids
        assert [(d.logprob, d.top) for d in alone.outputs[0].logprobs] == \
               [(d.logprob, d.top) for d in m.outputs[0].logprobs]


def test_the_prefix_cache_never_crosses_adapters(base, adapters):
    llm = _llm(base, enable_prefix_caching=True)
    prompt = list(range(3, 3 + 40))  # several full blocks
    a = LoRARequest("a", 1, str(adapters["a"]))
    first = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=a)[0]
    base_out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert base_out.num_cached_tokens == 0  # the adapter's blocks are not the base model's
    again = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=a)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    llm.engine.kv.check_integrity()


def test_an_int8_base_with_an_adapter_is_the_int8_base_plus_the_adapter(base, adapters):
    """The base stays in its format: the adapter adds B (A x) to what the int8 matmul gives."""
    from ridgeline.kernels import cpu_quant
    if not cpu_quant.available("int8"):
        pytest.skip("no int8 kernel on this CPU")
    llm = _llm(base, quantization="int8")
    assert llm.info.weight_formats.startswith("int8")
    req = LoRARequest("a", 1, str(adapters["a"]))
    lin = llm.engine.runner.model.model.layers[0].self_attn.o_proj
    x = torch.randn(3, lin.in_features)
    base_y = lin(x)
    pieces = llm.lora.layers.get(lin.prefix)
    assert pieces is None  # not registered yet
    llm.lora.register(req)
    e = llm.lora.layers[lin.prefix]["a"]
    (p,) = e.pieces
    from ridgeline.lora.manager import _CStepDelta, _StepDelta
    want = base_y.double() + ((x.double() @ e.At.double()) * p.scale) @ p.Bt.double()
    for delta in (_StepDelta(llm.lora.layers, [("a", slice(0, 3))]),
                  _CStepDelta(llm.lora.tables, torch.zeros(3, dtype=torch.int64))):
        got = delta(lin, x, base_y.clone())
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    toks = _tokens(llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=req))
    assert len(toks[0]) == 12


def _copy(src, dst, edit=None, weights=None):
    shutil.copytree(src, dst)
    if edit:
        cfg = json.loads((dst / "adapter_config.json").read_text())
        edit(cfg)
        (dst / "adapter_config.json").write_text(json.dumps(cfg))
    if weights:
        weights(dst / "adapter_model.safetensors")
    return dst


@pytest.mark.parametrize("case, match", [
    ("dora", "DoRA"), ("rank", "outside \\[1, 4\\]"), ("alpha", "lora_alpha"), ("bias", "trained biases"),
    ("peft_type", "only LoRA adapters"), ("pickled", "pickled"), ("missing", "is not a folder"),
    ("truncated", "truncated"), ("oversized", "past what its header names"), ("other_base", "another base model"),
    ("no_module", "does not have"), ("not_json", "readable JSON"), ("half", "without lora_"),
])
def test_bad_adapters_are_clear_errors_and_disturb_nothing(base, adapters, tmp_path, case, match):
    src = adapters["a"]
    d = tmp_path / case
    if case == "dora":
        d = _copy(src, d, lambda c: c.update(use_dora=True))
    elif case == "rank":
        d = src  # r = 8 over a limit of 4 below
    elif case == "alpha":
        d = _copy(src, d, lambda c: c.update(lora_alpha=-1))
    elif case == "bias":
        d = _copy(src, d, lambda c: c.update(bias="all"))
    elif case == "peft_type":
        d = _copy(src, d, lambda c: c.update(peft_type="IA3"))
    elif case == "pickled":
        d.mkdir()
        shutil.copy(src / "adapter_config.json", d)
        (d / "adapter_model.bin").write_bytes(b"\x80\x04not really")
    elif case == "missing":
        d = tmp_path / "nowhere"
    elif case == "truncated":
        d = _copy(src, d, weights=lambda f: f.write_bytes(f.read_bytes()[:-100]))
    elif case == "oversized":
        d = _copy(src, d, weights=lambda f: f.write_bytes(f.read_bytes() + b"\0" * 64))
    elif case == "other_base":
        other = make_tiny_model(tmp_path / "wide", "llama", hidden_size=96)
        d = make_adapter(other, d, 5)
    elif case == "no_module":
        deeper = make_tiny_model(tmp_path / "deep", "llama", num_hidden_layers=3)
        d = make_adapter(deeper, d, 5)
    elif case == "not_json":
        d = _copy(src, d)
        (d / "adapter_config.json").write_text("{not json")
    elif case == "half":
        from safetensors.torch import load_file, save_file

        def drop_b(f):
            t = load_file(str(f))
            save_file({k: v for k, v in t.items() if not (k.endswith("lora_B.weight") and "layers.0.self_attn.q_proj"
                                                          in k)}, str(f))
        d = _copy(src, d, weights=drop_b)
    llm = _llm(base, max_lora_rank=4) if case == "rank" else _llm(base)
    with pytest.raises(InvalidRequestError, match=match):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=LoRARequest("bad", 1, str(d)))
    assert not llm.lora.knows("bad") and not llm.lora.layers
    assert _tokens(llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)) == [peft_reference(base, None, PROMPTS[0])[0]]
    llm.engine.kv.check_integrity()


def test_requests_and_options_are_checked(base, adapters):
    llm = LLM(str(base), dtype="float32", kv_cache_memory="8MiB")
    with pytest.raises(InvalidRequestError, match="enable_lora=True"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapters["a"])))
    with pytest.raises(InvalidRequestError, match="max_lora_rank"):
        LLM(str(base), enable_lora=True, max_lora_rank=512)
    with pytest.raises(InvalidRequestError, match="draft made for the base"):
        LLM(str(base), enable_lora=True, speculative_method="layer-skip", speculative_layers=1)
    llm = _llm(base)
    a = LoRARequest("a", 1, str(adapters["a"]))
    with pytest.raises(InvalidRequestError, match="2 given for 1 prompts"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=[a, a])
    llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=a)
    with pytest.raises(InvalidRequestError, match="already loaded from"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapters["b"])))
    with pytest.raises(InvalidRequestError, match="not loaded"):
        llm.engine.add_request("x", PROMPTS[0], GREEDY, adapter="nobody")
    with pytest.raises(InvalidRequestError, match="lora_name"):
        LoRARequest("", 1, "x")


@pytest.mark.parametrize("arch, targets", [
    ("qwen2", ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]),  # q/k/v biases, a tied head
    ("gemma3", TARGETS),  # sandwich norms, q/k norms, GELU, local and global layers
    ("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),  # the checkpoint's own fused projections
])
def test_adapters_on_other_families_match_peft(tmp_path, arch, targets):
    base = make_tiny_model(tmp_path / "base", arch)
    adapter = make_adapter(base, tmp_path / "adapter", 7, r=8, targets=targets)
    llm = _llm(base, max_model_len=256)  # Phi-3: within the original context, the short LongRoPE factors
    req = LoRARequest("x", 1, str(adapter))
    got = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=req))
    assert got == [peft_reference(base, adapter, p)[0] for p in PROMPTS]


def test_the_c_stack_with_adapters_equals_the_module_path_bitwise(base, adapters):
    """With the packed kernels the C decoder stack runs the adapters (kernels/lora_add.c) and gives the modules'
    tokens and logprobs bit for bit, over a mixed step of two adapters and the base."""
    llm = _llm(base)
    if llm.engine.runner.model.model.stack is None:
        pytest.skip("no C decoder stack on this CPU")
    reqs = [LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"])), None]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=3)
    from ridgeline.kernels import cpu_stack
    calls, run = [], cpu_stack.run
    cpu_stack.run = lambda *a, **k: (calls.append(k.get("lora", a[18] if len(a) > 18 else None)), run(*a, **k))[1]
    try:
        in_c = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=reqs)
    finally:
        cpu_stack.run = run
    assert llm.lora.c_tables is not None and calls and all(c is not None for c in calls)  # every step in C
    keep, llm.lora.c_tables = llm.lora.c_tables, None  # no descriptor: the step runs its layers as modules
    modules = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=reqs)
    llm.lora.c_tables = keep
    for c, m in zip(in_c, modules):
        assert c.outputs[0].token_ids == m.outputs[0].token_ids
        assert [(d.logprob, d.top) for d in c.outputs[0].logprobs] == [(d.logprob, d.top) for d in m.outputs[0].logprobs]


def test_bench_lora_runs_into_its_table_and_json(base, tmp_path, capsys):
    from ridgeline.cli import main
    out = tmp_path / "lora.json"
    assert main(["bench", "lora", "--model", str(base), "--dtype", "float32", "--kv-cache-memory", "8MiB", "--rank", "4",
                 "--num-requests", "6", "--output-len", "4", "--adapters", "0,2", "--repeats", "1",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| batch-1 decode, one adapter |" in text and "| throughput, 2 adapters |" in text
    data = json.loads(out.read_text())
    assert data["decode_base"] > 0 and data["decode_lora"] > 0 and [r["adapters"] for r in data["throughput"]] == [0, 2]


def test_without_the_library_the_torch_path_gives_the_same_tokens(base, adapters, monkeypatch):
    """Where kernels/lora_add.c cannot run (CUDA, no library) the additions are torch matmuls in the modules:
    the same greedy tokens (their sums in another order)."""
    from ridgeline.lora.manager import LoRAManager
    req = LoRARequest("a", 1, str(adapters["a"]))
    want = _tokens(_llm(base).generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=req))
    monkeypatch.setattr(LoRAManager, "in_c", property(lambda self: False))
    llm = _llm(base)
    got = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=req))
    assert llm.lora.c_tables is None and not llm.lora.tables and got == want
