/* x86 AVX2/FMA/F16C variants of the hot dot products and the Q8 activation quantizers,
 * compiled per function with target attributes (the build stays portable) and installed in
 * the type table by ed_types_init() when the CPU has the features. EDGED_KERNELS=generic
 * keeps the generic C path. Same block layouts and sums as ed_types.h; only the summation
 * order differs (within float rounding).
 */
#ifndef EDGED_ED_SIMD_H
#define EDGED_ED_SIMD_H

#include <stdlib.h>
#include <string.h>
#include "ed_types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ED_AVX2 __attribute__((target("avx2,fma,f16c")))

ED_AVX2 static inline float ed_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ED_AVX2 static inline __m256 ed_i8dot_f(__m256i x, __m256i y) {
    /* signed x signed bytes -> 8 x int32 sums as float */
    const __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
    const __m256i d16 = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(d16, _mm256_set1_epi16(1)));
}

ED_AVX2 static float ed_dot_q4_0_avx2(int n, const void *vx, const void *vy) {
    const blk_q4_0 *x = vx; const blk_q8_0 *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF), off = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int nb = n / QK;
    int i = 0;
    for (; i + 1 < nb; i += 2) {
        __m128i q0 = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m128i q1 = _mm_loadu_si128((const __m128i *)x[i + 1].qs);
        __m256i x0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q0, 4), q0), m4), off);
        __m256i x1 = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q1, 4), q1), m4), off);
        __m256i y0 = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i y1 = _mm256_loadu_si256((const __m256i *)y[i + 1].qs);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), ed_i8dot_f(x0, y0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), ed_i8dot_f(x1, y1), acc1);
    }
    for (; i < nb; i++) {
        __m128i q0 = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m256i x0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q0, 4), q0), m4), off);
        __m256i y0 = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), ed_i8dot_f(x0, y0), acc0);
    }
    return ed_hsum8(_mm256_add_ps(acc0, acc1));
}

ED_AVX2 static float ed_dot_q8_0_avx2(int n, const void *vx, const void *vy) {
    const blk_q8_0 *x = vx; const blk_q8_0 *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int nb = n / QK;
    int i = 0;
    for (; i + 1 < nb; i += 2) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs), y0 = _mm256_loadu_si256((const __m256i *)y[i].qs);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)x[i + 1].qs), y1 = _mm256_loadu_si256((const __m256i *)y[i + 1].qs);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), ed_i8dot_f(x0, y0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i + 1].d) * _cvtsh_ss(y[i + 1].d)), ed_i8dot_f(x1, y1), acc1);
    }
    for (; i < nb; i++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x[i].qs), y0 = _mm256_loadu_si256((const __m256i *)y[i].qs);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d)), ed_i8dot_f(x0, y0), acc0);
    }
    return ed_hsum8(_mm256_add_ps(acc0, acc1));
}

ED_AVX2 static float ed_dot_q4_K_avx2(int n, const void *vx, const void *vy) {
    const blk_q4_K *x = vx; const blk_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    float summin = 0.0f;
    uint8_t sc[8], mn[8];
    for (int i = 0; i < n / QKK; i++) {
        ed_k_scales(x[i].scales, sc, mn);
        const float d = _cvtsh_ss(x[i].d) * y[i].d, dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        int sm = 0;
        for (int j = 0; j < 8; j++) sm += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        summin += dmin * sm;
        __m256i sumi = _mm256_setzero_si256();
        const uint8_t *q4 = x[i].qs; const int8_t *q8 = y[i].qs;
        for (int j = 0; j < 4; j++) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(q4 + 32 * j));
            __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            __m256i ylo = _mm256_loadu_si256((const __m256i *)(q8 + 64 * j));
            __m256i yhi = _mm256_loadu_si256((const __m256i *)(q8 + 64 * j + 32));
            __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_set1_epi16(sc[2 * j]));
            __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return ed_hsum8(acc) - summin;
}

ED_AVX2 static float ed_dot_q6_K_avx2(int n, const void *vx, const void *vy) {
    const blk_q6_K *x = vx; const blk_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QKK; i++) {
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        int corr = 0;
        for (int j = 0; j < 16; j++) corr += x[i].scales[j] * y[i].bsums[j];
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *q8 = y[i].qs + 128 * h;
            const int8_t *scl = x[i].scales + 8 * h;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                __m256i yk = _mm256_loadu_si256((const __m256i *)(q8 + 32 * k));
                __m256i p = _mm256_maddubs_epi16(q[k], yk);
                __m256i s = _mm256_set_m128i(_mm_set1_epi16(scl[2 * k + 1]), _mm_set1_epi16(scl[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        acc = _mm256_add_ps(acc, _mm256_set_ps(0, 0, 0, 0, 0, 0, 0, -32.0f * d * corr));
    }
    return ed_hsum8(acc);
}

ED_AVX2 static float ed_dot_f16_avx2(int n, const void *vx, const void *vy) {
    const ed_half *x = vx, *y = vy;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));
        acc = _mm256_fmadd_ps(a, b, acc);
    }
    float s = ed_hsum8(acc);
    for (; i < n; i++) s += _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
    return s;
}

ED_AVX2 static float ed_dot_f32_avx2(int n, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    float s = ed_hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

ED_AVX2 static void ed_quant_q8_0_avx2(const float *x, void *vy, int k) {
    blk_q8_0 *y = (blk_q8_0 *)vy;
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < k / QK; i++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) { v[j] = _mm256_loadu_ps(x + i * QK + 8 * j); m = _mm256_max_ps(m, _mm256_andnot_ps(signbit, v[j])); }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = amax ? 127.0f / amax : 0.0f;
        y[i].d = (ed_half)_cvtss_sh(d, 0);
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], mul), _MM_ROUND_NEAREST | _MM_FROUND_NO_EXC));
        __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, p);
    }
}
#endif

/* want: NULL/""/"auto" (best available), "generic", "avx2"; returns -1 if unsupported */
static int ed_types_init(const char *want) {
    ed_types_init_generic();
    if (want && *want && strcmp(want, "auto") != 0) {
        if (strcmp(want, "generic") == 0) return 0;
#if defined(__x86_64__) || defined(__i386__)
        if (strcmp(want, "avx2") != 0 && strcmp(want, "avx512") != 0) return -1;
#else
        return -1;
#endif
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        ED_TRAITS[ED_Q4_0].dot = ed_dot_q4_0_avx2;
        ED_TRAITS[ED_Q8_0].dot = ed_dot_q8_0_avx2;
        ED_TRAITS[ED_Q4_K].dot = ed_dot_q4_K_avx2;
        ED_TRAITS[ED_Q6_K].dot = ed_dot_q6_K_avx2;
        ED_TRAITS[ED_F16].dot = ed_dot_f16_avx2;
        ED_TRAITS[ED_F32].dot = ed_dot_f32_avx2;
        ED_ACT[ED_Q8_0].quant = ed_quant_q8_0_avx2;
        ED_PATH = "avx2";
        return 0;
    }
    if (want && *want && strcmp(want, "auto") != 0) return -1;
#endif
    return 0;
}

#endif
