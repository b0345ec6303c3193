/* An encoder attention head's scores on x86 (encoder.h's ed_enc_scores): sc[i * ldsc + j] =
 * scale * (K_j . Q_i) with each dot in the bits of the path's F32 row kernel (ED_ROWS[ED_F32],
 * ed_simd_x86.inc): 16 lanes, lane l summing k = l, l + 16, ... by FMA, then the tree of
 * hsum(lanes 0-7 + lanes 8-15): halves, quarters, pairs (0 + 2, 1 + 3), the last two.
 *
 * Why: a head is 64 values long (SigLIP, CLIP), so the row kernel spends more on the reduction
 * of each dot (4 FMAs) than on the dot. Here 16 dots (4 keys x 4 queries) run together and their
 * 16 trees are computed at once by shuffles, each add still adding the same two partial sums.
 * For head sizes that are multiples of 16 (no scalar tail); the caller takes the other sizes
 * and the edges (fewer than 4 keys or queries) through the row kernel itself. */
#ifndef EDGED_ENCODER_X86_H
#define EDGED_ENCODER_X86_H
#if defined(__x86_64__)
#include <immintrin.h>

#define ED_ENC_T512 ED_T512
#define ED_ENC_T256 __attribute__((target("avx2,fma")))

/* o[c * ldo + r] = scale * (W_r . x_c) for 4 rows W_r (ws values apart: float, or F16 when
 * w16) and 4 tokens x_c (floats, xs apart), K % 16 == 0: 16 dots, their trees together */
static inline __attribute__((always_inline)) void ED_ENC_T512
ed_enc_tile16(int K, const void *w, size_t ws, const int w16, const float *x, size_t xs, __m512 vs,
              float *o, size_t ldo) {
    __m512 a[16];
    for (int t = 0; t < 16; t++) a[t] = _mm512_setzero_ps();
    for (int d = 0; d < K; d += 16) {   /* hot loop: 8 loads (4 converted for F16), 16 FMAs */
        __m512 xv[4];
        for (int c = 0; c < 4; c++) xv[c] = _mm512_loadu_ps(x + (size_t)c * xs + d);
        for (int r = 0; r < 4; r++) {
            const __m512 wv = w16
                ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const ed_half *)w + (size_t)r * ws + d)))
                : _mm512_loadu_ps((const float *)w + (size_t)r * ws + d);
            for (int c = 0; c < 4; c++) a[4 * r + c] = _mm512_fmadd_ps(wv, xv[c], a[4 * r + c]);
        }
    }
    ed_z_store4x4(_mm512_mul_ps(ed_z_tree16(a), vs), o, ldo);
}

/* the 4 x 4 blocks of keys j < nk4 (rows D apart) and queries i < nq4 (rows ld apart),
 * multiples of 4; D % 16 == 0. Keys outer: 4 keys read once for all the queries. */
static void ED_ENC_T512 ed_enc_scores_avx512(int D, const float *k, const float *q, size_t ld,
                                             int nk4, int nq4, float scale, float *sc, size_t ldsc) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int j = 0; j < nk4; j += 4)
        for (int i = 0; i < nq4; i += 4)
            ed_enc_tile16(D, k + (size_t)j * D, (size_t)D, 0, q + (size_t)i * ld, ld, vs,
                          sc + (size_t)i * ldsc + j, ldsc);
}

/* The same on 256-bit registers: a dot's lanes are two registers (a0: k mod 16 < 8, a1: the
 * rest), so 2 keys x 2 queries run at a time (8 accumulators); the halves a0 + a1 of 2 keys x 4
 * queries are kept and their 8 trees computed together. s[4 (c % 2) + 2 r + c / 2] (key r,
 * query c) -> lanes 2c, 2c + 1 = query c's keys 0, 1. */
static inline __attribute__((always_inline)) __m256 ED_ENC_T256 ed_enc_tree8(const __m256 *s) {
    __m256 s2[4], s3[2];
    for (int p = 0; p < 4; p++)     /* quarters: l + l + 4 */
        s2[p] = _mm256_add_ps(_mm256_permute2f128_ps(s[2 * p], s[2 * p + 1], 0x20),
                              _mm256_permute2f128_ps(s[2 * p], s[2 * p + 1], 0x31));
    for (int u = 0; u < 2; u++) {   /* 0 + 2, 1 + 3 */
        const __m256d e = _mm256_castps_pd(s2[2 * u]), f = _mm256_castps_pd(s2[2 * u + 1]);
        s3[u] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(e, f)),
                              _mm256_castpd_ps(_mm256_unpackhi_pd(e, f)));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),   /* last two */
                         _mm256_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

static void ED_ENC_T256 ed_enc_scores_avx2(int D, const float *k, const float *q, size_t ld,
                                           int nk2, int nq4, float scale, float *sc, size_t ldsc) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (int j = 0; j < nk2; j += 2)
        for (int i = 0; i < nq4; i += 4) {
            __m256 s[8];
            for (int c0 = 0; c0 < 4; c0 += 2) {
                __m256 a0[4], a1[4];    /* [2 r + c] */
                for (int t = 0; t < 4; t++) a0[t] = a1[t] = _mm256_setzero_ps();
                for (int d = 0; d < D; d += 16) {
                    const float *q0 = q + (size_t)(i + c0) * ld + d, *q1 = q0 + ld;
                    const float *k0 = k + (size_t)j * D + d, *k1 = k0 + D;
                    const __m256 x0 = _mm256_loadu_ps(q0), x1 = _mm256_loadu_ps(q1);
                    const __m256 w0 = _mm256_loadu_ps(k0), w1 = _mm256_loadu_ps(k1);
                    a0[0] = _mm256_fmadd_ps(w0, x0, a0[0]); a0[1] = _mm256_fmadd_ps(w0, x1, a0[1]);
                    a0[2] = _mm256_fmadd_ps(w1, x0, a0[2]); a0[3] = _mm256_fmadd_ps(w1, x1, a0[3]);
                    const __m256 y0 = _mm256_loadu_ps(q0 + 8), y1 = _mm256_loadu_ps(q1 + 8);
                    const __m256 v0 = _mm256_loadu_ps(k0 + 8), v1 = _mm256_loadu_ps(k1 + 8);
                    a1[0] = _mm256_fmadd_ps(v0, y0, a1[0]); a1[1] = _mm256_fmadd_ps(v0, y1, a1[1]);
                    a1[2] = _mm256_fmadd_ps(v1, y0, a1[2]); a1[3] = _mm256_fmadd_ps(v1, y1, a1[3]);
                }
                for (int r = 0; r < 2; r++)     /* halves: lane l + lane l + 8 */
                    for (int c = c0; c < c0 + 2; c++)
                        s[4 * (c % 2) + 2 * r + c / 2] = _mm256_add_ps(a0[2 * r + c - c0], a1[2 * r + c - c0]);
            }
            float o[8];
            _mm256_storeu_ps(o, _mm256_mul_ps(ed_enc_tree8(s), vs));
            for (int c = 0; c < 4; c++) {
                sc[(size_t)(i + c) * ldsc + j] = o[2 * c];
                sc[(size_t)(i + c) * ldsc + j + 1] = o[2 * c + 1];
            }
        }
}

/* out[t * ldo + r] = W_r . x_t for the 4 x 4 blocks of rows r < nr4 of an F16 weight (rows
 * ws halves apart) and tokens t < nt4 (float rows of F16 values, xs floats apart), K % 16 == 0:
 * each product in the bits of the path's F16 row kernel (ed_simd_x86.inc's rows_f16: the same
 * lanes and tree as the F32 one above), the activations converted once (ed_enc_mm_f16_task)
 * instead of once per row tile, and 16 trees at a time. Tokens outer: their 4 rows stay in L1
 * while the rows (a cache block of the caller's) pass them. */
static void ED_ENC_T512 ed_enc_mm_f16_avx512(int K, const ed_half *w, size_t ws, int nr4,
                                             const float *x, size_t xs, int nt4, float *out, size_t ldo) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int t = 0; t < nt4; t += 4)
        for (int r = 0; r < nr4; r += 4)
            ed_enc_tile16(K, w + (size_t)r * ws, ws, 1, x + (size_t)t * xs, xs, one,
                          out + (size_t)t * ldo + r, ldo);
}

/* mx[i] = the largest of row i's n scores (rows n apart), i < nq: lane-wise max_ps(x, m) keeps m
 * where x > m is false (a NaN score: as the scalar `if (x > m) m = x`); a max is exact in any
 * order (a signed zero that differs subtracts to the same exp argument) */
static void ED_ENC_T512 ed_enc_rows_max_avx512(int nq, int n, const float *sc, float *mx) {
    for (int i = 0; i < nq; i++) {
        const float *p = sc + (size_t)i * n;
        __m512 m = _mm512_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(p + j), m);
        float r = _mm512_reduce_max_ps(m);
        for (; j < n; j++) if (p[j] > r) r = p[j];
        mx[i] = r;
    }
}

static void ED_ENC_T256 ed_enc_rows_max_avx2(int nq, int n, const float *sc, float *mx) {
    for (int i = 0; i < nq; i++) {
        const float *p = sc + (size_t)i * n;
        __m256 m = _mm256_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(p + j), m);
        float l[8], r = -INFINITY;
        _mm256_storeu_ps(l, m);
        for (int k = 0; k < 8; k++) if (l[k] > r) r = l[k];
        for (; j < n; j++) if (p[j] > r) r = p[j];
        mx[i] = r;
    }
}

#endif
#endif
