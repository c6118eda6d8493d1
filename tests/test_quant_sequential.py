"""Sequential calibration (quant/sequential.py): layer by layer over kept hidden states, each layer
fitted to the inputs the already-quantized layers before it produce. The machinery reproduces the
engine's forward exactly; GPTQ's layer objective ||X W^T - X Q^T||^2 on those inputs is below
round-to-nearest's for every projection of every layer (a property that could fail)."""
import json

import pytest
import torch

from ridgeline.data import corpus
from ridgeline.formats import grid
from ridgeline.quant import gptq, sequential
from ridgeline.quant.quantize import QuantizeOptions, quantize_folder
from ridgeline.weights.safetensors_loader import iter_tensors
from quant_helpers import salient_model

TOKENS = 1024


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return salient_model(tmp_path_factory.mktemp("seq") / "src")


def test_layer_by_layer_equals_the_engine_forward_and_weights_set_back_change_nothing(src):
    runner = sequential.LayerRunner(src, corpus.text("calibration"), TOKENS, window=128, progress=False)
    try:
        engine = runner.engine
        want = [engine.prompt_hidden(w) for w in runner.windows]  # before set_weights: the C stack reads the old
        tensors = dict(iter_tensors(src))
        model = runner.model
        for i in range(len(runner.inner.layers)):
            runner.set_weights({n: t for n, t in tensors.items() if n.startswith(f"model.layers.{i}.")})
            runner.advance(i)
        for ref, h, r in zip(want, runner.hidden, runner.residual):
            final = model.model.norm(h.clone(), r.clone())[0]
            assert torch.allclose(final, ref, atol=1e-5, rtol=1e-4)
    finally:
        runner.close()


@pytest.mark.parametrize("symmetric,group", [(True, 32), (False, 32), (True, 64)])
def test_gptq_layer_objective_below_rtn_for_every_layer(src, symmetric, group):
    runner = sequential.LayerRunner(src, corpus.text("calibration"), TOKENS, window=256, progress=False)
    tensors = dict(iter_tensors(src))
    checked = []

    def quantize_layer(i, stats):
        out = {}
        for n, W in tensors.items():
            if not n.startswith(f"model.layers.{i}.") or not n.endswith("proj.weight"):
                continue
            engine_name = n.rsplit(".", 2)[0] + "." + {"q": "qkv", "k": "qkv", "v": "qkv", "o": "o", "gate": "gate_up",
                                                        "up": "gate_up", "down": "down"}[n.split(".")[-2][:-5]] + "_proj"
            H = stats[engine_name].gram
            g = grid.fit_groups(W, group, symmetric)
            rtn = g.dequantize(g.quantize(W, group), group)
            q = gptq.quantize(W, H, group, symmetric).dequantize(group)

            def obj(Wq):
                d = (W - Wq).double()
                return float(((d @ H) * d).sum())
            assert obj(q) < obj(rtn), (n, obj(q), obj(rtn))
            checked.append(n)
            out[n] = q
        return out
    try:
        sequential.run_layers(runner, len(runner.inner.layers), quantize_layer, "test")
    finally:
        runner.close()
    assert len(checked) == 2 * 7


def test_quantize_records_sequential_calibration(src, tmp_path):
    qc = quantize_folder(src, tmp_path / "out", QuantizeOptions("gptq", 4, 32, True, calibration_tokens=TOKENS),
                         progress=False)
    assert qc["sequential"] is True and qc["calibration_tokens"] == TOKENS
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"] == qc
