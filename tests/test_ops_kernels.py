"""The fused element-wise C kernels (kernels/ops.c) agree with the torch path they replace."""
import pytest
import torch
import torch.nn.functional as F

from ridgeline.kernels import cpu_ops
from ridgeline.layers.rotary import Rotary


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_ops.available()


@pytest.mark.parametrize("T,H", [(1, 576), (5, 100), (300, 64)])
def test_rmsnorm_with_and_without_residual(T, H):
    torch.manual_seed(T + H)
    x, res, w = torch.randn(T, H), torch.randn(T, H) * 3, torch.randn(H)
    want = F.rms_norm(x, (H,), w, 1e-5)
    torch.testing.assert_close(cpu_ops.rmsnorm(x, w, 1e-5), want, atol=1e-5, rtol=1e-5)
    summed = x + res
    got = cpu_ops.rmsnorm(x, w, 1e-6, res)
    assert torch.equal(res, summed)  # the residual now holds x + residual
    torch.testing.assert_close(got, F.rms_norm(summed, (H,), w, 1e-6), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,I", [(1, 1536), (3, 37), (100, 80)])
def test_clamped_swiglu_matches_transformers_formula(T, I):
    """GPT-OSS's experts: gate clamped above, up on both sides, gate * sigmoid(alpha gate) * (up + 1)."""
    torch.manual_seed(T + I)
    gu = torch.randn(T, 2 * I) * 8  # well past the limit both ways
    gate, up = gu[:, :I].clamp(max=7.0), gu[:, I:].clamp(-7.0, 7.0)
    want = (up + 1) * (gate * torch.sigmoid(gate * 1.702))
    torch.testing.assert_close(cpu_ops.swiglu_clamp_mul(gu, 1.702, 7.0), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,I", [(1, 1536), (3, 37), (100, 80)])
def test_silu_mul(T, I):
    torch.manual_seed(T * I)
    gu = torch.randn(T, 2 * I) * 6
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    want = F.silu(gu[:, :I]) * gu[:, I:]
    torch.testing.assert_close(cpu_ops.silu_mul(gu), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_rope_kv_matches_rotary_and_cache_write(kv_dtype):
    torch.manual_seed(0)
    T, H, Hkv, D, NB, bs = 7, 6, 2, 16, 5, 4
    rot = Rotary(D, 64, 10000.0, None)
    rot.init_tables(torch.device("cpu"))
    qkv = torch.randn(T, (H + 2 * Hkv) * D) * 4
    positions = torch.tensor([0, 1, 2, 9, 33, 63, 5])
    slots = torch.tensor([4, 5, 6, 17, 3, 12, 19])
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    want_q, want_k = rot(positions, q.reshape(T, H, D), k.reshape(T, Hkv, D))
    kc, vc = torch.zeros(NB, bs, Hkv, D, dtype=kv_dtype), torch.zeros(NB, bs, Hkv, D, dtype=kv_dtype)
    want_kc, want_vc = kc.clone().view(-1, Hkv, D), vc.clone().view(-1, Hkv, D)
    want_kc[slots] = want_k.to(kv_dtype)
    want_vc[slots] = v.reshape(T, Hkv, D).to(kv_dtype)
    got = qkv.clone()
    cpu_ops.rope_kv(got, positions, rot.cos_sin, slots, kc, vc, H, Hkv, D, int(kv_dtype == torch.bfloat16) * 0x101)
    torch.testing.assert_close(got[:, :H * D].view(T, H, D), want_q, atol=1e-5, rtol=1e-5)
    # bf16 rounding is round-to-nearest-even like torch's; fp32 rotation may differ in the last bit
    torch.testing.assert_close(kc.view(-1, Hkv, D).float(), want_kc.float(), atol=1e-5, rtol=1e-2)
    assert torch.equal(vc.view(-1, Hkv, D), want_vc)
