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
 * the avx512 tables where they measured faster. Each table (ED_PATHS, at the end) is written
 * with designated initializers; its dot and tile rows come from the one type list (ED_TYPES,
 * ed_types.h), its pm and sample entries name the same instruction set's float details
 * (ed_parity.h) and sampler passes (ed_sample.h).
 */
#ifndef EDGED_ED_SIMD_H
#define EDGED_ED_SIMD_H

#include <string.h>
#include <stdlib.h>
#include "ed_types.h"
#include "ed_gemm.h"
#include "ed_parity.h"
#include "ed_sample.h"

enum {
    ED_CPU_AVX2 = 1, ED_CPU_FMA = 2, ED_CPU_F16C = 4, ED_CPU_AVX512F = 8, ED_CPU_AVX512BW = 16,
    ED_CPU_AVX512VL = 32, ED_CPU_AVX512VNNI = 64, ED_CPU_AVX512DQ = 128, ED_CPU_AVXVNNI = 256,
    ED_CPU_NEON = 512, ED_CPU_DOTPROD = 1024, ED_CPU_AVX512BF16 = 2048
};

static const char *const ED_CPU_FEATURE_NAMES[] = {
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512dq",
    "avxvnni", "neon", "dotprod", "avx512bf16", NULL
};

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
                         + (size_t)(n_ctx + 32) * ED_ATTN_ROWS     /* every key's score */
                         + (size_t)64 * hd;                        /* one row's V lanes */
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
        float mx = rw[r].sink;  /* -INFINITY without a sink */
        for (int j = lo; j <= hi; j++) {
            const float d = dot16(hd, k + (size_t)j * ld, q16) * scale;
            sc[j - lo] = d;
            if (d > mx) mx = d;
        }
        double sum = 0.0;
        for (int j = 0; j <= hi - lo; j++) { const float e = expf(sc[j] - mx); sc[j] = e; sum += e; }
        if (rw[r].sink > -INFINITY) sum += expf(rw[r].sink - mx);
        const float inv = (float)(1.0 / sum);
        for (int i = 0; i < hd; i++) o[i] = 0.0f;
        for (int j = lo; j <= hi; j++) ed_axpy_f16(hd, sc[j - lo] * inv, v + (size_t)j * ld, o);
    }
}

/* out[c * ldo + r] = W[r] . xq[c] for r < nr, c < nc (any nc): the matmul inner tile */
static void ed_mdot_rows(int type, int k, const uint8_t *w, size_t wstride, int nr,
                         const uint8_t *xq, size_t xs, int nc, float *out, size_t ldo) {
    const ed_tile_fn md = ED_TILE[type];
    const ed_dot_fn dot = ED_DOT[type];
    if (ED_ROWS[type]) {  /* rows as lanes: the path's rows_n rows x up to ED_MAX_COLS tokens */
        const int rn = ed_kern->rows_n ? ed_kern->rows_n : ED_ROWS_N;
        for (int c0 = 0; c0 < nc; c0 += ED_MAX_COLS)
            for (int r = 0; r < nr; r += rn)
                ED_ROWS[type](k, w + r * wstride, wstride, nr - r < rn ? nr - r : rn,
                              xq + c0 * xs, xs, nc - c0 < ED_MAX_COLS ? nc - c0 : ED_MAX_COLS, out + c0 * ldo + r, ldo);
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

/* the same for W in the R4 layout (ed_repack.h; nr a multiple of ED_R4_ROWS, w the first row's group):
 * the path's R4 row kernel, or the generic twin on a path without one */
static void ed_mdot_rows_r4(int type, int k, const uint8_t *w, size_t row_bytes, int nr,
                            const uint8_t *xq, size_t xs, int nc, float *out, size_t ldo) {
    const ed_rows_fn fn = ed_kern->rows_r4 ? ed_kern->rows_r4[type] : NULL;
    for (int c0 = 0; c0 < nc; c0 += ED_MAX_COLS) {
        const int cn = nc - c0 < ED_MAX_COLS ? nc - c0 : ED_MAX_COLS;
        if (fn) fn(k, w, row_bytes, nr, xq + c0 * xs, xs, cn, out + c0 * ldo, ldo);
        else ed_r4_rows_generic(type, k, w, row_bytes, nr, xq + c0 * xs, xs, cn, out + c0 * ldo, ldo);
    }
}

/* 1 when the selected path repacks weights of `type` at load (ed_kernels.rows_r4) */
static int ed_r4_wanted(int type) {
    return type >= 0 && type < ED_NTYPES && ed_kern->rows_r4 && ed_kern->rows_r4[type];
}

#if defined(__x86_64__)
#include <immintrin.h>
#include "ed_cpu.h"

static unsigned ed_cpu_features(void) {
    const ed_x86_cpu c = ed_x86_cpu_detect();
    return (c.avx2 ? ED_CPU_AVX2 : 0) | (c.fma ? ED_CPU_FMA : 0) | (c.f16c ? ED_CPU_F16C : 0) |
           (c.avx512f ? ED_CPU_AVX512F : 0) | (c.avx512bw ? ED_CPU_AVX512BW : 0) |
           (c.avx512vl ? ED_CPU_AVX512VL : 0) | (c.avx512vnni ? ED_CPU_AVX512VNNI : 0) |
           (c.avx512dq ? ED_CPU_AVX512DQ : 0) | (c.avxvnni ? ED_CPU_AVXVNNI : 0) |
           (c.avx512bf16 ? ED_CPU_AVX512BF16 : 0);
}

#define ED_T512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

/* The reduction trees of 16 dots' 16-lane sums at once (the AVX-512 BF16 row kernel and
 * encoder_x86.h's blocks): each add adds the same two partial sums as ed_pm_hsum16 (l + l + 8,
 * l + l + 4, 0 + 2 and 1 + 3, the last two), 16 trees in 15 shuffles and 15 adds.
 * 16 dots' lanes a[4 r + c] -> one register: lanes 4c .. 4c + 3 = dots (r = 0..3, c) */
static inline __attribute__((always_inline)) __m512 ED_T512 ed_z_tree16(const __m512 *a) {
    __m512 s1[8], s2[4], s3[2];
    for (int m = 0; m < 8; m++)     /* halves: lane l + lane l + 8 */
        s1[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int p = 0; p < 4; p++)     /* quarters: l + l + 4 */
        s2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s1[2 * p], s1[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int u = 0; u < 2; u++) {   /* 0 + 2, 1 + 3 */
        const __m512d e = _mm512_castps_pd(s2[2 * u]), f = _mm512_castps_pd(s2[2 * u + 1]);
        s3[u] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(e, f)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(e, f)));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),   /* last two */
                         _mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Store ed_z_tree16's register as a 4 x 4 block: lanes 4c .. 4c + 3 to o + c * ldo */
static inline __attribute__((always_inline)) void ED_T512 ed_z_store4x4(__m512 v, float *o, size_t ldo) {
    _mm_storeu_ps(o, _mm512_castps512_ps128(v));
    _mm_storeu_ps(o + ldo, _mm512_extractf32x4_ps(v, 1));
    _mm_storeu_ps(o + 2 * ldo, _mm512_extractf32x4_ps(v, 2));
    _mm_storeu_ps(o + 3 * ldo, _mm512_extractf32x4_ps(v, 3));
}

/* BF16 products on the AVX-512 paths (ed_simd_x86.inc, ED_BF16_ROWS): VDPBF16PS where the CPU
 * has AVX512_BF16 and ED_BF16_DP allows it (edged._core.bf16_dp: tests compare the two), else
 * its exact emulation by FMAs */
static int ED_BF16_DP = 1;
static int ed_cpu_bf16 = 0;     /* set by ed_types_init */

#define ED_TARGET __attribute__((target("avx2,fma,f16c")))
#define ED_FN(name) ed_avx2_##name
#define ED_W512 0
#define ED_VNNI 0
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_VNNI
#undef ED_W512

#define ED_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define ED_TARGET_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")))
#define ED_FN(name) ed_avx512_##name
#define ED_W512 1
#define ED_VNNI 1
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_TARGET_BF16
#undef ED_FN
#undef ED_VNNI
#undef ED_W512

/* AVX2 with AVX-VNNI (Alder Lake / Intel N100 and later without AVX-512): the VEX dpbusd */
#define ED_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define ED_FN(name) ed_avx2vnni_##name
#define ED_W512 0
#define ED_VNNI 2
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_FN
#undef ED_VNNI
#undef ED_W512
/* AVX-512 without VNNI (Skylake-SP, Cascade Lake has it): maddubs + madd instead of dpbusd */
#define ED_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define ED_TARGET_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define ED_FN(name) ed_avx512nv_##name
#define ED_W512 1
#define ED_VNNI 0
#include "ed_simd_x86.inc"
#undef ED_TARGET
#undef ED_TARGET_BF16
#undef ED_FN
#undef ED_VNNI
#undef ED_W512

#define ED_T512V __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* The packed-panel kernel (ed_gemm.h) with AVX-512 VNNI: a 16-row panel is one zmm per 4
 * weights, each token's 4 activation bytes are broadcast to all 16 lanes by dpbusd; the
 * canonical order as ed_simd_x86.inc's 256-bit kernel, 16 rows at a time. HC: the type has a
 * min term (then off = 0), else an offset (always 128 here: the panel is lifted). A K-quant's
 * integer sums: isum = sum_g sc_g * (raw group sum) - off * T, msum = T, where
 * T = sum_g w_g * (sum q of group g) (w: the mins, or the scales of an offset type) takes one
 * i16 pair-product (dpwssd) per two groups instead of a 32-bit multiply per group. */
#define ED_GEMM_NC 6   /* tokens per tile */
static inline __attribute__((always_inline)) void ED_T512V
ed_z_gemm_tile(const int G, const int gps, const int HC, const int nc, int ng, const uint8_t *pu, const float *ac,
               const int32_t *goff, const uint8_t *xq, size_t xs, const ed_ginfo *info, size_t is,
               float *out, size_t ldo, __mmask16 rm) {
    __m512 acc[ED_GEMM_NC];
    const uint8_t *yc[ED_GEMM_NC];
    const ed_ginfo *ic[ED_GEMM_NC];
    for (int c = 0; c < nc; c++) { acc[c] = _mm512_setzero_ps(); yc[c] = xq + (size_t)c * xs; ic[c] = info + (size_t)c * is; }
    const int per = gps ? gps : 1;
    for (int g0 = 0; g0 < ng; g0 += per) {
        const float *ab = gps ? ac + (size_t)(g0 / gps) * ED_GEMM_SB_FLOATS(gps) : ac + 2 * ED_PANEL * g0;
        __m512i S[ED_GEMM_NC];
        for (int c = 0; c < nc; c++) S[c] = _mm512_setzero_si512();
        for (int j = 0; j < per; j++, pu += G * ED_PANEL) {
            const int g = g0 + j;
            const int32_t go = goff[g];
            __m512i s[ED_GEMM_NC];
            /* a 32-block offset type starts from -128 * sum q; a K-quant's offsets go into T */
            for (int c = 0; c < nc; c++) s[c] = gps || HC ? _mm512_setzero_si512() : _mm512_set1_epi32(-ic[c][g].yoff);
            for (int q = 0; q < G / 4; q++) {  /* the tokens' chains interleaved */
                const __m512i w = _mm512_load_si512((const void *)(pu + 64 * q));
                for (int c = 0; c < nc; c++) {
                    int32_t v;
                    memcpy(&v, yc[c] + go + 4 * q, 4);
                    s[c] = _mm512_dpbusd_epi32(s[c], w, _mm512_set1_epi32(v));
                }
            }
            if (!gps) {
                for (int c = 0; c < nc; c++) S[c] = s[c];
                continue;
            }
            const __m512i scv = _mm512_loadu_si512((const void *)(ab + 2 * ED_PANEL * j));
            for (int c = 0; c < nc; c++) S[c] = _mm512_add_epi32(S[c], _mm512_mullo_epi32(s[c], scv));
        }
        __m512i T[ED_GEMM_NC];
        if (gps) {
            for (int c = 0; c < nc; c++) T[c] = _mm512_setzero_si512();
            for (int j = 0; j < gps; j += 2) {
                const __m512i wv = _mm512_loadu_si512((const void *)(ab + ED_GEMM_SB_PAIRS(gps) + (size_t)j / 2 * ED_PANEL));
                for (int c = 0; c < nc; c++) T[c] = _mm512_dpwssd_epi32(T[c], wv, _mm512_set1_epi32(ic[c][g0 + j].qpair));
            }
            if (!HC) for (int c = 0; c < nc; c++) S[c] = _mm512_sub_epi32(S[c], _mm512_slli_epi32(T[c], 7));
        }
        const __m512 A = _mm512_loadu_ps(ab + (gps ? 2 * ED_PANEL * gps : 0));
        const __m512 Cv = _mm512_loadu_ps(ab + (gps ? 2 * ED_PANEL * gps : 0) + ED_PANEL);
        for (int c = 0; c < nc; c++) {
            const __m512 dy = _mm512_set1_ps(ic[c][g0].dy);
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(A, dy), _mm512_cvtepi32_ps(S[c]), acc[c]);
            if (HC && gps) acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(Cv, dy), _mm512_cvtepi32_ps(T[c]), acc[c]);
            else if (HC) acc[c] = _mm512_fmadd_ps(Cv, _mm512_set1_ps(ic[c][g0].dys), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) _mm512_mask_storeu_ps(out + (size_t)c * ldo, rm, acc[c]);
}

#define ED_Z_GEMM(GG, GPS, HC) do { \
        for (; c0 + ED_GEMM_NC <= nc; c0 += ED_GEMM_NC) \
            ed_z_gemm_tile(GG, GPS, HC, ED_GEMM_NC, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, \
                           out + c0 * ldo, ldo, rm); \
        switch (nc - c0) { \
        case 5: ed_z_gemm_tile(GG, GPS, HC, 5, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 4: ed_z_gemm_tile(GG, GPS, HC, 4, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 3: ed_z_gemm_tile(GG, GPS, HC, 3, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 2: ed_z_gemm_tile(GG, GPS, HC, 2, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        case 1: ed_z_gemm_tile(GG, GPS, HC, 1, ng, pu, ac, goff, xq + c0 * xs, xs, info + (size_t)c0 * is, is, out + c0 * ldo, ldo, rm); break; \
        default: break; } } while (0)
static void ED_T512V ed_z_gemm(int ng, int G, int gps, int off, int has_c, const uint8_t *pu, const float *ac,
                               const int32_t *goff, const uint8_t *xq, size_t xs,
                               const ed_ginfo *info, size_t is, int nc, float *out, size_t ldo,
                               int nr) {
    const __mmask16 rm = (__mmask16)((1u << nr) - 1);
    int c0 = 0;
    (void)off;  /* 0 with a min term, else 128 (lifted panels) */
    if (G == 32 && gps == 0) { if (has_c) ED_Z_GEMM(32, 0, 1); else ED_Z_GEMM(32, 0, 0); }
    else if (G == 32)        { if (has_c) ED_Z_GEMM(32, 8, 1); else ED_Z_GEMM(32, 8, 0); }
    else                     { if (has_c) ED_Z_GEMM(16, 16, 1); else ED_Z_GEMM(16, 16, 0); }
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

/* avx512 with VNNI: the 256-bit build's kernels and the 512-bit packed panels */
static const struct ed_gemm_path ED_AVX512V_GEMM = {
    .kernel = ed_z_gemm, .lift = 1, .i16 = 0, .transpose = ed_z_gemm_transpose,
    .unpack = {[ED_Q4_0] = ed_avx512_unpack_q4_0, [ED_Q5_0] = ed_avx512_unpack_q5_0, [ED_Q8_0] = ed_avx512_unpack_q8_0,
               [ED_Q4_K] = ed_avx512_unpack_q4_K, [ED_Q6_K] = ed_avx512_unpack_q6_K, [ED_IQ4_NL] = ed_avx512_unpack_iq4_nl,
               [ED_MXFP4] = ed_avx512_unpack_mxfp4, [ED_IQ4_XS] = ed_avx512_unpack_iq4_xs},
    .min_cols = 16,
    .unpack_r4 = {[ED_Q4_0] = ed_avx512_unpack_r4_q4_0, [ED_Q5_0] = ed_avx512_unpack_r4_q5_0,
                  [ED_Q8_0] = ed_avx512_unpack_r4_q8_0, [ED_IQ4_NL] = ed_avx512_unpack_r4_iq4_nl,
                  [ED_MXFP4] = ed_avx512_unpack_r4_mxfp4}};

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
#define ED_GENERIC_DOT_ROW(N, ID, NM, T, BS, VEC, W, A) ED_IF_##W([ED_##N] = ed_dot_##NM,)
#define ED_GENERIC_QUANT_ROW(N, ID, NM, T, BS, VEC, W, A) ED_IF_##A([ED_##N] = ed_quant_##NM,)
static const ed_dot_fn ED_GENERIC_DOT[ED_NTYPES] = {ED_TYPES(ED_GENERIC_DOT_ROW)};
static const ed_quant_fn ED_GENERIC_QUANT[ED_NTYPES] = {ED_TYPES(ED_GENERIC_QUANT_ROW)};
#undef ED_GENERIC_DOT_ROW
#undef ED_GENERIC_QUANT_ROW
static const ed_tile_fn ED_NO_TILES[ED_NTYPES] = {NULL};
static const ed_rows_fn ED_NO_ROWS[ED_NTYPES] = {NULL};

/* the paths this build knows, best first (ed_types_init takes the first the CPU runs) */
#if defined(__x86_64__)
/* the rows one x86 build of ed_simd_x86.inc made (its prefix P) */
#define ED_X86_BUILD(P, PM) .dot = ed_##P##_dot, .quant = ed_##P##_quant, .tile = ed_##P##_tile, \
    .rows = ed_##P##_rows, .rows_r4 = ed_##P##_rows_r4, .axpy_f16 = ed_##P##_axpy_f16, \
    .rows_n = ED_X86_ROWS_N, .pm = PM
#endif
static const ed_kernels ED_PATHS[] = {
#if defined(__x86_64__)
    {.family = "avx512", .name = "avx512+vnni", .need = ED_NEED_AVX512 | ED_CPU_AVX512VNNI, ED_X86_BUILD(avx512, ED_PM_FNS_X86_Z),
     .gemm = &ED_AVX512V_GEMM, .attn = ed_z_attn, .sample = &ED_SAMPLE_AVX512},
    {.family = "avx512", .name = "avx512", .need = ED_NEED_AVX512, ED_X86_BUILD(avx512nv, ED_PM_FNS_X86),
     .gemm = &ed_avx512nv_gemm_path, .attn = ed_z_attn, .sample = &ED_SAMPLE_AVX512},
    {.family = "avx2", .name = "avx2+vnni", .need = ED_NEED_AVX2 | ED_CPU_AVXVNNI, ED_X86_BUILD(avx2vnni, ED_PM_FNS_X86),
     .gemm = &ed_avx2vnni_gemm_path, .attn = ed_avx2_attn, .sample = &ED_SAMPLE_AVX2},
    {.family = "avx2", .name = "avx2", .need = ED_NEED_AVX2, ED_X86_BUILD(avx2, ED_PM_FNS_X86),
     .gemm = &ed_avx2_gemm_path, .attn = ed_avx2_attn, .sample = &ED_SAMPLE_AVX2},
#elif defined(__aarch64__)
    {.family = "neon", .name = "neon+dotprod", .need = ED_CPU_NEON | ED_CPU_DOTPROD,
     .dot = ed_neondp_dot, .quant = ed_neondp_quant, .tile = ed_neondp_tile, .rows = ed_neondp_rows,
     .gemm = &ed_neondp_gemm_path, .axpy_f16 = ed_neondp_axpy_f16, .attn = ed_attn_rowwise,
     .rows_r4 = ed_neondp_rows_r4, .pm = ED_PM_FNS_NEON, .sample = &ED_SAMPLE_BASE},
    {.family = "neon", .name = "neon", .need = ED_CPU_NEON,
     .dot = ed_neon_dot, .quant = ed_neon_quant, .tile = ed_neon_tile, .rows = ed_neon_rows,
     .gemm = &ED_GEMM_NONE, .axpy_f16 = ed_neon_axpy_f16, .attn = ed_attn_rowwise,
     .pm = ED_PM_FNS_NEON, .sample = &ED_SAMPLE_BASE},
#endif
    {.family = "generic", .name = "generic", .need = 0,
     .dot = ED_GENERIC_DOT, .quant = ED_GENERIC_QUANT, .tile = ED_NO_TILES, .rows = ED_NO_ROWS,
     .gemm = &ED_GEMM_NONE, .axpy_f16 = ed_axpy_f16_generic, .attn = ed_attn_rowwise,
     .sample = &ED_SAMPLE_BASE},
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
#if defined(__x86_64__)
    ed_cpu_bf16 = (ed_cpu_features() & ED_CPU_AVX512BF16) != 0;
#endif
    return k ? 0 : -1;
}

#endif
