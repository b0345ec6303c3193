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
 *  - RoPE's rotation and the GELU table use the FMAs GCC forms from ggml's a*c - b*s,
 *    a*s + b*c and 1 + k*x*x (checked: the other pairing breaks the exact files);
 *  - RMSNorm squares in float and sums in double (forward.h).
 *  - an encoder's Q8_0 x Q8_0 products (engine/encoder.py) in llama.cpp's x86 order
 *    (ggml_vec_dot_q8_0_q8_0 and tinyBLAS alike): per block 8 integer lane sums of 4 products,
 *    each FMA'd with the block's dw*dy into its own float lane, then the 8-lane tree. The
 *    forward pass keeps edged's canonical order (docs/kernels.md); an embedding is compared
 *    with llama.cpp's at cosine 1e-4, and there one differently rounded product flips an
 *    activation block's F16 scale downstream (all-MiniLM-L6-v2 on "hello world": 0.9998).
 *
 * Products of two F16 values are exact in float, so an FMA and a multiply-then-add agree there;
 * the FMAs whose fusion changes results (expf, RoPE, the GELU table) are explicit fmaf() calls,
 * and the only other multiplies feeding adds are those exact F16 products, so a compiler that
 * contracts (aarch64) computes the same. The 16-lane tree is GCC's _mm512_reduce_add_ps: halves (8), quarters (4),
 * pairs (2, 3, 0, 1), last two.
 */
#ifndef EDGED_ED_PARITY_H
#define EDGED_ED_PARITY_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"

#define ED_PM_F(h) ED_H2F_TABLE[(uint16_t)(h)]  /* F16 bits -> float (ed_types.h) */

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

/* bytes per block of a strip of 16 Q8_0 rows (the avx512+vnni products below, packed by
 * ed_enc_pack_strip in encoder.h): 16 float scales, int32 [8][16], int8 [8][16][4] */
#define ED_STRIP_BLOCK (16 * 4 + 8 * 16 * 4 + 8 * 16 * 4)

/* the reduction tree of an 8-lane float register (ggml's hsum_float_8, tinyBLAS's hsum) */
static inline float ed_pm_hsum8(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* W row . y over n values, both Q8_0 (y: the activations as ed_quant_q8_0 makes them), in
 * llama.cpp's x86 order: lane l of a block sums the 4 products 4l..4l+3 exactly, then
 * acc[l] = fma(dw * dy, lane, acc[l]) block by block, then ed_pm_hsum8 */
static inline float ed_pm_dot_q8_0(int n, const void *vw, const void *vy) {
    const blk_q8_0 *w = (const blk_q8_0 *)vw, *y = (const blk_q8_0 *)vy;
    float acc[8] = {0};
    for (int b = 0; b < n / QK; b++) {
        const float d = ED_PM_F(w[b].d) * ED_PM_F(y[b].d);
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++) s += w[b].qs[j] * y[b].qs[j];
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
    return ed_pm_hsum8(acc);
}

/* The same three steps with AVX2/FMA/F16C, for the x86 kernel paths. Lane for lane they do
 * the scalar code's operations (F16 -> float conversions are exact, the products of two F16
 * values are exact so fused and unfused multiply-adds agree, the reduction trees run on the
 * stored lanes), so the results are identical to the scalar versions above. */
#if defined(__x86_64__)
#include <immintrin.h>
#define ED_PM_X86 __attribute__((target("avx2,fma,f16c")))

static inline __m256 ED_PM_X86 ed_pm_h8(const ed_half *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* ed_pm_hsum16 of the 16 lanes lo (0-7) and hi (8-15), in registers */
static inline float ED_PM_X86 ed_pm_hsum16_x86(__m256 lo, __m256 hi) {
    const __m256 a = _mm256_add_ps(hi, lo);                                   /* a[i] = l[i+8] + l[i] */
    const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a)); /* a[i+4] + a[i] */
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                      /* b0+b2, b1+b3 */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* ed_pm_dot_q8_0 with llama.cpp's own instructions: |w| . sign(y, w) by maddubs, pairs by
 * madd (exact integers), one FMA per block, its 8-lane tree */
static float ED_PM_X86 ed_pm_dot_q8_0_x86(int n, const void *vw, const void *vy) {
    const blk_q8_0 *w = (const blk_q8_0 *)vw, *y = (const blk_q8_0 *)vy;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / QK; b++) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qy, qw)), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(ED_PM_F(w[b].d) * ED_PM_F(y[b].d)), _mm256_cvtepi32_ps(p), acc);
    }
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

/* out[c * ldo + r] = W[r] . Y[c] (ed_pm_dot_q8_0's bits) for 4 weight rows (w, stride ws
 * bytes) and 2 activation rows (y, stride ys): 8 independent FMA chains, so the FMA latency
 * does not bound one dot's chain of blocks. */
static void ED_PM_X86 ed_pm_tile_q8_0_x86(int n, const uint8_t *w, size_t ws, const uint8_t *y, size_t ys,
                                          float *out, size_t ldo) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][4];
    for (int c = 0; c < 2; c++) for (int r = 0; r < 4; r++) acc[c][r] = _mm256_setzero_ps();
    for (int b = 0; b < n / QK; b++) {
        __m256i qw[4];
        float dw[4];
        for (int r = 0; r < 4; r++) {
            const blk_q8_0 *wb = (const blk_q8_0 *)(w + r * ws) + b;
            qw[r] = _mm256_loadu_si256((const __m256i *)wb->qs);
            dw[r] = ED_PM_F(wb->d);
        }
        for (int c = 0; c < 2; c++) {
            const blk_q8_0 *yb = (const blk_q8_0 *)(y + c * ys) + b;
            const __m256i qy = _mm256_loadu_si256((const __m256i *)yb->qs);
            const float dy = ED_PM_F(yb->d);
            for (int r = 0; r < 4; r++) {
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qw[r], qw[r]),
                                                                         _mm256_sign_epi8(qy, qw[r])), ones);
                acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dy), _mm256_cvtepi32_ps(p), acc[c][r]);
            }
        }
    }
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < 4; r++) {
            __m128 h = _mm_add_ps(_mm256_extractf128_ps(acc[c][r], 1), _mm256_castps256_ps128(acc[c][r]));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            out[c * ldo + r] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
}

/* The same products with 16 weight rows as the lanes of AVX-512 registers (avx512+vnni):
 * llama.cpp's lane l of a row is one dpbusd of 4 bytes per row, so a strip of 16 rows keeps
 * 8 accumulators, one per lane, and the 8-lane tree runs across them at the end. A strip
 * (ed_enc_pack_strip, encoder.h) holds per block ED_STRIP_BLOCK bytes: the 16 rows' scales as
 * float, -128 x each lane's weight sum (int32 [8][16]), the weights (int8 [8][16][4]); the
 * activations come lifted to unsigned (q + 128, the weight sums take the 128 back out, so the
 * integer sums are exact) with their scales as float. */
#define ED_PM_Z __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

static inline void ED_PM_Z ed_pm_strip_nc_z(const int nc, int nb, const uint8_t *strip, const uint8_t *a, size_t as,
                                            const float *dy, size_t ds, float *out, size_t ldo, int nr) {
    __m512 acc[2][8];
    for (int c = 0; c < nc; c++) for (int g = 0; g < 8; g++) acc[c][g] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {  /* hot loop */
        const uint8_t *sb = strip + (size_t)b * ED_STRIP_BLOCK;
        const __m512 dw = _mm512_loadu_ps((const float *)sb);
        for (int c = 0; c < nc; c++) {
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dy[c * ds + b]));
            const uint8_t *ab = a + c * as + (size_t)b * QK;
            for (int g = 0; g < 8; g++) {
                int32_t a4; memcpy(&a4, ab + 4 * g, 4);
                const __m512i p = _mm512_dpbusd_epi32(_mm512_loadu_si512(sb + 64 + 64 * g), _mm512_set1_epi32(a4),
                                                      _mm512_loadu_si512(sb + 576 + 64 * g));
                acc[c][g] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[c][g]);
            }
        }
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int c = 0; c < nc; c++) {
        const __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[c][0], acc[c][4]), _mm512_add_ps(acc[c][2], acc[c][6])),
                                       _mm512_add_ps(_mm512_add_ps(acc[c][1], acc[c][5]), _mm512_add_ps(acc[c][3], acc[c][7])));
        _mm512_mask_storeu_ps(out + c * ldo, m, r);
    }
}

/* out[c * ldo + r] for the strip's first nr rows and nc tokens (a + c * as, dy + c * ds) */
static void ED_PM_Z ed_pm_strip_q8_0_z(int nb, const uint8_t *strip, const uint8_t *a, size_t as, const float *dy,
                                       size_t ds, int nc, float *out, size_t ldo, int nr) {
    int c = 0;
    for (; c + 2 <= nc; c += 2) ed_pm_strip_nc_z(2, nb, strip, a + c * as, as, dy + c * ds, ds, out + c * ldo, ldo, nr);
    if (c < nc) ed_pm_strip_nc_z(1, nb, strip, a + c * as, as, dy + c * ds, ds, out + c * ldo, ldo, nr);
}

static float ED_PM_X86 ed_pm_dot_f16_x86(int n, const ed_half *x, const ed_half *y, int batch) {
    if (batch && n % 16 == 0) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < n; i += 16) {
            a0 = _mm256_fmadd_ps(ed_pm_h8(x + i), ed_pm_h8(y + i), a0);
            a1 = _mm256_fmadd_ps(ed_pm_h8(x + i + 8), ed_pm_h8(y + i + 8), a1);
        }
        return ed_pm_hsum16_x86(a0, a1);
    }
    const int np = n & ~63;
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    for (int i = 0; i < np; i += 64)
        for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(ed_pm_h8(x + i + 8 * k), ed_pm_h8(y + i + 8 * k), a[k]);
    /* lanes l and l+32, l+16 and l+48: registers k and k+4, k+2 and k+6 */
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    double s = ed_pm_hsum16_x86(lo, hi);
    for (int i = np; i < n; i++) s += (double)(ED_PM_F(x[i]) * ED_PM_F(y[i]));
    return (float)s;
}

/* ed_pm_expf of 8 lanes; returns nonzero when a lane needs the scalar code (|n| > 126: 2^n
 * outside the exponent field, or NaN), whose result *res then does not hold */
static inline int ED_PM_X86 ed_pm_expf8_x86(__m256 v, __m256 *res) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(v, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 nn = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(nn, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(nn, _mm256_set1_ps(0x1.62e4p-1f), v));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    /* 2^n built in the exponent field where -126 <= n <= 127, else the scalar code */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
    *res = _mm256_mul_ps(j, _mm256_castsi256_ps(e));
    const __m256 out = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), nn), _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    return _mm256_movemask_ps(out) | _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* y[i] = ed_pm_expf(x[i] - mx) for i < n */
static void ED_PM_X86 ed_pm_expf_sub_x86(int n, const float *x, float mx, float *y) {
    int i = 0;
    const __m256 vmx = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8) {
        __m256 res;
        if (ed_pm_expf8_x86(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx), &res))
            for (int k = 0; k < 8; k++) y[i + k] = ed_pm_expf(x[i + k] - mx);
        else
            _mm256_storeu_ps(y + i, res);
    }
    for (; i < n; i++) y[i] = ed_pm_expf(x[i] - mx);
}

/* g[i] = ed_pm_silu(g[i]) * u[i] for i < n (the division is IEEE's, as the scalar one) */
static void ED_PM_X86 ed_pm_silu_mul_x86(int n, float *g, const float *u) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        __m256 e;
        if (ed_pm_expf8_x86(_mm256_sub_ps(_mm256_setzero_ps(), x), &e))
            for (int k = 0; k < 8; k++) g[i + k] = ed_pm_silu(g[i + k]) * u[i + k];
        else
            _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                                  _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = ed_pm_silu(g[i]) * u[i];
}

/* y[i] = float(f16(x[i] * s)) for i < n */
static void ED_PM_X86 ed_pm_round_scale_x86(int n, float *x, float s) {
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) x[i] = ED_PM_F(ed_fp32_to_fp16(x[i] * s));
}

/* y[i] = ed_fp32_to_fp16(x[i]) by F16C (round to nearest even, as the scalar code); 8 values
 * holding a NaN take the scalar code, which makes every NaN the one quiet NaN */
static void ED_PM_X86 ed_pm_f16_row_x86(int n, const float *x, ed_half *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            for (int k = 0; k < 8; k++) y[i + k] = ed_fp32_to_fp16(x[i + k]);
        else
            _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; i++) y[i] = ed_fp32_to_fp16(x[i]);
}
#endif

/* The softmax's expf and the SiLU step with NEON (every aarch64 CPU has it), lane for lane the scalar code's operations
 * as ed_pm_silu_mul_x86 does them (vfmaq: one rounding, as fmaf; n is an integer, so FCVTZS's
 * truncation and the scalar (int) agree; FDIV is IEEE's), so its results are identical. */
#if defined(__aarch64__)
#include <arm_neon.h>

/* ed_pm_expf of 4 lanes; returns nonzero when a lane needs the scalar code (|n| > 126: 2^n
 * outside the exponent field, or NaN), whose result *res then does not hold */
static inline int ed_pm_expf4_neon(float32x4_t v, float32x4_t *res) {
    const float32x4_t r = vdupq_n_f32(0x1.8p23f);
    const float32x4_t z = vfmaq_f32(r, v, vdupq_n_f32(0x1.715476p+0f));
    const float32x4_t nn = vsubq_f32(z, r);
    const float32x4_t b = vfmsq_f32(vfmsq_f32(v, nn, vdupq_n_f32(0x1.62e4p-1f)), nn, vdupq_n_f32(0x1.7f7d1cp-20f));
    const float32x4_t u = vmulq_f32(b, b);
    const float32x4_t j = vfmaq_f32(
        vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0x1.ffffecp-1f), b),
        vfmaq_f32(vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b), u,
                  vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b)),
        u);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(nn), vdupq_n_s32(127)), 23);
    *res = vmulq_f32(j, vreinterpretq_f32_s32(e));
    const uint32x4_t out = vorrq_u32(vcagtq_f32(nn, vdupq_n_f32(126.0f)), vmvnq_u32(vceqq_f32(v, v)));
    return vmaxvq_u32(out) != 0;
}

/* y[i] = ed_pm_expf(x[i] - mx) for i < n */
static void ed_pm_expf_sub_neon(int n, const float *x, float mx, float *y) {
    int i = 0;
    const float32x4_t vmx = vdupq_n_f32(mx);
    for (; i + 4 <= n; i += 4) {
        float32x4_t res;
        if (ed_pm_expf4_neon(vsubq_f32(vld1q_f32(x + i), vmx), &res))
            for (int k = 0; k < 4; k++) y[i + k] = ed_pm_expf(x[i + k] - mx);
        else
            vst1q_f32(y + i, res);
    }
    for (; i < n; i++) y[i] = ed_pm_expf(x[i] - mx);
}

/* ed_pm_dot_f16 on 4-lane registers: F16 -> float by FCVTL (exact, as the table), lane l of the
 * scalar code's acc[] in lane l % 4 of register l / 4, FMA in place of the add of an exact
 * product (the same rounding), the same trees on the same lanes */
static float ed_pm_dot_f16_neon(int n, const ed_half *x, const ed_half *y, int batch) {
#define ED_PM_H4(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
    float32x4_t a[16], r[4];
    float l[16];
    if (batch && n % 16 == 0) {
        for (int k = 0; k < 4; k++) r[k] = vdupq_n_f32(0.0f);
        for (int i = 0; i < n; i += 16)
            for (int k = 0; k < 4; k++) r[k] = vfmaq_f32(r[k], ED_PM_H4(x + i + 4 * k), ED_PM_H4(y + i + 4 * k));
        for (int k = 0; k < 4; k++) vst1q_f32(l + 4 * k, r[k]);
        return ed_pm_hsum16(l);
    }
    const int np = n & ~63;
    for (int k = 0; k < 16; k++) a[k] = vdupq_n_f32(0.0f);
    for (int i = 0; i < np; i += 64)
        for (int k = 0; k < 16; k++) a[k] = vfmaq_f32(a[k], ED_PM_H4(x + i + 4 * k), ED_PM_H4(y + i + 4 * k));
    /* r[l] = (acc[l] + acc[l + 32]) + (acc[l + 16] + acc[l + 48]) */
    for (int k = 0; k < 4; k++) vst1q_f32(l + 4 * k, vaddq_f32(vaddq_f32(a[k], a[k + 8]), vaddq_f32(a[k + 4], a[k + 12])));
    double sum = ed_pm_hsum16(l);
    for (int i = np; i < n; i++) sum += (double)(ED_PM_F(x[i]) * ED_PM_F(y[i]));
    return (float)sum;
#undef ED_PM_H4
}

/* y[i] = ed_fp32_to_fp16(x[i]) for i < n by FCVTN (round to nearest even, as the scalar code,
 * subnormals and overflow to inf alike); 4 values holding a NaN take the scalar code (its NaN) */
static void ed_pm_f16_row_neon(int n, const float *x, ed_half *y) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        if (vmaxvq_u32(vmvnq_u32(vceqq_f32(v, v))))
            for (int k = 0; k < 4; k++) y[i + k] = ed_fp32_to_fp16(x[i + k]);
        else
            vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(v)));
    }
    for (; i < n; i++) y[i] = ed_fp32_to_fp16(x[i]);
}

/* x[i] = F16-rounded x[i] * s (the softmax row) by FCVTN and FCVTL; 4 products holding a NaN
 * take the scalar code */
static void ed_pm_round_scale_neon(int n, float *x, float s) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), s);
        if (vmaxvq_u32(vmvnq_u32(vceqq_f32(v, v))))
            for (int k = 0; k < 4; k++) x[i + k] = ED_PM_F(ed_fp32_to_fp16(x[i + k] * s));
        else
            vst1q_f32(x + i, vcvt_f32_f16(vcvt_f16_f32(v)));
    }
    for (; i < n; i++) x[i] = ED_PM_F(ed_fp32_to_fp16(x[i] * s));
}

/* g[i] = ed_pm_silu(g[i]) * u[i] for i < n */
static void ed_pm_silu_mul_neon(int n, float *g, const float *u) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        float32x4_t e;
        if (ed_pm_expf4_neon(vsubq_f32(vdupq_n_f32(0.0f), x), &e))
            for (int k = 0; k < 4; k++) g[i + k] = ed_pm_silu(g[i + k]) * u[i + k];
        else
            vst1q_f32(g + i, vmulq_f32(vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(u + i)));
    }
    for (; i < n; i++) g[i] = ed_pm_silu(g[i]) * u[i];
}
#endif

/* out[i] = the reduction of lane rows L[0..lanes)[i] (16: tinyBLAS, 64: vec_dot) for i < n;
 * tmp holds 16 rows of n. Loops over i, so the compiler vectorizes them without reordering. */
static void ed_pm_reduce_lanes(int n, int lanes, const float *const *L, float *tmp, float *out) {
    float *T[16];
    for (int l = 0; l < 16; l++) {
        T[l] = tmp + (size_t)l * n;
        if (lanes == 16) memcpy(T[l], L[l], sizeof(float) * n);
        else for (int i = 0; i < n; i++) T[l][i] = (L[l][i] + L[l + 32][i]) + (L[l + 16][i] + L[l + 48][i]);
    }
    for (int k = 0; k < 8; k++) for (int i = 0; i < n; i++) T[k][i] = T[k + 8][i] + T[k][i];
    for (int k = 0; k < 4; k++) for (int i = 0; i < n; i++) T[k][i] = T[k + 4][i] + T[k][i];
    for (int i = 0; i < n; i++) out[i] = (T[0][i] + T[2][i]) + (T[1][i] + T[3][i]);
}

/* ed_pm_reduce_lanes over 64 lanes of which only some hold values: the others are the all-zero
 * row `zero` (attention over fewer than 64 keys). A subtree of zero rows sums to +0, and
 * x + (+0) is x for every x but -0, which a lane row never holds (it starts at +0 and only
 * adds; an exact zero sum is +0): passing the other operand on gives the same bits with the adds
 * of the used lanes only. tmp holds 16 rows of n. */
static inline const float *ed_pm_add_rows(int n, const float *a, const float *b, const float *zero, float *dst) {
    if (a == zero) return b;
    if (b == zero) return a;
    int i = 0;
#if defined(__aarch64__)  /* dst may be a or b: the compiler would not vectorize this loop */
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vaddq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
#endif
    for (; i < n; i++) dst[i] = a[i] + b[i];
    return dst;
}

static void ed_pm_reduce_lanes_sparse(int n, const float *const *L, const float *zero, float *tmp, float *out) {
    const float *P[16];
    for (int l = 0; l < 16; l++) {  /* (L[l] + L[l+32]) + (L[l+16] + L[l+48]); out as scratch */
        float *T = tmp + (size_t)l * n;
        const float *a = ed_pm_add_rows(n, L[l], L[l + 32], zero, T);
        const float *b = ed_pm_add_rows(n, L[l + 16], L[l + 48], zero, out);
        P[l] = ed_pm_add_rows(n, a, b, zero, T);
    }
    for (int k = 0; k < 8; k++) P[k] = ed_pm_add_rows(n, P[k + 8], P[k], zero, tmp + (size_t)k * n);
    for (int k = 0; k < 4; k++) P[k] = ed_pm_add_rows(n, P[k + 4], P[k], zero, tmp + (size_t)k * n);
    const float *a = ed_pm_add_rows(n, P[0], P[2], zero, tmp);
    const float *b = ed_pm_add_rows(n, P[1], P[3], zero, tmp + n);
    const float *r = ed_pm_add_rows(n, a, b, zero, out);
    if (r == zero) memset(out, 0, sizeof(float) * n);
    else if (r != out) memcpy(out, r, sizeof(float) * n);
}

/* The paths' tables (ed_kernels.pm, chosen with the kernel path in ed_simd.h): the x86 versions
 * on the avx2/avx512 paths, the NEON ones on neon (the F16 dot, expf, the F16 rows and SiLU;
 * the others are scalar there); NULL entries (and the generic path): the scalar code. */
#if defined(__x86_64__)
static float ED_PM_X86 ed_pm_dot_f16_row_x86(int n, const ed_half *x, const ed_half *y) {
    return ed_pm_dot_f16_x86(n, x, y, 0);
}
#define ED_PM_FNS_X86 {.dot_f16 = ed_pm_dot_f16_row_x86, .expf_sub = ed_pm_expf_sub_x86, \
                       .f16_row = ed_pm_f16_row_x86, .silu_mul = ed_pm_silu_mul_x86, \
                       .round_scale = ed_pm_round_scale_x86, .dot_q8_0 = ed_pm_dot_q8_0_x86, \
                       .tile_q8_0 = ed_pm_tile_q8_0_x86}
/* avx512+vnni: the same and the strips of 16 rows */
#define ED_PM_FNS_X86_Z {.dot_f16 = ed_pm_dot_f16_row_x86, .expf_sub = ed_pm_expf_sub_x86, \
                         .f16_row = ed_pm_f16_row_x86, .silu_mul = ed_pm_silu_mul_x86, \
                         .round_scale = ed_pm_round_scale_x86, .dot_q8_0 = ed_pm_dot_q8_0_x86, \
                         .tile_q8_0 = ed_pm_tile_q8_0_x86, .strip_q8_0 = ed_pm_strip_q8_0_z}
#elif defined(__aarch64__)
static float ed_pm_dot_f16_row_neon(int n, const ed_half *x, const ed_half *y) {
    return ed_pm_dot_f16_neon(n, x, y, 0);
}
#define ED_PM_FNS_NEON {.dot_f16 = ed_pm_dot_f16_row_neon, .expf_sub = ed_pm_expf_sub_neon, \
                        .f16_row = ed_pm_f16_row_neon, .silu_mul = ed_pm_silu_mul_neon, \
                        .round_scale = ed_pm_round_scale_neon}
#endif

/* Dispatch: pm's function where it has one, else the scalar code (callers in a loop copy the
 * path's table once: const ed_pm_fns pm = *ED_PM). The attention's dot is one row's
 * (ggml_vec_dot_f16's order: the forward pass's; the batch order is the blocked kernels'). */
static inline float ed_pm_dot(const ed_pm_fns *pm, int n, const ed_half *x, const ed_half *y) {
    if (pm->dot_f16) return pm->dot_f16(n, x, y);
    return ed_pm_dot_f16(n, x, y, 0);
}

static inline void ed_pm_expf_sub(const ed_pm_fns *pm, int n, const float *x, float mx, float *y) {
    if (pm->expf_sub) { pm->expf_sub(n, x, mx, y); return; }
    for (int i = 0; i < n; i++) y[i] = ed_pm_expf(x[i] - mx);
}

/* y[i] = ed_fp32_to_fp16(x[i]) for i < n */
static inline void ed_pm_f16_row(const ed_pm_fns *pm, int n, const float *x, ed_half *y) {
    if (pm->f16_row) { pm->f16_row(n, x, y); return; }
    for (int i = 0; i < n; i++) y[i] = ed_fp32_to_fp16(x[i]);
}

/* x[i] = ed_pm_gelu(x[i] + b[i]) for i < n (b NULL: no bias), the F16 rounding of the table's
 * index by pm's row, 256 values at a time */
static inline void ed_pm_gelu_row(const ed_pm_fns *pm, int n, float *x, const float *b) {
    ed_half hx[256];
    for (int i0 = 0; i0 < n; i0 += 256) {
        const int m = n - i0 < 256 ? n - i0 : 256;
        float *xi = x + i0;
        if (b) for (int i = 0; i < m; i++) xi[i] = xi[i] + b[i0 + i];
        ed_pm_f16_row(pm, m, xi, hx);
        for (int i = 0; i < m; i++) {
            const float v = xi[i];
            xi[i] = v <= -10.0f ? 0.0f : v >= 10.0f ? v : ED_PM_F(ED_PM_GELU[hx[i]]);
        }
    }
}

static inline void ed_pm_silu_mul(const ed_pm_fns *pm, int n, float *g, const float *u) {
    if (pm->silu_mul) { pm->silu_mul(n, g, u); return; }
    for (int i = 0; i < n; i++) g[i] = ed_pm_silu(g[i]) * u[i];
}

static inline float ed_pm_dot_q8(const ed_pm_fns *pm, int n, const void *w, const void *y) {
    if (pm->dot_q8_0) return pm->dot_q8_0(n, w, y);
    return ed_pm_dot_q8_0(n, w, y);
}

/* ed_pm_dot_q8 of 4 weight rows x 2 activation rows: out[c * ldo + r] */
static inline void ed_pm_tile_q8(const ed_pm_fns *pm, int n, const uint8_t *w, size_t ws, const uint8_t *y,
                                 size_t ys, float *out, size_t ldo) {
    if (pm->tile_q8_0) { pm->tile_q8_0(n, w, ws, y, ys, out, ldo); return; }
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < 4; r++) out[c * ldo + r] = ed_pm_dot_q8(pm, n, w + r * ws, y + c * ys);
}

static inline void ed_pm_round_scale(const ed_pm_fns *pm, int n, float *x, float s) {
    if (pm->round_scale) { pm->round_scale(n, x, s); return; }
    for (int i = 0; i < n; i++) x[i] = ED_PM_F(ed_fp32_to_fp16(x[i] * s));
}

#endif
