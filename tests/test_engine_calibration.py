"""`advise disagg --simulate` with this machine's measured engine costs scaled to a device table
(advisor/engine_calibration.py): the efficiency arithmetic on a synthetic profile, the simulator's
choice moving with the efficiencies, and the fallback to the plain roofline. Never a speed."""
from __future__ import annotations

import json

import pytest
import torch

from ridgeline.advisor import local_profile, transfer_profile
from ridgeline.advisor.disagg_advice import cheapest
from ridgeline.advisor.disagg_sim import Costs, TraceRequest, search
from ridgeline.advisor.engine_calibration import Calibration, calibrate, scaled_hardware
from ridgeline.advisor.hardware import HardwareSpec, lookup_hardware
from ridgeline.advisor.model_config import resolve_spec
from ridgeline.advisor.roofline import Platform, decode_step, prefill
from ridgeline.cli import main

LOCAL = HardwareSpec("local test cpu", "cpu", 64e9, 20e9, {"bf16": 200e9, "fp32": 100e9})
MODEL = "Llama-3.1-8B"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    return tmp_path


def _measured(prefill_factor: float, decode_factor: float) -> dict:
    """An engine measurement `factor` times slower than LOCAL's roofline term."""
    pl = Platform(resolve_spec(MODEL), LOCAL, "bf16", "bf16")
    return {"model": MODEL, "weights": "bf16", "kv": "bf16", "threads": torch.get_num_threads(), "reps": 3,
            "prefill": {"tokens": 512, "wall_s": prefill(pl, 512).compute * prefill_factor, "cpu_s": 0.0},
            "decode": {"batch": 1, "context": 520, "wall_s": decode_step(pl, 1, 520).memory * decode_factor,
                       "cpu_s": 0.0}}


def test_efficiencies_and_the_scaled_device():
    cal = calibrate(_measured(4.0, 5.0), LOCAL, resolve_spec(MODEL))
    assert cal.prefill_eff == pytest.approx(0.25) and cal.decode_eff == pytest.approx(0.2)
    assert "efficiency 25.0%" in cal.lines[1] and "compute-bound" in cal.lines[1]
    assert "efficiency 20.0%" in cal.lines[2] and "bandwidth-bound" in cal.lines[2]
    h100 = lookup_hardware("H100")
    scaled = scaled_hardware(h100, cal)
    assert scaled.bandwidth == pytest.approx(h100.bandwidth * 0.2)
    assert scaled.flops["bf16"] == pytest.approx(h100.flops["bf16"] * 0.25)
    # bandwidth-bound decode of one sequence: 5x the device's roofline
    pl, spl = Platform(resolve_spec(MODEL), h100), Platform(resolve_spec(MODEL), scaled)
    assert decode_step(spl, 1, 1000).memory == pytest.approx(decode_step(pl, 1, 1000).memory * 5)
    assert prefill(spl, 2000).compute == pytest.approx(prefill(pl, 2000).compute * 4)


def test_an_engine_faster_than_the_roofline_is_capped_at_full_efficiency():
    cal = calibrate(_measured(0.5, 1.0), LOCAL, resolve_spec(MODEL))
    assert cal.prefill_eff == 1.0 and "capped" in cal.lines[1]


def _choice(prefill_eff: float, decode_eff: float):
    h100 = lookup_hardware("H100")
    pl = Platform(resolve_spec(MODEL), scaled_hardware(h100, Calibration(prefill_eff, decode_eff, ())))
    costs = Costs(lambda p: prefill(pl, p).total, lambda b, c: decode_step(pl, b, c).total, lambda p: 1e-3 + p * 1e-6)
    trace = [TraceRequest(i * 0.05, 4000, 200) for i in range(40)]
    return cheapest(search(trace, costs, 1, 6), 2.0, 0.03, 0.9)


def test_the_simulator_picks_another_configuration_when_the_efficiencies_change():
    full = _choice(1.0, 1.0)
    slow_prefill, slow_decode = _choice(0.2, 1.0), _choice(1.0, 0.3)
    assert full is not None and slow_prefill is not None and slow_decode is not None
    assert slow_prefill.name != full.name and slow_prefill.devices > full.devices
    assert slow_decode.name != full.name and slow_decode.devices > full.devices


def _write_local_profile(threads: int) -> None:
    path = local_profile._cache_path("auto", "wall")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": local_profile.PROFILE_VERSION, "name": "local test cpu", "kind": "cpu",
                                "threads": threads, "torch": torch.__version__, "memory": 64e9, "bandwidth": 20e9,
                                "flops": {"bf16": 200e9, "fp32": 100e9}, "weight_stream_bw": {}, "op_overhead": 0.0,
                                "gemm_curve": {}, "clock": "wall", "measured_at": "2026-01-01 00:00:00"}))


def _simulate(tmp_path, capsys) -> str:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"arrival": i * 0.05, "prompt_tokens": 4000, "output_tokens": 200})
                               for i in range(20)))
    transfer_profile.save("transfer", {"connectors": {"shm": {"bf16": {
        "points": [[128, 0.001]], "fixed_s": 0.0005, "per_token_s": 2e-6, "bytes_per_token": 23040}}}})
    assert main(["advise", "disagg", "--model", MODEL, "--hardware", "H100", "--simulate", str(trace),
                 "--tpot-slo-ms", "30", "--ttft-slo-ms", "2000", "--max-instances", "3"]) == 0
    return capsys.readouterr().out


def test_simulate_prints_the_scaling_arithmetic(home, tmp_path, capsys):
    measured = _measured(4.0, 5.0)
    _write_local_profile(measured["threads"])
    transfer_profile.save("engine", measured)
    text = _simulate(tmp_path, capsys)
    assert "engine measured on this machine" in text and "local roofline: local test cpu" in text
    assert "efficiency 25.0%" in text and "efficiency 20.0%" in text
    assert "x 25.0% =" in text and "x 20.0% =" in text and "-> scaled" in text and "verdict:" in text


def test_simulate_without_an_engine_measurement_says_it_uses_the_plain_roofline(home, tmp_path, capsys):
    text = _simulate(tmp_path, capsys)
    assert "not measured on this machine" in text and "plain roofline" in text and "verdict:" in text
