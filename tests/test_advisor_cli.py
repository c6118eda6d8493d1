"""`ridgeline advise`: every command runs, --json parses, bad input is one clear line and exit code 2."""
from __future__ import annotations

import json

import pytest

from ridgeline.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["advise", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_full_report_json(capsys):
    rc, out, _ = run(capsys, "--model", "Llama-3.1-70B", "--hardware", "H100", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["wall"]["name"] in {"capacity", "bandwidth", "compute", "network", "slo-contention"}
    mem = data["sections"]["memory"]["values"]
    assert mem["kv_bytes_per_token"]["value"] == 327_680
    assert mem["kv_bytes_per_token"]["numbers"] == "2 * 80 * 8 * 128 * 2"
    assert data["layout"]["devices"] >= 2
    assert data["techniques"] and all("trap" in t and "gain" in t for t in data["techniques"])


def test_text_report_shows_formulas(capsys):
    rc, out, _ = run(capsys, "--model", "Mixtral-8x7B", "--hardware", "H100", "--weights", "fp8")
    assert rc == 0
    assert "Binding wall" in out and "ridge batch" in out and "2 * layers * kv_heads * head_dim * bytes" in out
    assert "expert parallel" in out or "1 device" in out


@pytest.mark.parametrize("sub, expect", [("kv", "Maximum concurrency by context"),
                                         ("gpus", "Devices by weight precision"),
                                         ("spec", "expected tokens per verification pass"), ("disagg", "verdict")])
def test_calculators(capsys, sub, expect):
    rc, out, _ = run(capsys, "--model", "Llama-3.1-405B", "--hardware", "H100", sub, "--weights", "fp8")
    assert rc == 0 and expect in out


def test_gpus_calculator_405b(capsys):
    rc, out, _ = run(capsys, "gpus", "--model", "Llama-3.1-405B", "--hardware", "H100", "--concurrency", "1",
                     "--prompt-len", "16", "--output-len", "16", "--json")
    values = json.loads(out)["sections"]["gpus_by_precision"]["values"]
    assert values["min_fp8"]["value"] == 6 and values["min_bf16"]["value"] == 12
    assert "TP8 x PP2" in values["min_bf16"]["label"]


def test_config_json_path_and_rate(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
                               "max_position_embeddings": 4096}))
    rc, out, _ = run(capsys, "--model", str(cfg), "--hardware", "L4", "--rate", "5", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["model"]["kv_heads"] == 2 and data["model"]["params"] > 0


def test_plot(capsys, tmp_path):
    png = tmp_path / "roofline.png"
    rc, _, _ = run(capsys, "--model", "Llama-3.1-8B", "--plot", str(png))
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--prompt-len", "0"], "prompt len must be a positive integer"),
    (["--output-len", "-5"], "output len must be a positive integer"),
    (["--hardware", "tpu-v9"], "known: H100-SXM, H200"),
    (["--model", "gpt-17"], "Llama-3.1-405B"),
    (["--model", "Llama-3.1-405B", "--hardware", "L4", "--weights", "fp32"], "cannot fit on any count of L4"),
    (["--model", "Llama-3.1-70B", "--hardware", "Ryzen-7950X"], "cannot fit on any count"),
    (["--weights", "fp3"], "unknown precision"),
    (["--prefix-share", "1.5"], "prefix share"),
    (["--model", "SmolLM2-135M", "--prompt-len", "9000"], "maximum context"),
    (["spec", "--alpha", "1.2"], "alpha"),
])
def test_bad_input_is_a_message_and_exit_2(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert err.startswith("error: ")


def test_config_missing_field_and_bad_json(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    rc, _, err = run(capsys, "--model", str(cfg))
    assert rc == 2 and "'num_hidden_layers'" in err and "'vocab_size'" in err
    cfg.write_text("{not json")
    rc, _, err = run(capsys, "--model", str(cfg))
    assert rc == 2 and "not valid JSON" in err


def test_local_profile_is_cached(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from ridgeline.advisor import local_profile

    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path))
    fake = {"version": local_profile.PROFILE_VERSION, "name": "local test-cpu", "kind": "cpu", "threads": 2,
            "torch": "x", "memory": 16e9, "bandwidth": 20e9, "flops": {"fp32": 1e11, "bf16": 2e11},
            "weight_stream_bw": {"fp32": 15e9}, "op_overhead": 2e-6, "clock": "wall", "measured_at": "now"}
    calls = []
    monkeypatch.setattr(local_profile, "measure", lambda device, clock: calls.append(1) or fake)
    first = local_profile.local_hardware(verbose=False)
    second = local_profile.local_hardware(verbose=False)
    assert len(calls) == 1 and first == second
    assert first.bandwidth == 20e9 and first.compute_precision("bf16") == "bf16" and first.op_overhead == 2e-6
    assert list(tmp_path.glob("advisor/profile-*.json"))


@pytest.mark.default_model
def test_alias_resolves_through_the_engine_like_the_table():
    from ridgeline.advisor.model_config import resolve_spec, spec_from_loadable

    engine_side = spec_from_loadable("smollm2-135m")
    assert engine_side.num_params == resolve_spec("SmolLM2-135M").num_params == 134_515_008
    assert engine_side.kv_elems_per_token == 2 * 30 * 3 * 64


def test_validate_prefix_gain_serves_the_shared_blocks_from_the_cache(tiny_llama):
    import time

    from ridgeline import LLM
    from ridgeline.advisor.validate import prefix_gain
    llm = LLM(str(tiny_llama), kv_cache_memory="4MiB")
    cold, warm, cached = prefix_gain(llm.engine, time.perf_counter, length=96, share=0.5, reps=1)
    assert cached == 48  # three full 16-token blocks of the shared half
    assert cold > 0 and warm > 0
    llm.engine.kv.check_integrity()  # raises on a leaked or inconsistent block
    assert not llm.engine.requests  # every request it added was aborted
