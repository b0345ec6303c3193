/* The sampler's passes over the whole vocabulary (sampling.pxi does the rest):
 *
 *   float  ed_smax(const float *x, int n)        largest non-NaN value, -inf if there is none
 *   double ed_sexp(const float *x, int n, float mx, double s, double *out)
 *                                                 sum of exp(((double)x[i] - mx) * s), s > 0,
 *                                                 every x[i] <= mx; each term also stored in
 *                                                 out[i] unless out is NULL
 *   void   ed_shist(const float *x, int n, float mx, int *cnt, uint16_t *bk)
 *                                                 bk[i] = ED_SBUCKET(x[i], mx) and cnt[bk[i]] += 1
 *                                                 (cnt zeroed first)
 *   int    ed_sabove(const float *x, int n, float t, int32_t *idx, float *val)
 *                                                 the i with x[i] >= t, ascending, into idx
 *                                                 and their x[i] into val; returns how many
 *   int    ed_sfind(const float *x, int n, float t)  the first i with x[i] >= t, or -1
 *
 * ED_SBUCKET(v, mx) = floor((mx - v) * ED_SBW) in float, capped at ED_SNB - 1 (where NaN and
 * -inf land too): a bucket of width 1/ED_SBW by distance from the maximum. It never decreases
 * as v decreases, so bucket order is sorted order.
 *
 * Written once with GCC vector extensions and compiled for the baseline ISA (SSE2 on x86-64,
 * Advanced SIMD on aarch64) and, on x86-64, for AVX2+FMA and AVX-512, chosen with the kernel
 * path (ed_kernels.sample: the names above call the selected path's). exp is computed in double (Cody-Waite reduction,
 * degree-13 Taylor polynomial evaluated by Estrin's scheme): within a few ulp of libm, so sums
 * agree with NumPy's float64 ones to ~1e-15 relative and never move a cut the reference would
 * not make (a float exp would, about once in a thousand draws on a flat distribution).
 */
#ifndef EDGED_ED_SAMPLE_H
#define EDGED_ED_SAMPLE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"  /* ed_kern: the selected kernel path */

/* the vector helpers pass 32/64-byte vectors by value between static functions of one file */
#pragma GCC diagnostic ignored "-Wpsabi"

#define ED_SNB 4096
#define ED_SBW 64.0f

static inline int ed_sbucket(float v, float mx) {
    float d = (mx - v) * ED_SBW;
    return d < (float)(ED_SNB - 1) ? (int)d : ED_SNB - 1;
}

#define ED_SAMPLE_TYPES(W, F)                                                                   \
typedef double ed_vd##W __attribute__((vector_size(W * 8)));                                    \
typedef int64_t ed_vl##W __attribute__((vector_size(W * 8)));                                   \
typedef float ed_vh##W __attribute__((vector_size(W * 4)));  /* W floats, to widen */           \
typedef float ed_vf##F __attribute__((vector_size(F * 4)));                                     \
typedef int32_t ed_vi##F __attribute__((vector_size(F * 4)));

ED_SAMPLE_TYPES(2, 4)
ED_SAMPLE_TYPES(4, 8)
ED_SAMPLE_TYPES(8, 16)

#define ED_SAMPLE_FNS(SUFFIX, ATTR, W, F)                                                       \
static float ATTR ed_smax_##SUFFIX(const float *x, int n) {                                    \
    ed_vf##F m[4];                                                                              \
    for (int a = 0; a < 4; a++) m[a] = (ed_vf##F){} - INFINITY;                                 \
    int i = 0;                                                                                  \
    for (; i + 4 * F <= n; i += 4 * F)                                                          \
        for (int a = 0; a < 4; a++) {  /* four chains: the compare's latency overlaps */        \
            ed_vf##F v;                                                                         \
            memcpy(&v, x + i + a * F, sizeof v);                                                \
            ed_vi##F gt = v > m[a];  /* NaN compares false: never taken */                      \
            m[a] = (ed_vf##F)((gt & (ed_vi##F)v) | (~gt & (ed_vi##F)m[a]));                     \
        }                                                                                       \
    float r = -INFINITY;                                                                        \
    for (int a = 0; a < 4; a++)                                                                 \
        for (int j = 0; j < F; j++) if (m[a][j] > r) r = m[a][j];                               \
    for (; i < n; i++) if (x[i] > r) r = x[i];                                                  \
    return r;                                                                                   \
}                                                                                               \
                                                                                                \
static inline ed_vd##W ATTR ed_vexp_##SUFFIX(ed_vd##W a) {  /* a <= 0 */                        \
    const ed_vd##W zero = {}, lo = zero - 708.0, sh = zero + 6755399441055744.0;  /* 1.5*2^52 */ \
    ed_vl##W under = a < lo;                                                                    \
    a = (ed_vd##W)((under & (ed_vl##W)lo) | (~under & (ed_vl##W)a));                            \
    ed_vd##W t = a * 1.4426950408889634 + sh;  /* round(a / ln 2) lands in t's low bits */      \
    ed_vd##W k = t - sh;                                                                        \
    ed_vd##W r = a - k * 6.93147180369123816490e-01;                                            \
    r = r - k * 1.90821492927058770002e-10;                                                     \
    ed_vd##W r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;                                            \
    ed_vd##W p = (1.0 + r) + r2 * (0.5 + r * (1.0 / 6))                                         \
        + r4 * ((1.0 / 24 + r * (1.0 / 120)) + r2 * (1.0 / 720 + r * (1.0 / 5040)))             \
        + r8 * ((1.0 / 40320 + r * (1.0 / 362880)) + r2 * (1.0 / 3628800 + r * (1.0 / 39916800)) \
                + r4 * (1.0 / 479001600 + r * (1.0 / 6227020800.0)));                           \
    ed_vl##W e = ((ed_vl##W)t - (ed_vl##W)sh + 1023) << 52;  /* 2^k */                         \
    return (ed_vd##W)(~under & (ed_vl##W)(p * (ed_vd##W)e));  /* below -708: 0 (e^-708: 3e-308) */ \
}                                                                                               \
                                                                                                \
static double ATTR ed_sexp_##SUFFIX(const float *x, int n, float mx, double s, double *out) {   \
    ed_vd##W acc0 = {}, acc1 = {};                                                              \
    const double m = mx;                                                                        \
    int i = 0;                                                                                  \
    for (; i + 2 * W <= n; i += 2 * W) {                                                        \
        ed_vh##W a, b;                                                                          \
        memcpy(&a, x + i, sizeof a);                                                            \
        memcpy(&b, x + i + W, sizeof b);                                                        \
        ed_vd##W ea = ed_vexp_##SUFFIX((__builtin_convertvector(a, ed_vd##W) - m) * s);         \
        ed_vd##W eb = ed_vexp_##SUFFIX((__builtin_convertvector(b, ed_vd##W) - m) * s);         \
        acc0 += ea;                                                                             \
        acc1 += eb;                                                                             \
        if (out) {                                                                              \
            memcpy(out + i, &ea, sizeof ea);                                                    \
            memcpy(out + i + W, &eb, sizeof eb);                                                \
        }                                                                                       \
    }                                                                                           \
    double r = 0;                                                                               \
    for (int j = 0; j < W; j++) r += acc0[j] + acc1[j];                                         \
    for (; i < n; i++) {                                                                        \
        double e = exp(((double)x[i] - m) * s);                                                 \
        r += e;                                                                                 \
        if (out) out[i] = e;                                                                    \
    }                                                                                           \
    return r;                                                                                   \
}                                                                                               \
                                                                                                \
static void ATTR ed_shist_##SUFFIX(const float *x, int n, float mx, int *cnt, uint16_t *bk) {   \
    const ed_vf##F lim = (ed_vf##F){} + (float)(ED_SNB - 1);                                    \
    int i = 0;                                                                                  \
    memset(cnt, 0, ED_SNB * sizeof(int));                                                       \
    for (; i + F <= n; i += F) {                                                                \
        ed_vf##F v;                                                                             \
        memcpy(&v, x + i, sizeof v);                                                            \
        ed_vf##F d = (mx - v) * ED_SBW;                                                         \
        ed_vi##F lt = d < lim;                                                                  \
        ed_vi##F b = __builtin_convertvector((ed_vf##F)((lt & (ed_vi##F)d) | (~lt & (ed_vi##F)lim)), ed_vi##F); \
        for (int j = 0; j < F; j++) {                                                           \
            bk[i + j] = (uint16_t)b[j];                                                         \
            cnt[b[j]]++;                                                                        \
        }                                                                                       \
    }                                                                                           \
    for (; i < n; i++) {                                                                        \
        bk[i] = (uint16_t)ed_sbucket(x[i], mx);                                                 \
        cnt[bk[i]]++;                                                                           \
    }                                                                                           \
}                                                                                               \
                                                                                                \
static int ATTR ed_sabove_##SUFFIX(const float *x, int n, float t, int32_t *idx, float *val) {  \
    int i = 0, c = 0;                                                                           \
    for (; i + F <= n; i += F)                                                                  \
        for (unsigned bits = MASK_GE(x + i, t); bits; bits &= bits - 1) {                       \
            idx[c] = i + __builtin_ctz(bits);                                                   \
            val[c++] = x[i + __builtin_ctz(bits)];                                              \
        }                                                                                       \
    for (; i < n; i++) if (x[i] >= t) { idx[c] = i; val[c++] = x[i]; }                          \
    return c;                                                                                   \
}                                                                                               \
                                                                                                \
static int ATTR ed_sfind_##SUFFIX(const float *x, int n, float t) {                             \
    int i = 0;                                                                                  \
    for (; i + F <= n; i += F) {                                                                \
        unsigned bits = MASK_GE(x + i, t);                                                      \
        if (bits) return i + __builtin_ctz(bits);                                               \
    }                                                                                           \
    for (; i < n; i++) if (x[i] >= t) return i;                                                 \
    return -1;                                                                                  \
}

/* MASK_GE(p, t): bit j set where p[j] >= t, for the F floats at p */
static inline unsigned ed_mask_ge_base(const float *p, float t) {
    unsigned bits = 0;
    for (int j = 0; j < 4; j++) bits |= (unsigned)(p[j] >= t) << j;
    return bits;
}
#define MASK_GE ed_mask_ge_base
ED_SAMPLE_FNS(base, , 2, 4)
#undef MASK_GE
#if defined(__x86_64__)
#include <immintrin.h>
static inline unsigned __attribute__((target("avx2,fma"))) ed_mask_ge_avx2(const float *p, float t) {
    return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), _mm256_set1_ps(t), _CMP_GE_OQ));
}
#define MASK_GE ed_mask_ge_avx2
ED_SAMPLE_FNS(avx2, __attribute__((target("avx2,fma"))), 4, 8)
#undef MASK_GE
static inline unsigned __attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl")))
ed_mask_ge_avx512(const float *p, float t) {
    return (unsigned)_mm512_cmp_ps_mask(_mm512_loadu_ps(p), _mm512_set1_ps(t), _CMP_GE_OQ);
}
#define MASK_GE ed_mask_ge_avx512
ED_SAMPLE_FNS(avx512, __attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl"))), 8, 16)
#undef MASK_GE
/* AVX-512 stores the hits of 16 lanes at once (vpcompressd) */
static int __attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl")))
ed_sabove_avx512c(const float *x, int n, float t, int32_t *idx, float *val) {
    int i = 0, c = 0;
    const __m512 tv = _mm512_set1_ps(t);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __mmask16 k = _mm512_cmp_ps_mask(v, tv, _CMP_GE_OQ);
        if (k) {
            _mm512_mask_compressstoreu_epi32(idx + c, k, iv);
            _mm512_mask_compressstoreu_ps(val + c, k, v);
            c += __builtin_popcount(k);
        }
        iv = _mm512_add_epi32(iv, step);
    }
    for (; i < n; i++) if (x[i] >= t) { idx[c] = i; val[c++] = x[i]; }
    return c;
}
#endif

/* One set per kernel path (ed_kernels.sample, ed_simd.h): the avx512 paths take the AVX-512
 * build, the avx2 paths the AVX2 one, generic and neon the baseline build. */
struct ed_sample_fns {
    float (*max)(const float *x, int n);
    double (*exp)(const float *x, int n, float mx, double s, double *out);
    void (*hist)(const float *x, int n, float mx, int *cnt, uint16_t *bk);
    int (*above)(const float *x, int n, float t, int32_t *idx, float *val);
    int (*find)(const float *x, int n, float t);
};
static const struct ed_sample_fns ED_SAMPLE_BASE = {
    .max = ed_smax_base, .exp = ed_sexp_base, .hist = ed_shist_base, .above = ed_sabove_base, .find = ed_sfind_base};
#if defined(__x86_64__)
static const struct ed_sample_fns ED_SAMPLE_AVX2 = {
    .max = ed_smax_avx2, .exp = ed_sexp_avx2, .hist = ed_shist_avx2, .above = ed_sabove_avx2, .find = ed_sfind_avx2};
static const struct ed_sample_fns ED_SAMPLE_AVX512 = {
    .max = ed_smax_avx512, .exp = ed_sexp_avx512, .hist = ed_shist_avx512, .above = ed_sabove_avx512c,
    .find = ed_sfind_avx512};
#endif
#define ed_smax (ed_kern->sample->max)
#define ed_sexp (ed_kern->sample->exp)
#define ed_shist (ed_kern->sample->hist)
#define ed_sabove (ed_kern->sample->above)
#define ed_sfind (ed_kern->sample->find)

#endif
