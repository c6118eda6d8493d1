"""`advise --hardware auto --weights auto` (the defaults): the visible GPU's table entry or this machine's
measured profile, and the format the engine runs the model in."""
import json

import pytest

from ridgeline.advisor import defaults
from ridgeline.cli import main


@pytest.mark.parametrize("device, entry", [("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
                                           ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"),
                                           ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("AMD Instinct MI300X", "MI300X"),
                                           ("Some Future Accelerator", "local")])
def test_a_gpu_name_picks_its_table_entry_else_local(device, entry):
    assert defaults.table_match(device) == entry


def test_auto_hardware_is_this_machine_without_a_gpu(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert defaults.hardware_name("auto") == "local" and defaults.hardware_name("L4") == "L4"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 PCIe")
    assert defaults.hardware_name("auto") == "H100-SXM"


@pytest.mark.parametrize("bpp, prec", [(0.5625, "int4"), (0.67, "int4"), (1.0625, "int8"), (2.0, "bf16"), (4.0, "fp32")])
def test_bytes_per_weight_name_the_precision(bpp, prec):
    assert defaults.precision_of(bpp) == prec


def test_auto_weights_follow_the_models_files(tmp_path, tiny_llama):
    assert defaults.weights_for("auto", "Llama-3.1-8B", 8e9) == "bf16"  # a shipped configuration
    assert defaults.weights_for("fp8", "Llama-3.1-8B", 8e9) == "fp8"
    assert defaults.weights_for("auto", str(tiny_llama), 1e6) == "bf16"
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    (gptq / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 4}}))
    assert defaults.weights_for("auto", str(gptq), 1e6) == "int4"


@pytest.mark.default_model
def test_the_default_models_advice_is_its_4_bit_blocks_on_this_machine(capsys, monkeypatch):
    from ridgeline.weights.pull import pull
    pull("smollm2-135m", progress=False)
    monkeypatch.setattr(defaults, "hardware_name", lambda name: "Xeon-8480" if name == "auto" else name)
    assert main(["advise", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["weight_precision"] == "int4"  # Q4_1 layers, Q8_0 embedding: 0.67 bytes per weight
