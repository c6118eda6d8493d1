"""The attention-sink weighting of calibration statistics (quant/calibrate.py): each window's first
SINK_TOKENS rows are kept apart, an attention projection's Hessian counts them SINK_WEIGHT times, and
GPTQ fitted to it reproduces those rows' outputs better than GPTQ fitted to the plain X^T X, at a small
price on the other rows (a property that could fail: measured, not assumed)."""
import torch

from ridgeline.quant import calibrate, gptq
from ridgeline.quant.calibrate import SINK_TOKENS, SINK_WEIGHT, InputStats


def _window(T: int, K: int, seed: int) -> torch.Tensor:
    """Correlated rows of a window whose first SINK_TOKENS rows are one fixed vector (plus a little
    noise) in every window, as a sink token's input is."""
    g = torch.Generator().manual_seed(seed)
    fixed = torch.Generator().manual_seed(99)
    mix = torch.randn(K, K, generator=fixed) / K ** 0.5 + torch.eye(K)
    sink = torch.randn(K, generator=fixed) * torch.linspace(3, 0.2, K)
    x = (torch.randn(T, K, generator=g) @ mix) * torch.linspace(0.2, 3, K)
    x[:SINK_TOKENS] = sink + 0.05 * torch.randn(SINK_TOKENS, K, generator=g)
    return x


def test_sink_rows_are_each_windows_leading_rows_and_weigh_only_in_attention():
    st = InputStats.empty(16)
    windows = [_window(64, 16, s) for s in range(3)]
    for w in windows:
        st.add(w)
    X = torch.cat(windows).double()
    lead = torch.cat([w[:SINK_TOKENS] for w in windows]).double()
    assert st.rows == 192
    assert torch.allclose(st.gram, X.t() @ X, rtol=1e-4, atol=1e-3)
    assert torch.allclose(st.sink, lead.t() @ lead, rtol=1e-4, atol=1e-3)
    assert torch.equal(st.hessian(False), st.gram)
    assert torch.allclose(st.hessian(True), st.gram + (SINK_WEIGHT - 1) * st.sink)
    s = torch.linspace(0.5, 2, 16)
    sc = st.scaled(s)  # the statistics of x / s
    Xs = X / s.double()
    assert torch.allclose(sc.gram, Xs.t() @ Xs, rtol=1e-4, atol=1e-3)
    assert torch.allclose(sc.hessian(True), InputStats(sc.gram, sc.abs_sum, sc.rows, sc.sink).hessian(True))


def test_statistics_without_sink_rows_give_the_plain_gram():
    st = InputStats(torch.eye(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), 1)
    assert torch.equal(st.hessian(True), st.gram)


def test_gptq_on_the_weighted_hessian_keeps_the_sink_rows_outputs():
    K, N = 256, 64
    W = torch.randn(N, K, generator=torch.Generator().manual_seed(7)) * 0.05
    st = InputStats.empty(K)
    for s in range(16):
        st.add(_window(512, K, s))
    held = [_window(512, K, 100 + s) for s in range(8)]
    sink = torch.cat([w[:SINK_TOKENS] for w in held])
    rest = torch.cat([w[SINK_TOKENS:] for w in held])
    err = lambda X, Wq: float(((X @ (W - Wq).t()) ** 2).mean())  # noqa: E731
    plain = gptq.quantize(W, st.hessian(False), 32, True).dequantize(32)
    weighted = gptq.quantize(W, st.hessian(True), 32, True).dequantize(32)
    assert err(sink, weighted) < 0.3 * err(sink, plain)
    assert err(rest, weighted) < 1.1 * err(rest, plain)
    assert calibrate.SINK_WEIGHT > 1 and calibrate.SINK_TOKENS >= 1
