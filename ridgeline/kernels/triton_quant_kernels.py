"""The Triton kernel behind kernels/triton_quant.py (imported only where it runs: a CUDA device, or a
CPU under TRITON_INTERPRET=1), so that importing the engine never pays for importing triton."""
import triton
import triton.language as tl


@triton.jit
def _fp8(c, MBITS: tl.constexpr, BIAS: tl.constexpr, SUBNORMAL: tl.constexpr):
    """fp8 codes (sign, 7 - MBITS exponent bits of bias BIAS, MBITS mantissa bits) -> fp32 built from the
    bits; subnormals m * SUBNORMAL (2^(1 - BIAS - MBITS))."""
    e = (c >> MBITS) & ((1 << (7 - MBITS)) - 1)
    m = c & ((1 << MBITS) - 1)
    normal = (((e + 127 - BIAS) << 23) | (m << (23 - MBITS))).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * SUBNORMAL, normal)
    return tl.where((c >> 7) != 0, -mag, mag)


@triton.jit
def _decode(c, ELEM: tl.constexpr, OFFSET: tl.constexpr):
    """c int32 codes -> fp32 element values, exactly."""
    if ELEM == 0:  # int8
        v = (c - ((c >> 7) << 8)).to(tl.float32)
    elif ELEM == 1:  # uint4 - offset
        v = (c - OFFSET).to(tl.float32)
    elif ELEM == 2:  # fp8 e4m3fn
        v = _fp8(c, 3, 7, 0.001953125)
    elif ELEM == 3:  # fp8 e5m2
        v = _fp8(c, 2, 15, 0.0000152587890625)
    else:  # fp4 e2m1: twice the value is m (e = 0) or (2 + m) << (e - 1)
        e = (c >> 1) & 3
        m = c & 1
        twice = tl.where(e == 0, m, (2 + m) << tl.maximum(e - 1, 0))
        mag = twice.to(tl.float32) * 0.5
        v = tl.where((c >> 3) != 0, -mag, mag)
    return v


@triton.jit
def qmm_kernel(x_ptr, code_ptr, scale_ptr, min_ptr, y_ptr, M, N, K, stride_xm, stride_code, stride_scale,
               ELEM: tl.constexpr, OFFSET: tl.constexpr, PACKED4: tl.constexpr, HAS_MIN: tl.constexpr,
               IEEE: tl.constexpr, GROUP: tl.constexpr, K_TILES: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """The weight tile read as [BN, BK] (k contiguous, as stored), its scales once per group."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(0, K_TILES):
        k0 = (pid_k * K_TILES + i) * BK
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & k_ok[None, :],
                    other=0.0)
        if PACKED4:
            rb = k0 // 2 + tl.arange(0, BK // 2)
            b = tl.load(code_ptr + rn[:, None] * stride_code + rb[None, :],
                        mask=n_ok[:, None] & (rb[None, :] < K // 2), other=0).to(tl.int32)
            c = tl.interleave(b & 15, b >> 4)  # [BN, BK]: the even k from the low nibble
        else:
            c = tl.load(code_ptr + rn[:, None] * stride_code + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0).to(tl.int32)
        w = _decode(c, ELEM, OFFSET)
        if GROUP >= BK:  # one scale per row for the whole tile
            g = rn * stride_scale + k0 // GROUP
            s = tl.load(scale_ptr + g, mask=n_ok, other=0.0).to(tl.float32)
            w = w * s[:, None]
            if HAS_MIN:
                w += tl.load(min_ptr + g, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        else:  # BK / GROUP scales per row
            rg = k0 // GROUP + tl.arange(0, BK // GROUP)
            g = rn[:, None] * stride_scale + rg[None, :]
            g_ok = n_ok[:, None] & (rg[None, :] < K // GROUP)
            s = tl.load(scale_ptr + g, mask=g_ok, other=0.0).to(tl.float32)
            w = tl.reshape(tl.reshape(w, (BN, BK // GROUP, GROUP)) * s[:, :, None], (BN, BK))
            if HAS_MIN:
                mn = tl.load(min_ptr + g, mask=g_ok, other=0.0).to(tl.float32)
                w = tl.reshape(tl.reshape(w, (BN, BK // GROUP, GROUP)) + mn[:, :, None], (BN, BK))
        w = tl.where(k_ok[None, :], w, 0.0)
        if IEEE:
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    out = y_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :]
    tl.store(out, acc, mask=(rm[:, None] < M) & n_ok[None, :])
