/* llama.cpp's floating-point details, mirrored bit for bit in portable C.
 *
 * The golden logits (testdata/golden) come from llama.cpp's CPU backend, x86 AVX-512 build,
 * flash attention off. Beyond the weight kernels (Q8 activations, mirrored in ed_types.h and
 * the SIMD paths), its results depend on a few rounding and summation-order details that are
 * cheap to reproduce exactly, so every kernel path (generic, avx2, avx512, neon) computes the
 * same numbers as the golden machine:
 *
 *  - attention without flash attention is two F16 matrix products around an F32 softmax: the
 *    query is rounded to F16 for q.k (the K cache is F16), and the softmax row is rounded to
 *    F16 before it multiplies the F16 V cache. The F16 products are exact in float, so only the
 *    order of the float additions matters: one row (a decoded token) goes through
 *    ggml_vec_dot_f16 (64 lanes: 4 registers x 16, then a fixed reduction tree), a batch of
 *    >= 2 rows through llamafile's tinyBLAS (16 lanes per output, then the same 16-lane tree);
 *  - the softmax uses ggml's vector expf (a polynomial with FMAs, not libm's expf), sums
 *    16-lane groups in float and the groups in double, and multiplies by 1/sum;
 *  - SiLU is x / (1 + that expf(-x)); GELU reads a table over all F16 inputs;
 *  - RMSNorm squares in float and sums in double.
 *
 * Products of two F16 values are exact in float, so an FMA and a multiply-then-add agree there;
 * the only FMAs whose fusion changes results (inside expf) are explicit fmaf() calls. The
 * 16-lane tree is GCC's _mm512_reduce_add_ps: halves (8), quarters (4), pairs (2, 3, 0, 1), last two.
 */
#ifndef EDGED_ED_PARITY_H
#define EDGED_ED_PARITY_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"

static float ED_PM_H2F[65536];  /* F16 bits -> float */
#define ED_PM_F(h) ED_PM_H2F[(uint16_t)(h)]

/* the reduction tree of a 16-lane float register */
static inline float ed_pm_hsum16(const float *l) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = l[i + 8] + l[i];
    for (int i = 0; i < 4; i++) b[i] = a[i + 4] + a[i];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* ggml's vector expf (AVX-512 form), one lane: exp(x) = 2^n * p(b), x = n ln2 + b */
static inline float ed_pm_expf(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;  /* also x = -inf: 0 */
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    const int e = (int)n;  /* vscalefps: j * 2^n, rounded once */
    if (e < -126 || e > 127) return ldexpf(j, e);
    const uint32_t bits = (uint32_t)(e + 127) << 23;
    float p2; memcpy(&p2, &bits, 4);
    return j * p2;
}

static inline float ed_pm_silu(float x) {
    return x / (1.0f + ed_pm_expf(0.0f - x));
}

/* GELU (tanh form) as ggml's F32 path computes it: |x| < 10 through a table over the F16
 * inputs, entries computed in float (the compiler fuses 1 + a*x*x into an FMA there) and
 * stored as F16. */
static ed_half ED_PM_GELU[65536];

static void ed_pm_init(void) {
    for (int i = 0; i < 65536; i++) {
        const float x = ed_fp16_to_fp32((ed_half)i);
        ED_PM_H2F[i] = x;
        const float g = 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x *
                                                 fmaf(0.044715f * x, x, 1.0f)));
        ED_PM_GELU[i] = ed_fp32_to_fp16(g);
    }
}

static inline float ed_pm_gelu(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return ED_PM_F(ED_PM_GELU[ed_fp32_to_fp16(x)]);
}

/* RoPE's rotation of (a, b) by (c, s) as GCC contracts ggml's a*c - b*s and a*s + b*c */
static inline float ed_pm_rot0(float a, float b, float c, float s) { return fmaf(a, c, -(b * s)); }
static inline float ed_pm_rot1(float a, float b, float c, float s) { return fmaf(a, s, b * c); }

/* x . y over n F16 values: ggml_vec_dot_f16's order (one row) or tinyBLAS's (batch; it needs
 * n % 16 == 0, else ggml falls back to the vec_dot order). */
static inline float ed_pm_dot_f16(int n, const ed_half *x, const ed_half *y, int batch) {
    if (batch && n % 16 == 0) {
        float acc[16] = {0};
        for (int i = 0; i < n; i += 16)
            for (int l = 0; l < 16; l++) acc[l] += ED_PM_F(x[i + l]) * ED_PM_F(y[i + l]);
        return ed_pm_hsum16(acc);
    }
    const int np = n & ~63;
    float acc[64] = {0}, r[16];
    for (int i = 0; i < np; i += 64)
        for (int l = 0; l < 64; l++) acc[l] += ED_PM_F(x[i + l]) * ED_PM_F(y[i + l]);
    for (int l = 0; l < 16; l++) r[l] = (acc[l] + acc[l + 32]) + (acc[l + 16] + acc[l + 48]);
    double s = ed_pm_hsum16(r);
    for (int i = np; i < n; i++) s += (double)(ED_PM_F(x[i]) * ED_PM_F(y[i]));
    return (float)s;
}

#endif
