"""`ridgeline bench disagg` (KV transfer cost, stored in the local profile) and `ridgeline advise disagg`
(the measured cost and goodput explained, --simulate over a trace, --validate). Asserts structure and
arithmetic, never a speed."""
from __future__ import annotations

import json

import pytest

from ridgeline.advisor import transfer_profile
from ridgeline.advisor.disagg_sim import Costs, TraceRequest, colocated, disaggregated, load_trace
from ridgeline.advisor.errors import AdvisorError
from ridgeline.cli import main
from ridgeline.measure.kv_transfer import Shape, fit_line, measure


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    return tmp_path


def test_fit_line_recovers_fixed_and_slope():
    fixed, per = fit_line([(100, 0.002 + 100e-6), (400, 0.002 + 400e-6), (1600, 0.002 + 1600e-6)])
    assert fixed == pytest.approx(0.002) and per == pytest.approx(1e-6)


def test_measure_moves_every_configuration_between_processes():
    shape = Shape(2, 2, 16)
    got = measure(shape, ["tcp", "shm"], ["bf16", "int8"], [16, 64], reps=1)
    for c in ("tcp", "shm"):
        assert got[c]["bf16"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # layers x K,V x heads x dim x 2 B
        assert got[c]["int8"]["bytes_per_token"] == 2 * 2 * 2 * (16 + 2)  # int8 data + an fp16 scale
        assert [n for n, s in got[c]["int8"]["points"]] == [16, 64]
        assert all(s > 0 for _, s in got[c]["int8"]["points"])


def test_bench_stores_the_profile_and_advise_reads_it(home, tiny_llama, capsys):
    rc = main(["bench", "disagg", "--model", str(tiny_llama), "--lengths", "16,64", "--reps", "1",
               "--prompt-len", "64", "--json", str(home / "out.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "us/token" in out and "load average" in out and "engine on this machine" in out
    profile = transfer_profile.load()
    engine = profile["engine"]  # the engine's own costs, for --simulate's efficiencies
    assert engine["prefill"]["tokens"] == 64 and engine["decode"]["batch"] == 1
    assert engine["prefill"]["wall_s"] > 0 and engine["decode"]["wall_s"] > 0 and engine["threads"] >= 1
    assert set(profile["transfer"]["connectors"]) == {"shm", "tcp"}
    assert json.loads((home / "out.json").read_text())["transfer"]["lengths"] == [16, 64]
    cost = transfer_profile.transfer_cost(profile, "bf16")
    assert cost["connector"] in ("shm", "tcp") and cost["per_token_s"] >= 0
    rc = main(["advise", "disagg", "--model", str(tiny_llama), "--hardware", "H100", "--prompt-len", "256"])
    text = capsys.readouterr().out
    assert rc == 0 and "KV transfer measured on this machine" in text and "one 256-token prompt" in text


def test_advise_explains_a_stored_goodput_result(home, capsys):
    transfer_profile.save("transfer", {"connectors": {"shm": {"bf16": {
        "points": [[128, 0.001]], "fixed_s": 0.0005, "per_token_s": 2e-6, "bytes_per_token": 23040}}}})
    transfer_profile.save("goodput", {
        "prompt_len": 1024, "output_len": 32, "request_rate": 0.25, "ttft_slo_s": 10.0, "tpot_slo_s": 0.15,
        "load_note": "load average 3.0 on 2 cores (under load)", "rows": [
            {"deployment": "1P1D (shm)", "good": 10, "goodput_rps": 0.2, "ttft_p50_s": 3.0, "tpot_p50_s": 0.05,
             "tpot_p90_s": 0.07},
            {"deployment": "2 co-located replicas", "good": 4, "goodput_rps": 0.08, "ttft_p50_s": 2.0,
             "tpot_p50_s": 0.2, "tpot_p90_s": 0.4}]})
    rc = main(["advise", "disagg", "--hardware", "H100", "--kv", "bf16"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "Measured goodput" in text and "2 co-located replicas" in text
    assert "TPOT ~ step + C x prefill / O" in text and "busy rate x prefill" in text


def _costs(prefill=1.0, step=0.05, transfer=0.01):
    return Costs(lambda p: prefill * p / 1000, lambda b, c: step, lambda p: transfer)


def test_simulator_colocated_prefills_stall_decodes_and_disaggregation_does_not():
    trace = [TraceRequest(i * 0.6, 500, 20) for i in range(20)]  # prefill 0.5 s, one every 0.6 s
    co = colocated(trace, 2, _costs(), 1)
    pd = disaggregated(trace, 1, 1, _costs(), 1)
    assert max(pd.tpot) <= 0.05 * 20 / 19 + 1e-9  # only decode steps (and joining at a step's end)
    assert max(co.tpot) > 0.06  # prefills ran between its decode steps
    assert max(pd.ttft) == pytest.approx(0.5 + 0.01)  # prefill, then the transfer
    assert co.devices == pd.devices == 2
    assert pd.attainment(10, 0.06) == 1.0 and co.attainment(10, 0.06) < 1.0


def test_simulate_names_the_cheapest_configuration(home, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"arrival": i * 0.05, "prompt_tokens": 4000, "output_tokens": 200})
                               for i in range(40)))
    rc = main(["advise", "disagg", "--model", "Llama-3.1-8B", "--hardware", "H100", "--simulate", str(trace),
               "--tpot-slo-ms", "30", "--ttft-slo-ms", "2000", "--max-instances", "4"])
    text = capsys.readouterr().out
    assert rc == 0 and "1P1D" in text and "1 co-located" in text and "verdict:" in text


def test_bad_traces_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival": 0, "prompt_tokens": 10}\n')
    with pytest.raises(AdvisorError, match="bad.jsonl:1"):
        load_trace(str(bad))
    bad.write_text('{"arrival": -1, "prompt_tokens": 10, "output_tokens": 5}\n')
    with pytest.raises(AdvisorError, match="arrival >= 0"):
        load_trace(str(bad))
    with pytest.raises(AdvisorError, match="cannot read"):
        load_trace(str(tmp_path / "missing.jsonl"))


def test_validate_prints_predicted_and_measured(home, tiny_llama, capsys):
    transfer_profile.save("transfer", {"connectors": {"tcp": {"bf16": {
        "points": [[128, 0.001]], "fixed_s": 0.0005, "per_token_s": 2e-7,
        "bytes_per_token": 2 * 2 * 2 * 16 * 2}}}})
    rc = main(["advise", "disagg", "--model", str(tiny_llama), "--hardware", "H100", "--validate",
               "--prompt-len", "256"])
    text = capsys.readouterr().out
    assert rc == 0 and text.count("predicted") == 4 and "ratio" in text


def test_validate_without_a_profile_says_what_to_run(home, tiny_llama, capsys):
    assert main(["advise", "disagg", "--model", str(tiny_llama), "--hardware", "H100", "--validate",
                 "--prompt-len", "256"]) == 2
    assert "ridgeline bench disagg" in capsys.readouterr().err
