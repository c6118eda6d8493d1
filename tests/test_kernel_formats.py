"""The weight-format codes: one table (ridgeline/kernels/formats.py) that the checked-in C header is
generated from; a stale header fails here and refuses to build, and every packed weight's code is the
row of the kernel it calls."""
import pytest
import torch

from ridgeline.kernels import cpu, cpu_fpquant, cpu_quant, cpu_stack, formats
from ridgeline.formats import fpq, rtn


def test_the_checked_in_header_is_the_tables():
    assert formats.stale_header() is None, formats.stale_header()


def test_a_stale_header_is_named_and_refuses_the_build(tmp_path, monkeypatch):
    stale = tmp_path / "formats.h"
    stale.write_text(formats.render_header().replace("WF_I8_G32 = 45", "WF_I8_G32 = 47"))
    monkeypatch.setattr(formats, "HEADER", stale)
    assert "python -m ridgeline.kernels.formats" in formats.stale_header()
    with pytest.raises(RuntimeError, match="does not match ridgeline/kernels/formats.py"):
        cpu._build()


def test_the_table_refuses_a_code_or_name_twice():
    twice = (*formats.TABLE, formats.WeightCode(3, "again", "i8"))
    with pytest.raises(ValueError, match="appears twice"):
        formats.render_header(twice)
    with pytest.raises(KeyError, match="no weight-format code for kernel i4"):
        formats.code_of("i4", 48)


def test_the_c_side_knows_the_tables_codes_and_no_others():
    lib = cpu.lib()
    if lib is None:
        pytest.skip(cpu.unavailable_reason())
    known = {c.code for c in formats.TABLE}
    for code in range(-1, 260):
        runs = lib.ridgeline_stack_weight_format(code)
        assert runs in (0, 1)
        if code not in known:
            assert runs == 0, code
    desc = torch.tensor([20, 0, 0, 0], dtype=torch.int64)  # a code no row has: refused, nothing run
    with pytest.raises(RuntimeError, match=r"greedy LM head failed \(-2\)"):
        cpu_stack.linear_argmax(desc, torch.zeros(1, 32), torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64))


def _packed():
    w = torch.randn(50, 128)
    yield cpu_quant.PackedInt8(rtn.quantize_int8(w)), "i8", 0, False
    yield cpu_quant.PackedInt8G32(rtn.quantize_int8_g32(w)), "i8g32", 0, False
    yield cpu_quant.PackedW8A8(rtn.quantize_int8(w)), "w8a8", 0, False
    yield cpu_quant.PackedW8A8G32(rtn.quantize_int8_g32(w)), "w8a8g32", 0, False
    for g in (32, 64, 128):
        for sym in (False, True):
            yield cpu_quant.PackedInt4(rtn.quantize_int4(w, g, sym)), "i4", g, sym
            yield cpu_quant.PackedW4A8(rtn.quantize_int4(w, g, sym)), "w4a8", g, sym
    q5 = torch.randint(0, 32, (50, 128), dtype=torch.uint8)
    d = torch.rand(50, 4).half()
    yield cpu_quant.PackedInt5(rtn.Int5Tensor(q5, d, None)), "i5", 32, True
    yield cpu_quant.PackedInt5(rtn.Int5Tensor(q5, d, -d)), "i5", 32, False
    q6 = torch.randint(0, 64, (50, 256), dtype=torch.uint8)
    sub = torch.randint(-128, 128, (50, 16), dtype=torch.int8)
    yield cpu_quant.PackedInt6(rtn.Int6Tensor(q6, sub, torch.rand(50, 1).half())), "i6", 16, True
    codes = torch.randint(0, 16, (50, 256), dtype=torch.uint8)
    yield cpu_quant.PackedIQ4(rtn.IQ4Tensor(codes, torch.rand(50, 8).half())), "iq4", 32, False
    yield cpu_quant.PackedIQ4(rtn.IQ4Tensor(codes, torch.rand(50, 1).half(), sub[:, :8])), "iq4", 256, False
    d = torch.rand(50, 1).half()
    yield cpu_quant.PackedKQ(rtn.KQTensor(3, q6 & 7, sub, d)), "kq", 3, False
    yield cpu_quant.PackedKQ(rtn.KQTensor(2, q6 & 3, sub.view(torch.uint8), d, d)), "kq", 2, False
    u6 = torch.randint(0, 64, (50, 8), dtype=torch.uint8)
    yield cpu_quant.PackedKGrid(rtn.KGridTensor(4, q6 & 15, u6, u6.flip(1), d, d)), "i4k", 32, False
    yield cpu_quant.PackedKGrid(rtn.KGridTensor(5, q6 & 31, u6, u6.flip(1), d, d)), "i5k", 32, False
    for element, mode in (("e4m3", 0), ("e5m2", 1)):
        yield cpu_fpquant.PackedFp8(fpq.quantize_fp8(w, element)), "fp8", mode, False
    yield cpu_fpquant.PackedFp8(fpq.quantize_mx(w, "mxfp8")), "fp8", 2, False
    yield cpu_fpquant.PackedFp4(fpq.quantize_mx(w, "mxfp4")), "fp4", 32, False
    yield cpu_fpquant.PackedFp4(fpq.quantize_nvfp4(w)), "fp4", 16, False


def test_every_packed_weight_carries_its_kernels_row():
    if not all(cpu_quant.available(k) for k in cpu_quant.KINDS):
        pytest.skip("needs every quantized kernel (AVX-512 with BF16 and VNNI)")
    seen = set()
    for packed, kernel, param, sym in _packed():
        row = next(c for c in formats.TABLE if c.code == packed.code)
        assert (row.kernel, row.param, row.sym) == (kernel, param, sym)
        seen.add(row.code)
    # split: a table of the other rows (a fused projection of mixed GGUF types), tested in test_gguf_kept.py
    assert seen == {c.code for c in formats.TABLE if c.kernel not in ("f32", "bf16", "split")}
