"""`ridgeline eval`: the shipped texts, the quality measures, whole-distribution logits from the
engine, the harness against the unquantized reference, the sweep and the command itself."""
import json
import math

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.cli import main
from ridgeline.engine.run import start_engine
from ridgeline.eval.cli import setting_name
from ridgeline.data import corpus
from ridgeline.eval.harness import Evaluator, Setting, reference_options
from ridgeline.eval.metrics import Totals, compare, tokens_before_divergence
from ridgeline.eval.sweep import ranking, sweep_settings


def test_texts_split_into_parts_that_share_no_paragraph():
    held, cal = corpus.documents("heldout"), corpus.documents("calibration")
    assert len(held) > 100 and len(cal) > 100
    paras = lambda docs: {p for d in docs for p in d.split("\n\n")[1:]}  # noqa: E731  (the name line may repeat)
    assert not paras(held) & paras(cal)
    assert all(len(p) > 200 for p in paras(held))
    with pytest.raises(ValueError, match="heldout, calibration"):
        corpus.text("test")


def test_windows_are_whole_and_capped():
    ids = list(range(100))
    assert corpus.windows(ids, 30) == [ids[0:30], ids[30:60], ids[60:90]]
    assert corpus.windows(ids, 30, max_tokens=70) == [ids[0:30], ids[30:60]]
    assert corpus.windows(ids, 30, max_tokens=10) == [ids[0:30]]
    assert corpus.windows(ids, 200) == []


def test_compare_counts_agreement_and_kl():
    torch.manual_seed(0)
    ref = torch.randn(150, 40)  # more rows than one fp64 chunk
    agree, kl = compare(ref, ref.clone())
    assert agree == 150 and kl == pytest.approx(0, abs=1e-9)
    other = ref + 0.5 * torch.randn(150, 40)
    agree, kl = compare(ref, other)
    p, q = torch.softmax(ref.double(), -1), torch.softmax(other.double(), -1)
    assert kl == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-9)
    assert agree == int((ref.argmax(-1) == other.argmax(-1)).sum()) < 150
    with pytest.raises(ValueError):
        compare(ref, other[:3])


def test_totals_and_divergence():
    t = Totals()
    t.add_logprobs([math.log(0.5)] * 4)
    t.add_logprobs([math.log(0.25)] * 4)
    assert t.perplexity == pytest.approx(math.exp((4 * math.log(2) + 4 * math.log(4)) / 8))
    assert math.isnan(Totals().agreement) and math.isnan(Totals().mean_kl)
    assert tokens_before_divergence([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert tokens_before_divergence([1, 2], [1, 2]) == 2
    assert tokens_before_divergence([], [5]) == 0


def test_agreement_by_position_in_the_window():
    t = Totals()
    ref = list(range(1100))
    t.add_agreement(ref, ref[:1024] + [-1] * 76)  # every top-1 from position 1,024 on differs
    t.add_agreement(ref[:200], ref[:128] + [-1] * 72)  # a second window, shorter, differing from 128 on
    assert t.agreement_by_position == {"0-128": 1.0, "128-1024": (896 + 0) / (896 + 72), "1024-2048": 0.0}
    assert t.agreement == (1024 + 128) / 1300
    torch.manual_seed(0)
    logits = torch.randn(130, 8)
    other = logits.clone()
    other[129] = -logits[129]  # the last row's top-1 moves
    t = Totals()
    t.add_comparison(logits, other)
    assert t.agreement_by_position == {"0-128": 1.0, "128-1024": 0.5}


def test_prompt_logits_match_prompt_logprobs_and_free_their_blocks(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="4MiB", progress=False)
    ids = [5, 9, 33, 120, 7, 7, 8, 200, 3, 17, 40]
    free = llm.engine.kv.num_free_blocks
    logits = llm.engine.prompt_logits(ids)
    assert logits.shape == (len(ids), llm.engine.arch.vocab_size) and logits.dtype == torch.float32
    assert llm.engine.kv.num_free_blocks == free
    llm.engine.kv.check_integrity()
    lp = torch.log_softmax(logits, -1)
    out = llm.generate([ids], SamplingParams(prompt_logprobs=0, max_tokens=0), use_tqdm=False)[0]
    scored = [p.logprob for p in out.prompt_logprobs[1:]]
    want = [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    assert scored == pytest.approx(want, abs=1e-4)


def _evaluator(folder, **kw):
    def make(opts):
        return start_engine(str(folder), progress=False, **opts)
    base = {"dtype": "float32", "kv_cache_memory": "4MiB", **kw}
    return Evaluator(make, base, window=48, max_tokens=96, prompts=3, gen_tokens=6, progress=False)


def test_reference_against_itself_is_exact(tiny_llama):
    ev = _evaluator(tiny_llama)
    ref = ev.start()
    assert len(ev.windows) == 2 and ev.num_tokens == 96 and len(ev.prompts) == 3
    assert ref.agreement is None and ref.perplexity > 1
    same = ev.measure(Setting("none again", {}))
    assert same.perplexity == pytest.approx(ref.perplexity, rel=1e-6)
    assert same.agreement == 1 and same.kl == pytest.approx(0, abs=1e-9)
    assert same.divergence == [6, 6, 6] and same.identical == 1


def test_quantized_setting_is_measured_against_the_float_model(tiny_llama):
    ev = _evaluator(tiny_llama, quantization="int4")
    ref = ev.start()
    assert "int4" not in ref.weight_formats  # the reference is unquantized
    r = ev.measure(Setting("int4", {}))
    assert "int4" in r.weight_formats and r.weight_bytes < ref.weight_bytes
    assert 0 < r.kl < 1 and 0.5 < r.agreement <= 1
    assert all(0 <= d <= 6 for d in r.divergence)
    assert r.to_dict()["mean_kl"] == r.kl


def test_reference_options_drop_every_lossy_option():
    opts = {"dtype": "bfloat16", "quantization": "int4", "quant_group_size": 64, "quant_symmetric": True,
            "seed": 3}
    assert reference_options(opts) == {"dtype": "bfloat16", "quantization": "none", "quant_group_size": None,
                                       "quant_symmetric": False, "seed": 3}


def test_kv_cache_setting_is_measured_against_a_float_cache(tiny_llama):
    ev = _evaluator(tiny_llama, kv_cache_dtype="fp8_e5m2")  # tiny heads (16) are too narrow for int4
    ev.start()
    assert reference_options(ev.options)["kv_cache_dtype"] == "auto"
    r = ev.measure(Setting("KV fp8_e5m2", {}))
    assert 0 < r.kl < 1 and r.agreement < 1  # a 2-bit-mantissa cache moves the distributions


def test_setting_names_say_what_is_lossy():
    assert setting_name(None, {"kv_cache_dtype": "auto"}) is None
    assert setting_name("int4", {}) == "int4"
    assert setting_name(None, {"kv_cache_dtype": "int8"}) == "KV int8"
    assert setting_name("w8a8", {"kv_cache_dtype": "auto", "kv_cache_dtype_k": "int8", "kv_cache_dtype_v": "int4"}) \
        == "w8a8 + KV int8/int4"


def test_sweep_settings_one_component_at_a_time():
    settings = sweep_settings({"quantization": "int4", "quant_group_size": 64, "quant_symmetric": True})
    names = [s.name for s in settings]
    assert names[0] == "int4-sym-g64: all linear layers"
    assert "int4-sym-g64: MLP down only" in names
    assert "int8: LM head only" in names  # int4 keeps an int8 head
    alone = settings[1].options
    assert alone["quantization"] == "none" and alone["layer_formats"] == (("*.qkv_proj", "int4-sym-g64"),)
    assert sweep_settings({"quantization": "none"})[0].name == "int8: all linear layers"
    scores = settings[-1]
    assert scores.component == "attention scores" and scores.options["quantization"] == "none"
    assert scores.options["attention_backend"] == "sdpa-scores-int8"


def test_eval_command_prints_table_ranking_and_json(tiny_llama, tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(["eval", str(tiny_llama), "--dtype", "float32", "--kv-cache-memory", "4MiB", "--window", "32",
               "--max-tokens", "64", "--prompts", "2", "--gen-tokens", "4", "--sweep", "--quantization", "int8",
               "--no-progress", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "none (reference)" in text and "int8: all linear layers" in text
    assert "sensitivity ranking" in text and "LM head" in text
    assert "top-1 agreement by position  KV cache int8: 0-128 " in text
    payload = json.loads(out.read_text())
    assert payload["windows"] == 2 and payload["tokens"] == 64
    # 7 weight settings + the KV cache + the attention scores
    assert len(payload["results"]) == 9 and len(payload["ranking"]) == 9
    assert "KV cache int8" in payload["ranking"] and "attention scores int8" in payload["ranking"]
    assert all(set(r["top1_agreement_by_position"]) == {"0-128"} for r in payload["results"])  # 32-token windows
    kls = [r["mean_kl"] for r in payload["results"]]
    ranked = [next(r for r in payload["results"] if r["name"] == n)["mean_kl"] for n in payload["ranking"]]
    assert ranked == sorted(kls, reverse=True)
    assert ranking([]) == []


def test_eval_command_errors(tiny_llama, capsys):
    assert main(["eval", str(tiny_llama), "--window", "1", "--no-progress"]) == 2
    assert "--window must be at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", str(tiny_llama), "--quantization", "int5"])


def test_eviction_settings_and_names():
    from ridgeline.eval.cli import eviction_settings
    opts = {"kv_eviction": "streaming", "kv_eviction_budget": 64, "kv_sink_tokens": 4}
    assert setting_name(None, opts) == "streaming 64 (4 sinks)"
    settings = eviction_settings({"kv_eviction": "none"}, (32, 48), ("streaming", "h2o"))
    assert [s.name for s in settings] == ["streaming 32 (4 sinks)", "streaming 48 (4 sinks)", "h2o 32 (4 sinks)",
                                          "h2o 48 (4 sinks)"]
    assert settings[3].options == {"kv_eviction": "h2o", "kv_eviction_budget": 48}
    assert reference_options(opts)["kv_eviction"] == "none"
    with pytest.raises(Exception, match="needs --kv-eviction"):
        eviction_settings({"kv_eviction": "none"}, (32,), None)


def test_eval_measures_eviction_budgets(tiny_llama, tmp_path, capsys):
    """Perplexity and teacher-forced top-1 agreement through the evicting steps; a budget that holds
    the whole window equals the reference."""
    out = tmp_path / "evict.json"
    rc = main(["eval", str(tiny_llama), "--dtype", "float32", "--kv-cache-memory", "4MiB", "--window", "96",
               "--max-tokens", "192", "--prompts", "1", "--gen-tokens", "4", "--block-size", "4",
               "--kv-eviction", "streaming", "--kv-eviction-budgets", "24,96", "--kv-eviction-policies",
               "streaming,h2o", "--no-progress", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "streaming 24 (4 sinks)" in text and "KV per request  h2o 24 (4 sinks): at most 24 of 96" in text
    res = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    ref = json.loads(out.read_text())["reference"]
    assert len(res) == 4 and all(r["mean_kl"] is None for r in res.values())
    for policy in ("streaming", "h2o"):
        full = res[f"{policy} 96 (4 sinks)"]
        assert full["top1_agreement"] == 1.0 and full["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-5)
        assert res[f"{policy} 24 (4 sinks)"]["top1_agreement"] < 1.0
        assert res[f"{policy} 24 (4 sinks)"]["kv_tokens_per_request"] == 24
