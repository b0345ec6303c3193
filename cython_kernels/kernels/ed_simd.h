/* The kernel paths (ed_kernels, ed_types.h): one const table per instruction set, one chosen
 * at start-up.
 *
 *   int ed_types_init(const char *force)   force: NULL/""/"auto" = the best this CPU runs; a
 *                                           family ("generic", "avx2", "avx512", "neon": its
 *                                           best variant here); or a family less a feature
 *                                           ("avx2-vnni", "avx512-vnni", "neon-dotprod": the
 *                                           variant a CPU without it gets, for tests and
 *                                           benchmarks). Returns 0, or -1 when the forced path
 *                                           is unknown or not supported here (the generic
 *                                           path is then selected).
 *   unsigned ed_cpu_features(void)          ED_CPU_* bits of this CPU
 *   int ed_path_supported(const char *name)  the same names
 *
 * Tables (ed_kern->name): generic (plain C, any CPU); avx2 and avx2+vnni (AVX2+FMA+F16C, with
 * AVX-VNNI's VEX dpbusd); avx512 and avx512+vnni (AVX-512 F/BW/VL/DQ, with VNNI's dpbusd);
 * neon and neon+dotprod (aarch64 Advanced SIMD, with vdotq_s32). Each x86 build is the same
 * source (ed_simd_x86.inc: one body per weight type) compiled with per-function target
 * attributes, so the build stays portable (no -march); the 512-bit kernels below are rows of
 * the avx512 tables where they measured faster.
 */
#ifndef EDGED_ED_SIMD_H
#define EDGED_ED_SIMD_H

#include <string.h>
#include <stdlib.h>
#include "ed_types.h"
#include "ed_gemm.h"

enum {
    ED_CPU_AVX2 = 1, ED_CPU_FMA = 2, ED_CPU_F16C = 4, ED_CPU_AVX512F = 8, ED_CPU_AVX512BW = 16,
    ED_CPU_AVX512VL = 32, ED_CPU_AVX512VNNI = 64, ED_CPU_AVX512DQ = 128, ED_CPU_AVXVNNI = 256,
    ED_CPU_NEON = 512, ED_CPU_DOTPROD = 1024
};

static const char *const ED_CPU_FEATURE_NAMES[] = {
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512dq",
    "avxvnni", "neon", "dotprod", NULL
};

/* Decode-batch tiles (ED_MDOT_SAME) have every column equal to the type's one-token path bit
 * for bit (its row kernel ED_MROWS if it has one, else its dot: the same operations in the
 * same order). A decode batch of several sessions uses only these (forward.h, ed_rows);
 * tests/kernels/c/kernels_check.c and tests/engine/test_engine_batch.py check the equality
 * on every path. */

/* A decode batch's Q8_0 activation rows (forward.h) carry their block scales again, as floats
 * after the blocks (4-byte aligned), so an x86 SAME tile broadcasts one float per block and
 * column instead of converting a half each time (the same values: the conversion is exact).
 *
 * With pairs (ED_SAME_PAIRS: Q8_0 on the VNNI paths, Q8_K too on AVX-512 VNNI) an even row t
 * of a Q8_0 or Q8_K batch also holds, 64-byte aligned after its own data, the pair area of
 * rows t and t + 1. The zmm pair tiles (in this file) read it: one zmm load then serves two
 * sessions, row t in the low half; the 256-bit VNNI tiles (ed_simd_x86.inc) read one half.
 *   Q8_0, per 32-block (ED_PAIR_BLK_Q8_0 bytes): row t's 32 quants, row t + 1's; each one's
 *     float scale 8 times; each one's 8 sums of 4 quants (one per 32-bit lane) times -128, as
 *     int32, so a weight block lifted to unsigned bytes (w + 128) multiplies them with
 *     dpbusd starting from those sums.
 *   Q8_K, per 256-block (ED_PAIR_BLK_Q8_K bytes): for each 32-quant chunk, row t's then row
 *     t + 1's; then each one's scale 8 times.
 * Row stride ed_same_act_bytes(), a multiple of 64 with pairs; other activation formats keep
 * the plain layout. */
#define ED_SAME_DY_OFF(nb) ((((size_t)(nb) * sizeof(blk_q8_0) + 3) & ~(size_t)3))
#define ED_SAME_DY(row, nb) ((const float *)((const uint8_t *)(row) + ED_SAME_DY_OFF(nb)))
/* bytes of a decode batch's Q8_0 row of nb blocks with its float scales (no pair area) */
#define ED_SAME_Q8_0_BYTES(nb) (ED_SAME_DY_OFF(nb) + (size_t)(nb) * sizeof(float))
#define ED_PAIR_BLK_Q8_0 192
#define ED_PAIR_BLK_Q8_K 576
enum { ED_PAIRS_Q8_0 = 1, ED_PAIRS_Q8_K = 2 };  /* ED_SAME_PAIRS: formats with pair areas */

/* bytes of a plain row (with the Q8_0 float scales) before the pair area, 64-aligned */
static inline size_t ed_same_pair_off(int vt, int64_t nb) {
    const size_t own = vt == ED_Q8_0 ? ED_SAME_Q8_0_BYTES(nb) : (size_t)nb * sizeof(blk_q8_K);
    return (own + 63) & ~(size_t)63;
}
#define ED_SAME_PAIR(vt, row, nb) ((const uint8_t *)(row) + ed_same_pair_off(vt, nb))

static size_t ed_same_act_bytes_for(int type, int64_t k, int pairs) {
    const int vt = ED_TRAITS[type].vec_type;
    if (vt == ED_Q8_K && (pairs & ED_PAIRS_Q8_K)) return ed_same_pair_off(vt, k / QKK) + (size_t)(k / QKK) * ED_PAIR_BLK_Q8_K;
    if (vt != ED_Q8_0) return ed_act_row_bytes(type, k);
    if (pairs & ED_PAIRS_Q8_0) return ed_same_pair_off(vt, k / QK) + (size_t)(k / QK) * ED_PAIR_BLK_Q8_0;
    return ED_SAME_Q8_0_BYTES(k / QK);
}

static size_t ed_same_act_bytes(int type, int64_t k) { return ed_same_act_bytes_for(type, k, ED_SAME_PAIRS); }

/* Complete row t of a decode batch of n rows (base, stride rb: ed_same_act_bytes) once the
 * quantizer has written it: its float scales and, with pairs, its half of its pair area (the
 * other half zeroed when t is the last row and even). Rows are independent: each thread fills
 * its own. */
static void ed_same_act_fill(int type, uint8_t *base, size_t rb, int64_t t, int64_t n, int64_t k) {
    const int vt = ED_TRAITS[type].vec_type;
    uint8_t *row = base + t * rb;
    const int h = (int)(t & 1), zero = !h && t == n - 1;
    if (vt == ED_Q8_K && (ED_SAME_PAIRS & ED_PAIRS_Q8_K)) {
        const int64_t nb = k / QKK;
        const blk_q8_K *y = (const blk_q8_K *)row;
        uint8_t *pa = (uint8_t *)ED_SAME_PAIR(vt, base + (t & ~(int64_t)1) * rb, nb);
        for (int64_t ib = 0; ib < nb; ib++, pa += ED_PAIR_BLK_Q8_K) {
            for (int c = 0; c < QKK / 32; c++) {
                memcpy(pa + 64 * c + 32 * h, y[ib].qs + 32 * c, 32);
                if (zero) memset(pa + 64 * c + 32, 0, 32);
            }
            for (int j = 0; j < 8; j++) memcpy(pa + 512 + 32 * h + 4 * j, &y[ib].d, 4);
            if (zero) memset(pa + 512 + 32, 0, 32);
        }
        return;
    }
    if (vt != ED_Q8_0) return;
    const int64_t nb = k / QK;
    const blk_q8_0 *y = (const blk_q8_0 *)row;
    float *dy = (float *)ED_SAME_DY(row, nb);
    for (int64_t ib = 0; ib < nb; ib++) dy[ib] = H2F(y[ib].d);
    if (!(ED_SAME_PAIRS & ED_PAIRS_Q8_0)) return;
    uint8_t *pa = (uint8_t *)ED_SAME_PAIR(vt, base + (t & ~(int64_t)1) * rb, nb);
    for (int64_t ib = 0; ib < nb; ib++, pa += ED_PAIR_BLK_Q8_0) {
        memcpy(pa + 32 * h, y[ib].qs, QK);
        for (int j = 0; j < 8; j++) {
            memcpy(pa + 64 + 32 * h + 4 * j, dy + ib, 4);
            const int8_t *q = y[ib].qs + 4 * j;
            const int32_t c = -128 * (q[0] + q[1] + q[2] + q[3]);
            memcpy(pa + 128 + 32 * h + 4 * j, &c, 4);
        }
        if (zero) memset(pa + 32, 0, 32), memset(pa + 96, 0, 32), memset(pa + 160, 0, 32);
    }
}

/* Generic-path decode-batch tiles: the weight block unpacked once, then per column the generic
 * dot's (ed_types.h) integer sum and float operations in their order. Only where that pays
 * (Q4_0, Q5_0: 2.3-2.6x for 4 columns); the K-quants' and Q8_0's generic dots are dominated by
 * the per-column work, and a batch runs them per column over a cached tile of rows. */
#define ED_GCOL(T, c, ib) ((const T *)((const uint8_t *)vy + (c) * ys) + (ib))

static inline int ed_g_dot32(const int8_t *w, const int8_t *y) {
    int s = 0;
    for (int j = 0; j < QK; j++) s += w[j] * y[j];
    return s;
}

static void ed_same_q4_0(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) {
    const blk_q4_0 *x = vx;
    const int nb = n / QK;
    float sumf[ED_MAX_COLS] = {0};
    int8_t w[QK];
    for (int ib = 0; ib < nb; ib++) {
        for (int j = 0; j < QK / 2; j++) { w[j] = (int8_t)((x[ib].qs[j] & 0xF) - 8); w[j + QK / 2] = (int8_t)((x[ib].qs[j] >> 4) - 8); }
        const float dx = H2F(x[ib].d);
        for (int c = 0; c < nc; c++)
            sumf[c] += ed_g_dot32(w, ED_GCOL(blk_q8_0, c, ib)->qs) * dx * ED_SAME_DY(ED_GCOL(blk_q8_0, c, 0), nb)[ib];
    }
    for (int c = 0; c < nc; c++) out[c * lo] = sumf[c];
}

static void ed_same_q5_0(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) {
    const blk_q5_0 *x = vx;
    const int nb = n / QK;
    float sumf[ED_MAX_COLS] = {0};
    int8_t w[QK];
    for (int ib = 0; ib < nb; ib++) {
        uint32_t qh; memcpy(&qh, x[ib].qh, 4);
        for (int j = 0; j < QK / 2; j++) {
            w[j] = (int8_t)((int)((x[ib].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
            w[j + QK / 2] = (int8_t)((int)((x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
        const float dx = H2F(x[ib].d);
        for (int c = 0; c < nc; c++)
            sumf[c] += (dx * ED_SAME_DY(ED_GCOL(blk_q8_0, c, 0), nb)[ib]) * ed_g_dot32(w, ED_GCOL(blk_q8_0, c, ib)->qs);
    }
    for (int c = 0; c < nc; c++) out[c * lo] = sumf[c];
}

#undef ED_GCOL

static void ed_axpy_f16_generic(int n, float a, const ed_half *x, float *y) {
    for (int i = 0; i < n; i++) y[i] += a * H2F(x[i]);
}

/* Attention over an F16 KV cache for a block of query rows that share one KV head (forward.h
 * forms the blocks: a few tokens x the query heads of one KV head). Row r reads q (hd floats),
 * attends keys/values [lo, hi] of k and v (rows ld halves apart) and writes o (hd floats).
 * The x86 kernels (ed_attn_x86.inc) give each row the bits of forward.h's one-token attention
 * (the canonical order of ed_parity.h) for head dims that are multiples of 64.
 * ws: ed_attn_ws_floats() floats of this thread's scratch, 64-byte aligned. */
#define ED_ATTN_ROWS 32   /* query rows per block (a multiple of 16: whole vectors) */

static inline size_t ed_attn_ws_floats(int hd, int n_ctx) {
    const size_t blocked = (size_t)ED_ATTN_ROWS * hd               /* queries, transposed */
                         + (size_t)4 * hd                          /* keys as float */
                         + (size_t)2 * ED_ATTN_ROWS                /* max, group sums */
                         + (size_t)(n_ctx + 32) * ED_ATTN_ROWS;    /* every key's score */
    const size_t rowwise = (size_t)hd + n_ctx;                      /* f16 query, one score row */
    return ((blocked > rowwise ? blocked : rowwise) + 15) & ~(size_t)15;  /* 64-byte multiple */
}

/* The slow, obvious twin (and the path of CPUs without a blocked kernel): one row at a time,
 * the path's F16 dot per key, an exact max before the exponentials. */
static void ed_attn_rowwise(int nr, const ed_attn_row *rw, const ed_half *k, const ed_half *v,
                            size_t ld, int hd, float scale, float *ws) {
    ed_half *q16 = (ed_half *)ws;  /* (hd) */
    float *sc = ws + hd;           /* (hi - lo + 1) scores, then weights */
    const ed_dot_fn dot16 = ED_DOT[ED_F16];
    for (int r = 0; r < nr; r++) {
        const int lo = rw[r].lo, hi = rw[r].hi;
        float *o = rw[r].o;
        for (int i = 0; i < hd; i++) q16[i] = ed_fp32_to_fp16(rw[r].q[i]);
        float mx = -INFINITY;
        for (int j = lo; j <= hi; j++) {
            const float d = dot16(hd, k + (size_t)j * ld, q16) * scale;
            sc[j - lo] = d;
            if (d > mx) mx = d;
        }
        double sum = 0.0;
        for (int j = 0; j <= hi - lo; j++) { const float e = expf(sc[j] - mx); sc[j] = e; sum += e; }
        const float inv = (float)(1.0 / sum);
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int j = lo; j <= hi; j++) ed_axpy_f16(hd, sc[j - lo] * inv, v + (size_t)j * ld, o);
    }
}

/* out[c * ldo + r] = W[r] . xq[c] for r < nr, c < nc (any nc): the matmul inner tile */
static void ed_mdot_rows(int type, int k, const uint8_t *w, size_t wstride, int nr,
                         const uint8_t *xq, size_t xs, int nc, float *out, size_t ldo) {
    const ed_mdot_fn md = ED_MDOT[type];
    const ed_dot_fn dot = ED_DOT[type];
    if (nc == 1 && ED_MROWS[type]) {  /* one token: 4 rows at a time */
        for (int r = 0; r < nr; r += 4)
            ED_MROWS[type](k, w + r * wstride, wstride, nr - r < 4 ? nr - r : 4, xq, out + r);
        return;
    }
    for (int c0 = 0; c0 < nc; c0 += ED_MAX_COLS) {
        const int cn = nc - c0 < ED_MAX_COLS ? nc - c0 : ED_MAX_COLS;
        for (int r = 0; r < nr; r++) {
            if (md && cn > 1) md(k, w + r * wstride, xq + c0 * xs, xs, cn, out + c0 * ldo + r, ldo);
            else for (int c = 0; c < cn; c++) out[(c0 + c) * ldo + r] = dot(k, w + r * wstride, xq + (c0 + c) * xs);
        }
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

static unsigned ed_cpu_features(void) {
    unsigned f = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) f |= ED_CPU_AVX2;
    if (__builtin_cpu_supports("fma")) f |= ED_CPU_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= ED_CPU_AVX512F;
    if (__builtin_cpu_supports("avx512bw")) f |= ED_CPU_AVX512BW;
    if (__builtin_cpu_supports("avx512vl")) f |= ED_CPU_AVX512VL;
    if (__builtin_cpu_supports("avx512vnni")) f |= ED_CPU_AVX512VNNI;
    if (__builtin_cpu_supports("avx512dq")) f |= ED_CPU_AVX512DQ;
    /* F16C: CPUID.1:ECX bit 29 (not every compiler knows the builtin name) */
    {
        unsigned a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        if (c & (1u << 29)) f |= ED_CPU_F16C;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        if (a & (1u << 4)) f |= ED_CPU_AVXVNNI;
    }
    return f;
}

#define ED_TARGET __attribute__((target("avx2,fma,f16c")))
#define ED_FN(name) ed_avx2_##name
#define ED_VNNI 0
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_VNNI

#define ED_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define ED_FN(name) ed_avx512_##name
#define ED_VNNI 1
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_VNNI

/* AVX2 with AVX-VNNI (Alder Lake / Intel N100 and later without AVX-512): the VEX dpbusd */
#define ED_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define ED_FN(name) ed_avx2vnni_##name
#define ED_VNNI 2
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_VNNI
/* AVX-512 without VNNI (Skylake-SP, Cascade Lake has it): maddubs + madd instead of dpbusd */
#define ED_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define ED_FN(name) ed_avx512nv_##name
#define ED_VNNI 0
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_VNNI

/* 512-bit kernels for the K-quants of Q4_K_M models (AVX-512 path only). One zmm holds 64
 * weights whose Q8_K activations are contiguous, so each activation load is one 64-byte load. */
#define ED_T512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define ED_T512V __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* the 16 signed scales of a Q6_K block as i16, and from them the vector whose 128-bit lane k
 * holds scale q + k in all 8 of its i16 (q = 0, 4, 8, 12): one permute instead of 4 inserts */
static inline __m512i ED_T512 ed_z_q6_scales(const int8_t *sc) {
    return _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
}
static inline __m512i ED_T512 ed_z_scales4(__m512i sc16, int q) {
    const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)q),
                                         _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                                          0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0));
    return _mm512_permutexvar_epi16(idx, sc16);
}

static inline __m512i ED_T512 ed_z_scales2(int a, int b) {  /* i16 x 16 per 256-bit half */
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

static inline float ED_T512 ed_z_hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

/* nc as a constant in each call of the body (see ED_NC_SWITCH in ed_simd_x86.inc) */
#define ED_Z_TILE(name) ED_Z_TILE_T(name, ED_T512)
#define ED_Z_TILE_T(name, target) \
    static void target name(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) { \
        switch (nc) { \
        case 1: name##_body(n, vx, vy, ys, 1, out, lo); break; \
        case 2: name##_body(n, vx, vy, ys, 2, out, lo); break; \
        case 3: name##_body(n, vx, vy, ys, 3, out, lo); break; \
        default: name##_body(n, vx, vy, ys, 4, out, lo); break; } }

/* Q4_K: chunk c (32 bytes) -> zmm [low nibbles = elements 64c.. | high nibbles = 64c+32..] */
static inline __attribute__((always_inline)) void ED_T512 ed_z_mdot_q4_K_body(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) {
    const blk_q4_K *x = vx;
    __m512 acc[ED_MAX_COLS];
    float accm[ED_MAX_COLS];
    for (int c = 0; c < nc; c++) { acc[c] = _mm512_setzero_ps(); accm[c] = 0.0f; }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    uint8_t scales[8], mins[8];
    for (int i = 0; i < n / QKK; i++) {
        ed_k_scales(x[i].scales, scales, mins);
        __m512i sumi[ED_MAX_COLS];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q4, m4)),
                                                 _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), 1);
            const __m512i sc = ed_z_scales2(scales[2 * j], scales[2 * j + 1]);
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = ((const blk_q8_K *)((const uint8_t *)vy + c * ys) + i)->qs + 64 * j;
                const __m512i p = _mm512_maddubs_epi16(w, _mm512_loadu_si512((const void *)q8));
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_madd_epi16(p, sc));
            }
        }
        const float dx = _cvtsh_ss(x[i].d), mx = _cvtsh_ss(x[i].dmin);
        for (int c = 0; c < nc; c++) {
            const blk_q8_K *y = (const blk_q8_K *)((const uint8_t *)vy + c * ys) + i;
            int summs = 0;
            for (int j = 0; j < 8; j++) summs += (y->bsums[2 * j] + y->bsums[2 * j + 1]) * mins[j];
            acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * dx), _mm512_cvtepi32_ps(sumi[c]), acc[c]);
            accm[c] -= y->d * mx * summs;
        }
    }
    for (int c = 0; c < nc; c++) out[c * lo] = ed_z_hsum(acc[c]) + accm[c];
}
ED_Z_TILE(ed_z_mdot_q4_K)

/* Q6_K: per 128 elements, 64 ql bytes in one zmm: low nibbles = elements +0..63, high nibbles
 * = +64..127 (each 32-element quarter gets its 2 high bits from qh >> 2k); values 0..63 are
 * multiplied unsigned and the -32 offset is taken off with the activation block sums. VNNI:
 * dpwssd adds the scaled pair sums in one instruction (the same integers as madd + add). */
static inline __attribute__((always_inline)) void ED_T512V ed_z_mdot_q6_K_body(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) {
    const blk_q6_K *x = vx;
    __m512 acc[ED_MAX_COLS];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int i = 0; i < n / QKK; i++) {
        for (int p = 0; p < (int)sizeof(blk_q6_K); p += 64)  /* stream ahead (matvec) */
            _mm_prefetch((const char *)(x + i) + 1024 + p, _MM_HINT_T0);
        const int8_t *sc = x[i].scales;
        const __m512i sc16 = ed_z_q6_scales(sc);
        /* the -32 offset: -32 x scale x block sum, in lanes 0..7 (the upper 16 i16 are 0) */
        const __m512i m32 = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(sc16, 5));
        __m512i sumi[ED_MAX_COLS];
        for (int c = 0; c < nc; c++) {
            const blk_q8_K *y = (const blk_q8_K *)((const uint8_t *)vy + c * ys) + i;
            sumi[c] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m32,
                                          _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)y->bsums)));
        }
        for (int j = 0; j < 2; j++) {
            const __m512i l = _mm512_loadu_si512((const void *)(x[i].ql + 64 * j));
            const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * j)));
            const __m512i w0 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, sh_lo), m3), 4));
            const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, sh_hi), m3), 4));
            const __m512i s0 = ed_z_scales4(sc16, 8 * j), s1 = ed_z_scales4(sc16, 8 * j + 4);
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = ((const blk_q8_K *)((const uint8_t *)vy + c * ys) + i)->qs + 128 * j;
                const __m512i p0 = _mm512_maddubs_epi16(w0, _mm512_loadu_si512((const void *)q8));
                const __m512i p1 = _mm512_maddubs_epi16(w1, _mm512_loadu_si512((const void *)(q8 + 64)));
                sumi[c] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sumi[c], p0, s0), p1, s1);
            }
        }
        const float dx = _cvtsh_ss(x[i].d);
        for (int c = 0; c < nc; c++) {
            const blk_q8_K *y = (const blk_q8_K *)((const uint8_t *)vy + c * ys) + i;
            acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * dx), _mm512_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) out[c * lo] = ed_z_hsum(acc[c]);
}
ED_Z_TILE_T(ed_z_mdot_q6_K, ED_T512V)

static float ED_T512V ed_z_dot_q6_K(int n, const void *vx, const void *vy) {
    float r;
    ed_z_mdot_q6_K(n, vx, vy, 0, 1, &r, 1);
    return r;
}

/* The packed-panel kernel (ed_gemm.h) with AVX-512 VNNI: a 16-row panel is one zmm per 4
 * weights, each token's 4 activation bytes are broadcast to all 16 lanes by dpbusd. */
#define ED_GEMM_NC 6   /* tokens per tile */
static inline __attribute__((always_inline)) void ED_T512V
ed_z_gemm_tile(const int G, const int has_c, const int nc, int ng, const uint8_t *pu, const float *ac,
               const int32_t *goff, const uint8_t *xq, size_t xs, const ed_ginfo *info, size_t is,
               float *out, size_t ldo, __mmask16 rm) {
    __m512 acc[ED_GEMM_NC];
    const uint8_t *yc[ED_GEMM_NC];
    const ed_ginfo *ic[ED_GEMM_NC];
    for (int c = 0; c < nc; c++) { acc[c] = _mm512_setzero_ps(); yc[c] = xq + (size_t)c * xs; ic[c] = info + (size_t)c * is; }
    for (int g = 0; g < ng; g++, pu += G * ED_PANEL) {
        const int32_t go = goff[g];
        __m512i s[ED_GEMM_NC];
        for (int c = 0; c < nc; c++) s[c] = has_c ? _mm512_setzero_si512() : _mm512_set1_epi32(-ic[c][g].yoff);
        for (int q = 0; q < G / 4; q++) {  /* the tokens' chains interleaved */
            const __m512i w = _mm512_load_si512((const void *)(pu + 64 * q));
            for (int c = 0; c < nc; c++) {
                int32_t v;
                memcpy(&v, yc[c] + go + 4 * q, 4);
                s[c] = _mm512_dpbusd_epi32(s[c], w, _mm512_set1_epi32(v));
            }
        }
        const __m512 A = _mm512_load_ps(ac + 2 * ED_PANEL * g);
        for (int c = 0; c < nc; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[c]), _mm512_set1_ps(ic[c][g].dy)), A, acc[c]);
        if (has_c) {
            const __m512 Cv = _mm512_load_ps(ac + 2 * ED_PANEL * g + ED_PANEL);
            for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(Cv, _mm512_set1_ps(ic[c][g].dys), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(out + (size_t)c * ldo, rm, acc[c]);
}

#define ED_Z_GEMM(GG, HC) do { \
        for (; c0 + ED_GEMM_NC <= nc; c0 += ED_GEMM_NC) \
            ed_z_gemm_tile(GG, HC, ED_GEMM_NC, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, \
                           out + c0 * ldo, ldo, rm); \
        switch (nc - c0) { \
        case 5: ed_z_gemm_tile(GG, HC, 5, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 4: ed_z_gemm_tile(GG, HC, 4, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 3: ed_z_gemm_tile(GG, HC, 3, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 2: ed_z_gemm_tile(GG, HC, 2, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 1: ed_z_gemm_tile(GG, HC, 1, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        default: break; } } while (0)

static void ED_T512V ed_z_gemm(int ng, int G, int has_c, const uint8_t *pu, const float *ac,
                               const int32_t *goff, const uint8_t *xq, size_t xs,
                               const ed_ginfo *info, size_t is, int nc, float *out, size_t ldo,
                               int nr) {
    const __mmask16 rm = (__mmask16)((1u << nr) - 1);
    int c0 = 0;
    if (G == 32) { if (has_c) ED_Z_GEMM(32, 1); else ED_Z_GEMM(32, 0); }
    else         { if (has_c) ED_Z_GEMM(16, 1); else ED_Z_GEMM(16, 0); }
}
#undef ED_Z_GEMM
/* 16 unpacked rows -> panel order: vector q of group g gathers bytes 4q..4q+3 of every row */
static void ED_T512V ed_z_gemm_transpose(const uint8_t *u, int K, int G, uint8_t *pu) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(K));
    for (int k = 0; k < K; k += 4, pu += 64)
        _mm512_store_si512((void *)pu, _mm512_i32gather_epi32(idx, (const void *)(u + k), 1));
    (void)G;
}

/* Q4_0 single-row dot, 512-bit: two blocks per step, block ib in lanes 0..7 (dot_q4_0's first
 * chain) and ib + 1 in lanes 8..15 (its second), each lane running dot_q4_0's operations on
 * the same values, so the result equals ed_avx512_dot_q4_0 bit for bit (the decode-batch tile
 * replays that one). The integer sums come from dpbusd as sum(u * y) - 8 * sum(y) (exact), the
 * four scales of a step are converted together. VNNI only. */
#define ED_T512V_Q __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
static float ED_T512V_Q ed_z_dot_q4_0(int n, const void *vx, const void *vy) {
    const blk_q4_0 *x = vx; const blk_q8_0 *y = vy;
    const int nb = n / QK;
    const __m512i m4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        _mm_prefetch((const char *)(x + ib) + 2048, _MM_HINT_T0);
        const __m256i q01 = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)x[ib + 1].qs),
                                             _mm_loadu_si128((const __m128i *)x[ib].qs));
        /* [lo(q0) | lo(q1) | hi(q0) | hi(q1)] -> [lo(q0) | hi(q0) | lo(q1) | hi(q1)] */
        __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(q01), _mm256_srli_epi16(q01, 4), 1);
        u = _mm512_shuffle_i64x2(_mm512_and_si512(u, m4), _mm512_and_si512(u, m4), _MM_SHUFFLE(3, 1, 2, 0));
        const __m512i yv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[ib].qs)),
                                              _mm256_loadu_si256((const __m256i *)y[ib + 1].qs), 1);
        const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, yv),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, yv));
        const __m128 h = _mm_cvtph_ps(_mm_setr_epi16((short)x[ib].d, (short)x[ib + 1].d, (short)y[ib].d,
                                                      (short)y[ib + 1].d, 0, 0, 0, 0));
        const __m128 d = _mm_mul_ps(h, _mm_movehl_ps(h, h));  /* x.d * y.d of both blocks */
        acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, _mm512_castps128_ps512(d)), _mm512_cvtepi32_ps(p), acc);
    }
    __m256 acc0 = _mm512_castps512_ps256(acc);
    const __m256 acc1 = _mm512_extractf32x8_ps(acc, 1);
    if (ib < nb) {  /* a last odd block: the first chain, as dot_q4_0 */
        const __m256i qx = _mm256_sub_epi8(ed_avx512_nibbles32(x[ib].qs), _mm256_set1_epi8(8));
        const __m256i pq = ed_avx512_dp_ss(_mm256_setzero_si256(), qx, _mm256_loadu_si256((const __m256i *)y[ib].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[ib].d) * _cvtsh_ss(y[ib].d)), _mm256_cvtepi32_ps(pq), acc0);
    }
    return ed_avx512_hsum(_mm256_add_ps(acc0, acc1));
}

/* Q5_0 single-row dot, 512-bit: two blocks per step, block ib in lanes 0..7 and ib + 1 in
 * 8..15. The integer sums are exact (values lifted to unsigned bytes, u = v + 128, summed by
 * dpbusd less 128 x sum(y)); then dot_q5_0's one FMA chain in block order, block ib's lanes
 * and then block ib + 1's, so the result equals ed_avx512_dot_q5_0 bit for bit (the decode-
 * batch tile replays that one). VNNI only. */
static float ED_T512V ed_z_dot_q5_0(int n, const void *vx, const void *vy) {
    const blk_q5_0 *x = vx; const blk_q8_0 *y = vy;
    const int nb = n / QK;
    const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                         0x0004000400040004, 0x0004000400040004);
    const __m512i m4 = _mm512_set1_epi8(0x0F), c70 = _mm512_set1_epi8(0x70), c16 = _mm512_set1_epi8(16);
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    __m256 acc = _mm256_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        _mm_prefetch((const char *)(x + ib) + ED_PREFETCH, _MM_HINT_T0);
        const __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x[ib].qs))),
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x[ib + 1].qs)), 1);
        /* (nibble | 0x70) + 16 * bit = value + 128 */
        const __m512i u0 = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(q, sh), m4, c70, 0xEA);
        uint32_t h0, h1;
        memcpy(&h0, x[ib].qh, 4);
        memcpy(&h1, x[ib + 1].qh, 4);
        const __m512i u = _mm512_mask_add_epi8(u0, _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32), u0, c16);
        const __m512i yv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[ib].qs)),
                                              _mm256_loadu_si256((const __m256i *)y[ib + 1].qs), 1);
        const __m512 p = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, yv),
                                                             _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, yv)));
        const __m128 hd = _mm_cvtph_ps(_mm_setr_epi16((short)x[ib].d, (short)x[ib + 1].d, (short)y[ib].d,
                                                       (short)y[ib + 1].d, 0, 0, 0, 0));
        const __m128 d = _mm_mul_ps(hd, _mm_movehl_ps(hd, hd));  /* x.d * y.d of both blocks */
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm512_castps512_ps256(p), acc);
        acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), _mm256_set1_epi32(1)),
                              _mm512_extractf32x8_ps(p, 1), acc);
    }
    if (ib < nb) {  /* a last odd block: dot_q5_0's operations */
        const __m256i hi = _mm256_andnot_si256(ed_avx512_bits32(x[ib].qh), _mm256_set1_epi8((char)0xF0));
        const __m256i qx = _mm256_or_si256(ed_avx512_nibbles32(x[ib].qs), hi);
        const __m256i pq = ed_avx512_dp_ss(_mm256_setzero_si256(), qx, _mm256_loadu_si256((const __m256i *)y[ib].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[ib].d) * _cvtsh_ss(y[ib].d)), _mm256_cvtepi32_ps(pq), acc);
    }
    return ed_avx512_hsum(acc);
}

/* Decode-batch tiles (ED_MDOT_SAME) of the Q8_0-activation types on AVX-512 VNNI: two
 * sessions per zmm, session 2p in lanes 0..7 and 2p + 1 in lanes 8..15, read from the rows'
 * pair areas (ED_SAME_PAIR). Each lane gets the one-token kernel's integer sum of its 4
 * products (formed as (w + 128) x y - 128 x sum(y): exact, the same number), then that
 * kernel's float operations on the same values (the block scale dx * dy; one FMA per block
 * into the chain that kernel uses), and each session's 8 lanes are summed by the same
 * horizontal sum, so every column equals that kernel bit for bit: dot_q5_0 and mrows_q8_0
 * (one chain), ed_z_dot_q4_0 (even blocks in one chain, odd blocks in a second). A weight
 * block is unpacked once, already lifted and doubled to 64 bytes; each pair then costs four
 * vector operations per block. */
static inline __attribute__((always_inline)) void ED_T512V
ed_z_pair_blk(__m512i u2, ed_half d, const uint8_t *pa, size_t ps, int np, int ib, __m512 *acc) {
    const __m512 dx = _mm512_set1_ps(ED_H2F_TABLE[d]);  /* a load, not a conversion */
    for (int p = 0; p < np; p++) {
        const uint8_t *b = pa + p * ps + (size_t)ib * ED_PAIR_BLK_Q8_0;
        const __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(b + 128)), u2,
                                              _mm512_loadu_si512((const void *)b));
        acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_loadu_ps((const float *)(b + 64))), _mm512_cvtepi32_ps(s), acc[p]);
    }
}

/* the 16 quant bytes of a 32-block as [low nibbles | high nibbles] twice, masked to 0..15 */
static inline __m512i ED_T512V ed_z_pair_nibbles(const uint8_t *qs) {
    const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                         0x0004000400040004, 0x0004000400040004);
    return _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qs)), sh),
                            _mm512_set1_epi8(0x0F));
}

static inline void ED_T512V ed_z_pair_out(const __m512 *acc, int nc, float *out, size_t lo) {
    for (int c = 0; c < nc; c++)
        out[c * lo] = ed_avx512_hsum(c & 1 ? _mm512_extractf32x8_ps(acc[c / 2], 1) : _mm512_castps512_ps256(acc[c / 2]));
}

/* The tiles' bodies take the pair count as a constant (ED_Z_PAIR_FN instantiates 1 and 2), so
 * the accumulators stay in registers. */
#define ED_Z_PAIR_FN(name) \
    static void ED_T512V ed_z_pair_##name(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) { \
        __m512 acc[ED_MAX_COLS / 2]; \
        const uint8_t *pa = ED_SAME_PAIR(ED_Q8_0, vy, n / QK); \
        if (nc > 2) ed_z_pair_##name##_body(n, vx, pa, 2 * ys, 2, acc); \
        else        ed_z_pair_##name##_body(n, vx, pa, 2 * ys, 1, acc); \
        ed_z_pair_out(acc, nc, out, lo); \
    }
#define ED_Z_PAIR_BODY(name) static inline __attribute__((always_inline)) void ED_T512V \
    ed_z_pair_##name##_body(int n, const void *vx, const uint8_t *pa, size_t ps, const int np, __m512 *acc)

ED_Z_PAIR_BODY(q8_0) {
    const blk_q8_0 *x = vx;
    const __m512i lift = _mm512_set1_epi8((char)0x80);
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (int ib = 0; ib < n / QK; ib++) {
        _mm_prefetch((const char *)(x + ib) + ED_PREFETCH, _MM_HINT_T0);
        const __m512i w = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[ib].qs));
        ed_z_pair_blk(_mm512_xor_si512(w, lift), x[ib].d, pa, ps, np, ib, acc);
    }
}
ED_Z_PAIR_FN(q8_0)

/* Q5_0: nibble + 16 * bit - 16 + 128 = (nibble | 0x70) + (bit ? 16 : 0) */
ED_Z_PAIR_BODY(q5_0) {
    const blk_q5_0 *x = vx;
    const __m512i c70 = _mm512_set1_epi8(0x70), c16 = _mm512_set1_epi8(16);
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (int ib = 0; ib < n / QK; ib++) {
        _mm_prefetch((const char *)(x + ib) + ED_PREFETCH, _MM_HINT_T0);
        uint32_t qh; memcpy(&qh, x[ib].qh, 4);
        const __mmask64 hb = _cvtu64_mask64((uint64_t)qh | (uint64_t)qh << 32);
        const __m512i u = _mm512_or_si512(ed_z_pair_nibbles(x[ib].qs), c70);
        ed_z_pair_blk(_mm512_mask_add_epi8(u, hb, u, c16), x[ib].d, pa, ps, np, ib, acc);
    }
}
ED_Z_PAIR_FN(q5_0)

/* Q4_0: nibble - 8 + 128; two chains as ed_z_dot_q4_0 */
ED_Z_PAIR_BODY(q4_0) {
    const blk_q4_0 *x = vx;
    const int nb = n / QK;
    __m512 acc1[ED_MAX_COLS / 2];
    for (int p = 0; p < np; p++) acc[p] = acc1[p] = _mm512_setzero_ps();
    const __m512i c120 = _mm512_set1_epi8(120);
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        _mm_prefetch((const char *)(x + ib) + 2048, _MM_HINT_T0);
        ed_z_pair_blk(_mm512_add_epi8(ed_z_pair_nibbles(x[ib].qs), c120), x[ib].d, pa, ps, np, ib, acc);
        ed_z_pair_blk(_mm512_add_epi8(ed_z_pair_nibbles(x[ib + 1].qs), c120), x[ib + 1].d, pa, ps, np, ib + 1, acc1);
    }
    if (ib < nb) ed_z_pair_blk(_mm512_add_epi8(ed_z_pair_nibbles(x[ib].qs), c120), x[ib].d, pa, ps, np, ib, acc);
    for (int p = 0; p < np; p++) acc[p] = _mm512_add_ps(acc[p], acc1[p]);
}
ED_Z_PAIR_FN(q4_0)
#undef ED_Z_PAIR_FN
#undef ED_Z_PAIR_BODY

/* Q4_K and Q5_K on Q8_K pair areas: dot_q4_K's / dot_q5_K's 8 lanes per session (the
 * sub-block scales times the sums of 4 products, exact; dpwssd is madd + add in one), one FMA
 * per super-block with y.d * x.d, the mins through the dot's 4-lane sum per session,
 * subtracted at the end. `five` (a constant) selects Q5_K: each value's fifth bit from qh. */
static inline __attribute__((always_inline)) void ED_T512V
ed_z_pair_k45_body(int n, const void *vx, const void *vy, size_t ys, const int nc, float *out, size_t lo, const int five) {
    const int nb = n / QKK, np = (nc + 1) / 2;
    const uint8_t *pa = ED_SAME_PAIR(ED_Q8_K, vy, nb);
    __m512 acc[ED_MAX_COLS / 2];
    __m128 accm[ED_MAX_COLS];
    for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) accm[c] = _mm_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    for (int i = 0; i < nb; i++) {
        const blk_q4_K *x4 = (const blk_q4_K *)vx + i;
        const blk_q5_K *x5 = (const blk_q5_K *)vx + i;
        const uint8_t *xs = five ? x5->scales : x4->scales, *qs = five ? x5->qs : x4->qs;
        const ed_half xd = five ? x5->d : x4->d, xdmin = five ? x5->dmin : x4->dmin;
        const int bsz = five ? (int)sizeof(blk_q5_K) : (int)sizeof(blk_q4_K);
        for (int p = 0; p < bsz; p += 64)
            _mm_prefetch((const char *)vx + (size_t)i * bsz + ED_PREFETCH + p, _MM_HINT_T0);
        const __m256i sm = ed_avx512_k4_scales_mins(xs);
        const __m512i scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sm));
        const float mx = ED_H2F_TABLE[xdmin];
        for (int c = 0; c < nc; c++) {
            const blk_q8_K *y = (const blk_q8_K *)((const uint8_t *)vy + c * ys) + i;
            accm[c] = _mm_fmadd_ps(_mm_set1_ps(y->d * mx), _mm_cvtepi32_ps(ed_avx512_k4_min_sums(sm, y->bsums)), accm[c]);
        }
        const __m512i hb = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x5->qh)) : _mm512_setzero_si512();
        const uint8_t *b = pa + (size_t)i * ED_PAIR_BLK_Q8_K;
        __m512i sumi[ED_MAX_COLS / 2];
        for (int p = 0; p < np; p++) sumi[p] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m512i sl = _mm512_shuffle_epi8(scales, _mm512_set1_epi16((short)((4 * j + 1) << 8 | (4 * j))));
            const __m512i sh = _mm512_shuffle_epi8(scales, _mm512_set1_epi16((short)((4 * j + 3) << 8 | (4 * j + 2))));
            const __m512i q4 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * j)));
            __m512i l = _mm512_and_si512(q4, m4), h = _mm512_and_si512(_mm512_srli_epi16(q4, 4), m4);
            if (five) {
                l = _mm512_or_si512(l, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * j), one), 4));
                h = _mm512_or_si512(h, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * j + 1), one), 4));
            }
            for (int p = 0; p < np; p++) {
                const uint8_t *bp = b + p * 2 * ys + 128 * j;
                sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(l, _mm512_loadu_si512((const void *)bp)), sl);
                sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(h, _mm512_loadu_si512((const void *)(bp + 64))), sh);
            }
        }
        const __m512 dx = _mm512_set1_ps(ED_H2F_TABLE[xd]);
        for (int p = 0; p < np; p++)
            acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps((const float *)(b + p * 2 * ys + 512)), dx),
                                     _mm512_cvtepi32_ps(sumi[p]), acc[p]);
    }
    for (int c = 0; c < nc; c++)
        out[c * lo] = ed_avx512_hsum(c & 1 ? _mm512_extractf32x8_ps(acc[c / 2], 1) : _mm512_castps512_ps256(acc[c / 2]))
                      - ed_avx512_hsum128(accm[c]);
}

static inline __attribute__((always_inline)) void ED_T512V
ed_z_pair_q4_K_body(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) {
    ed_z_pair_k45_body(n, vx, vy, ys, nc, out, lo, 0);
}
static inline __attribute__((always_inline)) void ED_T512V
ed_z_pair_q5_K_body(int n, const void *vx, const void *vy, size_t ys, int nc, float *out, size_t lo) {
    ed_z_pair_k45_body(n, vx, vy, ys, nc, out, lo, 1);
}
ED_Z_TILE_T(ed_z_pair_q4_K, ED_T512V)
ED_Z_TILE_T(ed_z_pair_q5_K, ED_T512V)

/* attention: 8 query rows per vector on the AVX2 path, 16 on the AVX-512 path */
#define ED_TARGET __attribute__((target("avx2,fma,f16c")))
#define ED_FN(name) ed_avx2_##name
#define ED_AW 8
#define ED_ATTN_NARROW ed_attn_rowwise
#include "ed_attn_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_AW
#undef ED_ATTN_NARROW

#define ED_TARGET ED_T512
#define ED_FN(name) ed_z_##name
#define ED_AW 16
#define ED_ATTN_NARROW ed_avx2_attn
#include "ed_attn_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_AW
#undef ED_ATTN_NARROW

#define ED_NEED_AVX2 (ED_CPU_AVX2 | ED_CPU_FMA | ED_CPU_F16C)
#define ED_NEED_AVX512 (ED_NEED_AVX2 | ED_CPU_AVX512F | ED_CPU_AVX512BW | ED_CPU_AVX512VL | \
                        ED_CPU_AVX512DQ)

/* The avx512 rows that differ from the 256-bit build's, chosen by measurement on Sapphire
 * Rapids (best of 30, tools/bench_kernels.py-like runs): 512-bit wins for the Q4_K prompt
 * tiles (+20%) and the Q6_K single dot (+20%); the 256-bit VNNI build stays faster for the
 * Q4_K single dot and the Q6_K prompt tiles (512-bit uops share fewer ports). With VNNI the
 * table also takes the 512-bit Q4_0 / Q5_0 dots, the pair tiles that replay them (and the
 * Q8_0 row kernel, Q4_K / Q5_K / Q6_K dots) two sessions per zmm, and the 512-bit panels;
 * without VNNI (dpwssd / dpbusd) only the Q4_K prompt tile changes. */
static const ed_mdot_fn ED_AVX512NV_TILE[ED_NTYPES] = {
    [ED_F32] = ed_avx512nv_tile_f32, [ED_F16] = ed_avx512nv_tile_f16, [ED_BF16] = ed_avx512nv_tile_bf16,
    [ED_Q4_0] = ed_avx512nv_tile_q4_0, [ED_Q4_1] = ed_avx512nv_tile_q4_1, [ED_Q5_0] = ed_avx512nv_tile_q5_0,
    [ED_Q5_1] = ed_avx512nv_tile_q5_1, [ED_Q8_0] = ed_avx512nv_tile_q8_0, [ED_Q2_K] = ed_avx512nv_tile_q2_K,
    [ED_Q3_K] = ed_avx512nv_tile_q3_K, [ED_Q4_K] = ed_z_mdot_q4_K, [ED_Q5_K] = ed_avx512nv_tile_q5_K,
    [ED_Q6_K] = ed_avx512nv_tile_q6_K};
static const ed_dot_fn ED_AVX512V_DOT[ED_NTYPES] = {
    [ED_F32] = ed_avx512_dot_f32, [ED_F16] = ed_avx512_dot_f16, [ED_BF16] = ed_avx512_dot_bf16,
    [ED_Q4_0] = ed_z_dot_q4_0, [ED_Q4_1] = ed_avx512_dot_q4_1, [ED_Q5_0] = ed_z_dot_q5_0,
    [ED_Q5_1] = ed_avx512_dot_q5_1, [ED_Q8_0] = ed_avx512_dot_q8_0, [ED_Q2_K] = ed_avx512_dot_q2_K,
    [ED_Q3_K] = ed_avx512_dot_q3_K, [ED_Q4_K] = ed_avx512_dot_q4_K, [ED_Q5_K] = ed_avx512_dot_q5_K,
    [ED_Q6_K] = ed_z_dot_q6_K};
static const ed_mdot_fn ED_AVX512V_TILE[ED_NTYPES] = {
    [ED_F32] = ed_avx512_tile_f32, [ED_F16] = ed_avx512_tile_f16, [ED_BF16] = ed_avx512_tile_bf16,
    [ED_Q4_0] = ed_avx512_tile_q4_0, [ED_Q4_1] = ed_avx512_tile_q4_1, [ED_Q5_0] = ed_avx512_tile_q5_0,
    [ED_Q5_1] = ed_avx512_tile_q5_1, [ED_Q8_0] = ed_avx512_tile_q8_0, [ED_Q2_K] = ed_avx512_tile_q2_K,
    [ED_Q3_K] = ed_avx512_tile_q3_K, [ED_Q4_K] = ed_z_mdot_q4_K, [ED_Q5_K] = ed_avx512_tile_q5_K,
    [ED_Q6_K] = ed_avx512_tile_q6_K};
static const ed_mdot_fn ED_AVX512V_SAME[ED_NTYPES] = {  /* pair tiles: ed_z_dot_* as one column */
    [ED_F32] = ed_avx512_same_f32, [ED_F16] = ed_avx512_same_f16, [ED_BF16] = ed_avx512_same_bf16,
    [ED_Q4_0] = ed_z_pair_q4_0, [ED_Q4_1] = ed_avx512_same_q4_1, [ED_Q5_0] = ed_z_pair_q5_0,
    [ED_Q5_1] = ed_avx512_same_q5_1, [ED_Q8_0] = ed_z_pair_q8_0, [ED_Q2_K] = ed_avx512_same_q2_K,
    [ED_Q3_K] = ed_avx512_same_q3_K, [ED_Q4_K] = ed_z_pair_q4_K, [ED_Q5_K] = ed_z_pair_q5_K,
    [ED_Q6_K] = ed_z_mdot_q6_K};
static const struct ed_gemm_path ED_AVX512V_GEMM = {
    ed_z_gemm, 1, 0, ed_z_gemm_transpose,
    {[ED_Q4_0] = ed_avx512_unpack_q4_0, [ED_Q5_0] = ed_avx512_unpack_q5_0, [ED_Q8_0] = ed_avx512_unpack_q8_0,
     [ED_Q4_K] = ed_avx512_unpack_q4_K, [ED_Q6_K] = ed_avx512_unpack_q6_K}};

#elif defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

static unsigned ed_cpu_features(void) {
    unsigned long hw = getauxval(AT_HWCAP);
    unsigned f = ED_CPU_NEON;  /* Advanced SIMD is mandatory on aarch64 */
    if (hw & HWCAP_ASIMDDP) f |= ED_CPU_DOTPROD;
    return f;
}

#define ED_TARGET
#define ED_FN(name) ed_neon_##name
#define ED_DOTPROD 0
#include "ed_simd_neon.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_DOTPROD

#define ED_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#define ED_FN(name) ed_neondp_##name
#define ED_DOTPROD 1
#include "ed_simd_neon.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_DOTPROD

#else
static unsigned ed_cpu_features(void) { return 0; }
#endif

/* ------------------------------------------------------------------- the paths ------- */
static const ed_dot_fn ED_GENERIC_DOT[ED_NTYPES] = {
    [ED_F32] = ed_dot_f32, [ED_F16] = ed_dot_f16, [ED_BF16] = ed_dot_bf16,
    [ED_Q4_0] = ed_dot_q4_0, [ED_Q4_1] = ed_dot_q4_1, [ED_Q5_0] = ed_dot_q5_0,
    [ED_Q5_1] = ed_dot_q5_1, [ED_Q8_0] = ed_dot_q8_0, [ED_Q2_K] = ed_dot_q2_K,
    [ED_Q3_K] = ed_dot_q3_K, [ED_Q4_K] = ed_dot_q4_K, [ED_Q5_K] = ed_dot_q5_K,
    [ED_Q6_K] = ed_dot_q6_K};
static const ed_quant_fn ED_GENERIC_QUANT[ED_NTYPES] = {
    [ED_F32] = ed_quant_f32, [ED_F16] = ed_quant_f16, [ED_BF16] = ed_quant_bf16,
    [ED_Q8_0] = ed_quant_q8_0, [ED_Q8_1] = ed_quant_q8_1, [ED_Q8_K] = ed_quant_q8_K};
static const ed_mdot_fn ED_NO_TILES[ED_NTYPES] = {NULL};
static const ed_mrows_fn ED_NO_ROWS[ED_NTYPES] = {NULL};
static const ed_mdot_fn ED_GENERIC_SAME[ED_NTYPES] = {[ED_Q4_0] = ed_same_q4_0, [ED_Q5_0] = ed_same_q5_0};

/* the paths this build knows, best first (ed_types_init takes the first the CPU runs) */
static const ed_kernels ED_PATHS[] = {
#if defined(__x86_64__)
    {"avx512", "avx512+vnni", ED_NEED_AVX512 | ED_CPU_AVX512VNNI, ED_AVX512V_DOT, ed_avx512_quant,
     ED_AVX512V_TILE, ED_AVX512V_SAME, ed_avx512_rows, ED_PAIRS_Q8_0 | ED_PAIRS_Q8_K, &ED_AVX512V_GEMM,
     ed_avx512_axpy_f16, ed_z_attn},
    {"avx512", "avx512", ED_NEED_AVX512, ed_avx512nv_dot, ed_avx512nv_quant, ED_AVX512NV_TILE,
     ed_avx512nv_same, ed_avx512nv_rows, 0, &ed_avx512nv_gemm_path, ed_avx512nv_axpy_f16, ed_z_attn},
    {"avx2", "avx2+vnni", ED_NEED_AVX2 | ED_CPU_AVXVNNI, ed_avx2vnni_dot, ed_avx2vnni_quant,
     ed_avx2vnni_tile, ed_avx2vnni_same, ed_avx2vnni_rows, ED_PAIRS_Q8_0, &ed_avx2vnni_gemm_path,
     ed_avx2vnni_axpy_f16, ed_avx2_attn},
    {"avx2", "avx2", ED_NEED_AVX2, ed_avx2_dot, ed_avx2_quant, ed_avx2_tile, ed_avx2_same, ed_avx2_rows, 0,
     &ed_avx2_gemm_path, ed_avx2_axpy_f16, ed_avx2_attn},
#elif defined(__aarch64__)
    {"neon", "neon+dotprod", ED_CPU_NEON | ED_CPU_DOTPROD, ed_neondp_dot, ED_GENERIC_QUANT, ed_neondp_tile,
     ed_neondp_tile, ED_NO_ROWS, 0, &ed_neondp_gemm_path, ed_neondp_axpy_f16, ed_attn_rowwise},
    {"neon", "neon", ED_CPU_NEON, ed_neon_dot, ED_GENERIC_QUANT, ed_neon_tile, ed_neon_tile, ED_NO_ROWS, 0,
     &ED_GEMM_NONE, ed_neon_axpy_f16, ed_attn_rowwise},
#endif
    {"generic", "generic", 0, ED_GENERIC_DOT, ED_GENERIC_QUANT, ED_NO_TILES, ED_GENERIC_SAME, ED_NO_ROWS, 0,
     &ED_GEMM_NONE, ed_axpy_f16_generic, ed_attn_rowwise},
};
#define ED_NPATHS (int)(sizeof ED_PATHS / sizeof ED_PATHS[0])
static const ed_kernels *ed_kern = &ED_PATHS[ED_NPATHS - 1];

static int ed_path_runs(const ed_kernels *k) { return (ed_cpu_features() & k->need) == k->need; }

/* The path `name` selects on this CPU (see ed_types_init), or NULL. "F-x" is the plain
 * variant of family F when F has a variant "F+x". */
static const ed_kernels *ed_path_find(const char *name) {
    const char *minus = name ? strchr(name, '-') : NULL;
    for (int i = 0; i < ED_NPATHS; i++) {
        const ed_kernels *k = &ED_PATHS[i];
        if (!ed_path_runs(k)) continue;
        if (!name || !*name || !strcmp(name, "auto") || !strcmp(name, k->family) || !strcmp(name, k->name)) return k;
        if (minus && !strcmp(k->name, k->family) && strlen(k->family) == (size_t)(minus - name) &&
            !strncmp(name, k->family, (size_t)(minus - name)))
            for (int j = 0; j < ED_NPATHS; j++) {  /* "F-x" needs a variant "F+x" */
                const char *v = ED_PATHS[j].name;
                if (!strcmp(ED_PATHS[j].family, k->family) && v[minus - name] == '+' && !strcmp(v + (minus - name) + 1, minus + 1))
                    return k;
            }
    }
    return NULL;
}

static int ed_path_supported(const char *name) { return ed_path_find(name) != NULL; }

/* Select the path `force` names (see the top of this file); -1 (and the generic path) when it
 * is unknown or this CPU cannot run it. */
static int ed_types_init(const char *force) {
    if (ED_H2F_TABLE[0x3C00] != 1.0f)
        for (int i = 0; i < 65536; i++) ED_H2F_TABLE[i] = ed_fp16_to_fp32((ed_half)i);
    const ed_kernels *k = ed_path_find(force);
    ed_kern = k ? k : &ED_PATHS[ED_NPATHS - 1];
    return k ? 0 : -1;
}

#endif
