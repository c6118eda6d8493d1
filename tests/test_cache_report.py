"""`ridgeline cache-report` on a small JSONL log: share fraction, simulated hit rates, divergence."""
from __future__ import annotations

import json

from ridgeline.cache_report.analyze import divergences, share_fraction, simulate
from ridgeline.cli import main

SYSTEM = "You are the support bot of Northwind Cycles. Current time: {t}. Answer questions about orders, " \
         "returns, repairs and warranty politely, in two sentences at most, and never promise dates."


def _chat(t: str, question: str, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "system", "content": SYSTEM.format(t=t)},
                                          {"role": "user", "content": question}], **extra}


def test_share_fraction_and_simulation_agree_with_the_kv_manager():
    a = list(range(100, 140))  # 40 tokens: 2 full blocks of 16 cacheable (the last token never is)
    prompts = [a, a, a[:20] + [1] * 20, a + [7]]
    # a: 0; a: 32; third: block 0 (16); fourth: 2 blocks (32); of 40 + 40 + 40 + 41 tokens
    assert share_fraction(prompts, 16) == 80 / 161
    unbounded = simulate(prompts, 16, 10_000)
    assert (unbounded.hit_tokens, unbounded.prompt_tokens, unbounded.evictions) == (80, 161, 0)
    tight = simulate(prompts, 16, 48)  # 3 blocks: the third prompt's tail evicts a's second block
    assert tight.hit_tokens == 32 + 16 + 16 and tight.evictions > 0
    assert simulate(prompts, 16, 16).too_long == 4
    tiered = simulate(prompts, 16, 48, tier_tokens=64)  # a's evicted block comes back from the tier
    assert tiered.hit_tokens == 80 and tiered.tier_hit_tokens == 16 and tiered.tier_capacity_tokens == 64
    salted = share_fraction(prompts, 16, salts=["x", "y", "x", "x"])
    assert salted == (16 + 32) / 161


def test_divergence_finds_the_varying_field_and_what_agrees_after():
    base = list(range(1, 200))
    a = base[:40] + [900, 901] + base[40:]
    b = base[:40] + [902, 903, 904] + base[40:]
    [group] = divergences([a, b, list(a)], 16)
    assert group.count == 3 and len(group.divergences) == 1  # the third equals the reference
    d = group.example()
    assert (d.position, d.reference, d.other, d.agree_after) == (40, [900, 901], [902, 903, 904], 159)


def test_cache_report_cli_on_a_jsonl_log(tiny_llama, tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    rows = [_chat("2024-05-01 10:32:07", "Where is my order?"),
            _chat("2024-05-01 10:35:41", "Can I return a helmet?"),
            _chat("2024-05-01 10:39:12", "Do you ship on Saturdays?", cache_salt="tenant-b"),
            {"model": "tiny", "prompt": ["The quick brown fox jumps over the lazy dog " * 2] * 2}]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n{\"model\": \"tiny\"}\n\n")
    out = tmp_path / "report.json"
    assert main(["cache-report", str(log), "--model", str(tiny_llama), "--kv-tokens", "256", "64k",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["requests"] == 5 and len(report["skipped_lines"]) == 2
    assert "line 5: not JSON" in report["skipped_lines"][0]
    small, big = report["simulations"]
    assert small["capacity_tokens"] == 256 and big["capacity_tokens"] == 65536
    assert big["hit_tokens"] / big["prompt_tokens"] == report["share_fraction"] > 0
    group = report["groups"][0]
    assert group["requests"] == 3 and group["diverging_here"] == 2
    assert "10:3" in group["context"] and group["reference_text"] == "2:07" and group["other_text"] == "5:41"
    assert group["agree_after"] > 100
    assert "prefix-share fraction f" in text and "'2:07'" in text and "agree again" in text
    assert main(["cache-report", str(log), "--model", str(tiny_llama), "--kv-tokens", "32",
                 "--offload-tokens", "1k"]) == 0
    assert "from the offload tier" in capsys.readouterr().out


def test_simulated_offload_tier_counts_hits_loads_and_stores():
    a, b = list(range(1, 65)), list(range(100, 164))  # 4 blocks each; the cache holds 4
    sim = simulate([a, b, a], 16, 64, tier_tokens=1024)
    assert sim.tier_stores == 8  # a's blocks, evicted for b's, then b's for a's again
    # a's first 3 blocks come back (a match leaves the prompt's last token to compute)
    assert (sim.tier_loads, sim.tier_hit_tokens, sim.hit_tokens) == (3, 48, 48)


def test_the_log_reader_takes_the_servers_prompt_shapes(tiny_llama, tmp_path):
    """Chat content as text parts (joined as the server joins them), completion prompts as text, token
    ids or a list of either; a body the server would refuse is a skipped line naming what is wrong."""
    from ridgeline.cache_report.load import load_prompts
    from ridgeline.weights.tokenizer import Tokenizer
    tok = Tokenizer(tiny_llama)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    rows = [parts, {"messages": [{"role": "user", "content": "a\nb"}], "cache_salt": "s"},
            {"prompt": [[5, 6, 7], "hello"]}, {"prompt": [9, 8]},
            {"messages": [{"role": "robot", "content": "hi"}]}, {"prompt": []}, {"prompt": [[]]}]
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts, problems = load_prompts(log, tok)
    assert [p.line for p in prompts] == [1, 2, 3, 3, 4]
    assert prompts[0].ids == prompts[1].ids and (prompts[0].salt, prompts[1].salt) == (None, "s")
    assert prompts[2].ids == [5, 6, 7] and prompts[3].ids == tok.encode("hello") and prompts[4].ids == [9, 8]
    assert problems == ["line 5: messages.0.role: must be one of system, user, assistant, developer",
                        "line 6: prompt: must not be empty",
                        "line 7: prompt.0: must be a string or a non-empty list of integer token ids, not list"]
