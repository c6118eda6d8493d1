/* exp on 16 floats with AVX-512 (glibc's vector expf is only declared under -ffinite-math-only,
 * which the kernels do not use). Range reduction x = n ln2 + f, |f| <= ln2/2, with ln2 split in two
 * for precision; e^f by the classic Cephes degree-6 polynomial; 2^n applied by vscalefps. About
 * 1 ulp over the float range; inputs are clamped to +-88 (e^88 is near FLT_MAX). */
#pragma once
#include <immintrin.h>

static inline __m512 vexp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.f)), _mm512_set1_ps(88.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}
