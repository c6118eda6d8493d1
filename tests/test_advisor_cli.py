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
    rc, _, _ = run(capsys, "--model", "Llama-3.1-8B", "--hardware", "H100", "--plot", str(png))
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
    (["--rate", "inf"], "rate must be a positive finite number"),
    (["--rate", "nan"], "rate must be a positive finite number"),
    (["--ttft-slo-ms", "nan"], "--ttft-slo-ms must be a positive finite number"),
    (["--tpot-slo-ms", "-1"], "--tpot-slo-ms must be a positive finite number"),
    (["--draft-cost", "nan"], "finite --draft-cost"),
    (["--draft-cost", "inf"], "finite --draft-cost"),
    (["--validate", "--batches", "1,x,4"], "--batches needs at least three positive batch sizes"),
    (["--validate", "--kv-cache-memory", "zz"], "cannot parse a size"),  # before the machine is profiled
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


def _strict_json(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"{name} in --json output")
    return json.loads(text, parse_constant=refuse)


def test_too_few_gpus_says_it_does_not_fit_with_the_arithmetic_and_what_would(capsys):
    rc, out, _ = run(capsys, "--model", "Llama-3.1-70B", "--hardware", "L4", "--gpus", "1")
    assert rc == 0 and "fits on one device" not in out
    assert ("does not fit on 1 x L4: weights (bf16) 141 GB + KV for 16 requests 6.71 GB = 148 GB > "
            "1 x 21.6 GB usable = 21.6 GB; 7 devices hold it (--gpus 7), or 4 at --weights fp8, "
            "or 2 at --weights int4") in out
    assert "Binding wall: CAPACITY" in out
    for argv in (["--gpus", "7"], ["--gpus", "4", "--weights", "fp8"], ["--gpus", "2", "--weights", "int4"]):
        rc, out, _ = run(capsys, "--model", "Llama-3.1-70B", "--hardware", "L4", *argv, "--json")
        data = _strict_json(out)
        assert rc == 0 and "does not fit" not in data["layout"]["reason"], argv
        assert data["layout"]["devices"] >= data["sections"]["parallelism"]["values"]["needed"]["value"]
        assert data["wall"]["name"] != "capacity"


EXTREMES = [
    ["--model", "Llama-3.1-70B", "--hardware", "L4", "--gpus", "1"],
    ["--model", "Llama-3.1-70B", "--hardware", "L4", "--gpus", "3"],
    ["--model", "Llama-3.1-405B", "--hardware", "H100", "--gpus", "8"],
    ["--model", "Mixtral-8x7B", "--hardware", "L4", "--gpus", "3"],
    ["--model", "Llama-3.1-8B", "--hardware", "L4", "--concurrency", "2000", "--gpus", "1"],
    ["--model", "Llama-3.1-8B", "--hardware", "H100", "--gpus", "64"],
    ["--model", "Llama-3.1-8B", "--hardware", "H100", "--rate", "1000000"],
    ["--model", "Llama-3.1-8B", "--hardware", "H100", "--prompt-len", "130000", "--output-len", "1000"],
    ["--model", "Llama-3.1-8B", "--hardware", "H100", "--prefix-share", "0.999999", "--draft-cost", "0"],
    ["--model", "SmolLM2-135M", "--hardware", "Ryzen-7950X", "--alpha", "0"],
]


@pytest.mark.parametrize("sub", [[], ["kv"], ["gpus"], ["spec"], ["disagg"]])
@pytest.mark.parametrize("argv", EXTREMES)
def test_extreme_inputs_never_print_inf_nan_or_a_false_fit(capsys, argv, sub):
    import re
    rc, out, err = run(capsys, *sub, *argv)
    assert rc == 0, err
    assert not re.search(r"\b(inf|nan)x?\b|infx|nanx", out, re.IGNORECASE), out
    _strict_json(run(capsys, *sub, *argv, "--json")[1])


@pytest.mark.parametrize("argv", EXTREMES)
def test_the_layout_says_whether_it_fits(capsys, argv):
    data = _strict_json(run(capsys, "gpus", *argv, "--json")[1])
    layout, needed = data["layout"], data["sections"]["parallelism"]["values"]["needed"]["value"]
    assert ("does not fit" in layout["reason"]) == (layout["devices"] < needed), layout
    assert "fits on one device" not in layout["reason"] or needed == 1
    assert layout["pp"] <= data["model"]["layers"]  # a pipeline stage holds at least one layer


def test_no_link_means_no_disaggregation(capsys):
    rc, out, _ = run(capsys, "--model", "SmolLM2-135M", "--hardware", "Ryzen-7950X")
    line = next(x for x in out.splitlines() if "disaggregation:" in x)
    assert line.endswith("TRAP HERE") and "has no link between devices to move it over" in out


def test_ratios_over_zero_have_no_multiplier():
    from ridgeline.advisor.units import finite_or_none, fmt_ratio, fmt_time, fmt_value
    assert fmt_ratio(1.234) == "1.23x"
    assert fmt_ratio(float("inf")) == "unbounded (from zero)" and fmt_ratio(float("nan")) == "n/a"
    assert fmt_value(float("inf"), "sequences") == "unbounded" and fmt_time(float("inf")) == "never"
    assert fmt_value(1, "devices") == "1 device" and fmt_value(2, "devices") == "2 devices"
    assert finite_or_none({"a": [1.0, float("inf")], "b": float("nan")}) == {"a": [1.0, None], "b": None}


def test_validate_quant_rows_predict_and_measure_int8_and_int4(tiny_llama):
    """A bandwidth-bound profile predicts 2x (int8) and 4x (int4) over bf16 at batch 1; the measured
    column is whatever the engines took (positive), with the stored bytes named."""
    import time

    from ridgeline import LLM
    from ridgeline.advisor.hardware import HardwareSpec
    from ridgeline.advisor.model_config import spec_from_arch
    from ridgeline.advisor.roofline import Platform
    from ridgeline.advisor.validate_quant import quant_rows
    from ridgeline.engine.run import start_engine
    from ridgeline.sampling_params import SamplingParams

    def decode(eng, batch, steps, salt, clock):  # validate._decode's contract, with the tiny vocabulary's ids
        eng.add_request(f"d{salt}", [5, 6, 7], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
        t = clock()
        while f"d{salt}" in eng.requests and not eng.requests[f"d{salt}"].status.finished:
            eng.step(emit_unfinished=False)
        eng.abort_request(f"d{salt}")
        return (clock() - t) / steps, 0, 0

    base = LLM(str(tiny_llama), kv_cache_memory="4MiB", dtype="bfloat16")
    hw = HardwareSpec("test", "cpu", 1e10, 1e9, {"bf16": 1e15, "int8": 1e15})  # 1 GB/s: weights dominate
    pl = Platform(spec_from_arch(base.engine.arch, "tiny"), hw, "bf16", "bf16")
    step, _, _ = decode(base.engine, 1, 4, 1, time.perf_counter)
    rows = quant_rows(lambda q: start_engine(str(tiny_llama), kv_cache_memory="4MiB", dtype="bfloat16",
                                            quantization=q),
                      pl, step, 0, 37, 4, time.perf_counter, decode)
    assert [r[0] for r in rows] == ["batch-1 decode speed-up, int8 (x)", "batch-1 decode speed-up, int4 (x)"]
    (_, p8, m8, note8), (_, p4, m4, _) = rows
    assert 1.8 < p8 < 2.0 < 3.0 < p4 < 4.0 and m8 > 0 and m4 > 0  # KV and host calls keep it under 2x / 4x
    assert "MB of linear weights stored" in note8


def test_spec_validate_prints_predicted_beside_measured(capsys, monkeypatch, tiny_llama, tiny_head):
    """`advise spec --validate`: per batch size the measured acceptance, drafts per verification and
    draft cost, the roofline's predicted speed-up from them and the measured one (the profile: a
    table device here, so no machine profile runs in the test)."""
    from ridgeline.advisor import local_profile
    from ridgeline.advisor.hardware import lookup_hardware
    monkeypatch.setattr(local_profile, "local_hardware", lambda **kw: lookup_hardware("H100"))
    rc, out, err = run(capsys, "spec", "--validate", "--model", str(tiny_llama), "--speculative-method", "eagle",
                       "--draft-model", str(tiny_head), "--draft-len", "2", "--batch-sizes", "1,2", "--requests", "2",
                       "--repeats", "1", "--output-len", "12", "--dtype", "float32")
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2"]
    for r in rows:  # batch, alpha, k_eff, c_draft, verify/decode, predicted, measured, error
        assert len(r) == 8 and r[5].endswith("x") and r[6].endswith("x") and 1 <= float(r[2]) <= 2
    rc, _, err = run(capsys, "spec", "--validate", "--batch-sizes", "0,x")
    assert rc == 2 and "--batch-sizes needs positive batch sizes" in err
