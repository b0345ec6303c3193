/* The per-layer float work of a BERT-family encoder (edged/engine/encoder.py), on the forward
 * pass's thread pool and kernels: LayerNorm with the residual and the matmul bias folded in,
 * GELU / SiLU-gated activations with the up bias, NeoX RoPE on the batch, and attention that
 * is not causal (every token of a sequence sees the whole sequence; no KV cache).
 *
 * Numerics as llama.cpp's CPU backend builds llm_build_bert / nomic-bert:
 *   ggml_add(bias), ggml_add(residual), ggml_norm (mean and variance summed in double, float
 *   scale 1/sqrtf(var + eps)), ggml_mul(w), ggml_add(b); GELU through ggml's F16 table
 *   (ed_pm_gelu); softmax(scale * q.k) with ggml's vector expf (ed_pm_expf_sub: the same bits on
 *   every path); the products q.k and p.v are the selected
 *   path's F32 row kernels (ed_mdot_rows, ED_F32).
 *   The Q8_0 weight products run in llama.cpp's x86 order (ed_enc_mm_q8_0_task, ed_parity.h's
 *   ed_pm_dot_q8_0), not the forward pass's canonical one: see ed_parity.h for why.
 *
 * All functions are task bodies for ed_pool_run (or plain calls with ith 0, nth 1); every
 * buffer belongs to the caller. */
#ifndef EDGED_ENCODER_H
#define EDGED_ENCODER_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forward.h"
#include "encoder_x86.h"

/* x[t] = LN(x[t] + bias + res[t]) * w + b for rows t of (n, E); bias, res may be NULL */
typedef struct {
    float *x;               /* (n, E) in place */
    const float *res;       /* (n, E) residual or NULL */
    const float *bias;      /* (E) the preceding matmul's bias or NULL */
    const float *w, *b;     /* (E) the norm's weight and bias */
    int64_t n;
    int E;
    float eps;
} ed_enc_norm_args;

static void ed_enc_norm_task(void *arg, int ith, int nth) {
    const ed_enc_norm_args *a = (const ed_enc_norm_args *)arg;
    const int E = a->E;
    int64_t r0, r1;
    ed_range(a->n, ith, nth, &r0, &r1);
    for (int64_t t = r0; t < r1; t++) {
        float *x = a->x + t * E;
        if (a->bias) for (int i = 0; i < E; i++) x[i] = x[i] + a->bias[i];
        if (a->res) { const float *r = a->res + t * E; for (int i = 0; i < E; i++) x[i] = x[i] + r[i]; }
        double sum = 0.0;
        for (int i = 0; i < E; i++) sum += (double)x[i];
        const float mean = (float)(sum / E);
        double sum2 = 0.0;
        for (int i = 0; i < E; i++) { const float v = x[i] - mean; x[i] = v; sum2 += (double)(v * v); }
        const float scale = 1.0f / sqrtf((float)(sum2 / E) + a->eps);
        for (int i = 0; i < E; i++) x[i] = (x[i] * scale) * a->w[i] + a->b[i];
    }
}

/* h[t] = GELU(h[t] + bias) (gelu) or SiLU(h[t]) * up[t] (gated) for rows of (n, F) */
typedef struct {
    float *h;               /* (n, F) in place: the up (GELU) or gate (SiLU) product */
    const float *bias;      /* (F) or NULL */
    const float *up;        /* (n, F) the up product of a gated FFN, or NULL */
    int64_t n;
    int F;
} ed_enc_act_args;

static void ed_enc_act_task(void *arg, int ith, int nth) {
    const ed_enc_act_args *a = (const ed_enc_act_args *)arg;
    const int F = a->F;
    int64_t r0, r1;
    ed_range(a->n, ith, nth, &r0, &r1);
    for (int64_t t = r0; t < r1; t++) {
        float *h = a->h + t * F;
        if (a->up) {
            ed_pm_silu_mul(ED_PM, F, h, a->up + t * F);
            continue;
        }
        ed_pm_gelu_row(ED_PM, F, h, a->bias);
    }
}

/* 0: the block kernels of encoder_x86.h are left out (tests compare their bits with the row
 * kernels': edged._core.enc_blocks) */
static int ED_ENC_BLOCKS = 1;

/* sc[i * ldsc + j] = scale * (K_j . Q_i) for keys j < nk (rows D floats apart: the head's
 * keys packed) and queries i < nq (rows ld floats apart): the path's F32 row kernel's dots
 * (ed_mdot_rows); on x86 the blocks of encoder_x86.h for heads of a multiple of 16 values,
 * which give the same bits faster. */
static void ed_enc_scores(int D, const float *k, const float *q, size_t ld, int nk, int nq,
                          float scale, float *sc, size_t ldsc) {
    int nkb = 0, nqb = 0;   /* [0, nqb) x [0, nkb): done by a block kernel */
#if defined(__x86_64__)
    if (ED_ENC_BLOCKS && D % 16 == 0 && nq >= 4 && nk >= 4) {
        nqb = nq & ~3;
        if (!strcmp(ed_kern->family, "avx512")) {
            nkb = nk & ~3;
            ed_enc_scores_avx512(D, k, q, ld, nkb, nqb, scale, sc, ldsc);
        } else if (!strcmp(ed_kern->family, "avx2")) {
            nkb = nk & ~1;
            ed_enc_scores_avx2(D, k, q, ld, nkb, nqb, scale, sc, ldsc);
        } else {
            nqb = 0;
        }
    }
#endif
    const size_t row = ld * sizeof(float), krow = (size_t)D * sizeof(float);
    if (nqb && nk > nkb)
        ed_mdot_rows(ED_F32, D, (const uint8_t *)(k + (size_t)nkb * D), krow, nk - nkb,
                     (const uint8_t *)q, row, nqb, sc + nkb, ldsc);
    if (nq > nqb)
        ed_mdot_rows(ED_F32, D, (const uint8_t *)k, krow, nk,
                     (const uint8_t *)(q + (size_t)nqb * ld), row, nq - nqb, sc + (size_t)nqb * ldsc, ldsc);
    for (int i = 0; i < nq; i++)
        for (int j = i < nqb ? nkb : 0; j < nk; j++) sc[(size_t)i * ldsc + j] *= scale;
}

/* mx[i] = max of row i of (nq, n) scores: SIMD on x86, else nq interleaved scalar chains */
static void ed_enc_rows_max(int nq, int n, const float *sc, float *mx) {
#if defined(__x86_64__)
    if (ED_ENC_BLOCKS && !strcmp(ed_kern->family, "avx512")) { ed_enc_rows_max_avx512(nq, n, sc, mx); return; }
    if (ED_ENC_BLOCKS && !strcmp(ed_kern->family, "avx2")) { ed_enc_rows_max_avx2(nq, n, sc, mx); return; }
#endif
    for (int i = 0; i < nq; i++) mx[i] = -INFINITY;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < nq; i++) if (sc[(size_t)i * n + j] > mx[i]) mx[i] = sc[(size_t)i * n + j];
}

/* Non-causal attention of a batch of sequences. q, k, v rows of token t start at
 * q + t * ld (likewise k, v; a fused qkv product or three separate ones), the matmul biases
 * not yet added (qb, kb, vb: (H*D) or NULL; added here, in place). RoPE (NeoX pairs, the
 * sequence's own positions 0..n-1) when rope_base > 0. out: (n_tokens, H*D).
 * Phase 1 (per token, split over threads): biases and RoPE. Phase 2 (per sequence and head,
 * with V transposed into the thread's scratch), ED_ENC_QROWS queries at a time: their scores
 * scale * K Q^T, softmax row by row (the rows' max and double sums interleaved: independent
 * chains, each row's own order), out = P V. */
#define ED_ENC_QROWS 16
typedef struct {
    float *out;
    float *q, *k, *v;
    const float *qb, *kb, *vb;
    const int64_t *starts;  /* n_seq + 1 row offsets */
    const int32_t *pos;     /* (n_tokens) position of each row in its sequence */
    float *ws;              /* nth * ws_floats scratch */
    size_t ws_floats;       /* >= (ED_ENC_QROWS + 2 * D) * n_max */
    size_t ld;              /* floats between token rows of q, k, v */
    int64_t n_tokens;
    int n_seq, H, D;
    float scale, rope_base;
    ed_pool *pool;
} ed_enc_attn_args;

static inline void ed_enc_add(float *x, const float *b, int n) { for (int i = 0; i < n; i++) x[i] = x[i] + b[i]; }

static void ed_enc_attn_task(void *arg, int ith, int nth) {
    const ed_enc_attn_args *a = (const ed_enc_attn_args *)arg;
    const int H = a->H, D = a->D, Qd = H * D;
    int64_t r0, r1;
    ed_range(a->n_tokens, ith, nth, &r0, &r1);
    for (int64_t t = r0; t < r1; t++) {
        float *q = a->q + t * a->ld, *k = a->k + t * a->ld, *v = a->v + t * a->ld;
        if (a->qb) ed_enc_add(q, a->qb, Qd);
        if (a->kb) ed_enc_add(k, a->kb, Qd);
        if (a->vb) ed_enc_add(v, a->vb, Qd);
        if (a->rope_base > 0) {
            ed_rope(q, H, D, D, a->pos[t], a->rope_base, 1.0f, NULL, 1.0f, 1);
            ed_rope(k, H, D, D, a->pos[t], a->rope_base, 1.0f, NULL, 1.0f, 1);
        }
    }
    if (nth > 1) ed_barrier(a->pool);
    float *sc = a->ws + (size_t)ith * a->ws_floats;
    const ed_pm_fns pm = *ED_PM;
    int64_t task = 0;
    for (int s = 0; s < a->n_seq; s++) {
        const int64_t s0 = a->starts[s];
        const int n = (int)(a->starts[s + 1] - s0);
        for (int h = 0; h < H; h++, task++) {
            if (task % nth != ith) continue;
            float *vt = sc + (size_t)ED_ENC_QROWS * n;             /* (D, n) V^T of this head */
            float *kp = vt + (size_t)D * n;                         /* (n, D) its keys, packed */
            const float *vh = a->v + s0 * a->ld + h * D;
            for (int j = 0; j < n; j++)
                for (int d = 0; d < D; d++) vt[(size_t)d * n + j] = vh[j * a->ld + d];
            for (int j = 0; j < n; j++)
                memcpy(kp + (size_t)j * D, a->k + (s0 + j) * a->ld + h * D, sizeof(float) * D);
            for (int i0 = 0; i0 < n; i0 += ED_ENC_QROWS) {
                const int nq = n - i0 < ED_ENC_QROWS ? n - i0 : ED_ENC_QROWS;
                /* sc[i * n + j] = scale * K_j . Q_(i0 + i) */
                ed_enc_scores(D, kp, a->q + (s0 + i0) * a->ld + h * D, a->ld, n, nq, a->scale, sc, n);
                float mx[ED_ENC_QROWS];
                double sum[ED_ENC_QROWS];
                ed_enc_rows_max(nq, n, sc, mx);
                for (int i = 0; i < nq; i++) sum[i] = 0.0;
                for (int i = 0; i < nq; i++)     /* ggml's vector expf, the path's SIMD form */
                    ed_pm_expf_sub(&pm, n, sc + (size_t)i * n, mx[i], sc + (size_t)i * n);
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < nq; i++) sum[i] += (double)sc[(size_t)i * n + j];
                for (int i = 0; i < nq; i++) {
                    float *p = sc + (size_t)i * n;
                    const float inv = (float)(1.0 / sum[i]);
                    for (int j = 0; j < n; j++) p[j] *= inv;
                }
                /* out[i0 + i, h*D + d] = V^T_d . P_i */
                ed_mdot_rows(ED_F32, n, (const uint8_t *)vt, (size_t)n * sizeof(float), D,
                             (const uint8_t *)sc, (size_t)n * sizeof(float), nq,
                             a->out + (s0 + i0) * Qd + h * D, Qd);
            }
        }
    }
}

/* out[t, r] = W[r] . x[t] for a Q8_0 weight W (N rows of K) in llama.cpp's x86 order.
 * Phase 1 (tokens split over threads): x rows to Q8_0 (ed_quant_q8_0's bits on every path);
 * for the strip kernel also lifted to unsigned, with their scales as float.
 * Phase 2 (rows split): with the path's strip kernel (avx512+vnni), 16 rows at a time packed
 * into the thread's scratch, then every token against them; else tiles of 4 rows x 2 tokens
 * over chunks of ED_ENC_MM_COLS tokens (a row read once per chunk from L1). */
#define ED_ENC_MM_COLS 64
typedef struct {
    float *out;             /* (T, N) */
    const uint8_t *w;       /* N rows of K / 32 blk_q8_0 */
    const float *x;         /* (T, K) */
    uint8_t *xq;            /* (T, K / 32) blk_q8_0 scratch */
    uint8_t *al;            /* (T, K) lifted quants scratch */
    float *dy;              /* (T, K / 32) activation scales scratch */
    uint8_t *strips;        /* nth * (K / 32) * ED_STRIP_BLOCK scratch */
    int64_t T;
    int N, K;
    ed_pool *pool;
} ed_enc_mm_args;

/* rows r0.. (up to 16; past N: zero rows) of W into the strip layout of ed_parity.h */
static void ed_enc_pack_strip(const uint8_t *w, size_t rb, int64_t r0, int64_t N, int nb, uint8_t *strip) {
    for (int b = 0; b < nb; b++) {
        uint8_t *sb = strip + (size_t)b * ED_STRIP_BLOCK;
        float *dw = (float *)sb;
        int32_t *nws = (int32_t *)(sb + 64);
        int8_t *wq = (int8_t *)(sb + 576);
        for (int r = 0; r < 16; r++) {
            const blk_q8_0 *blk = r0 + r < N ? (const blk_q8_0 *)(w + (size_t)(r0 + r) * rb) + b : NULL;
            dw[r] = blk ? ED_PM_F(blk->d) : 0.0f;
            for (int g = 0; g < 8; g++) {
                int s = 0;
                for (int j = 0; j < 4; j++) {
                    const int8_t v = blk ? blk->qs[4 * g + j] : 0;
                    wq[g * 64 + r * 4 + j] = v;
                    s += v;
                }
                nws[g * 16 + r] = -128 * s;
            }
        }
    }
}

static void ed_enc_mm_q8_0_task(void *arg, int ith, int nth) {
    const ed_enc_mm_args *a = (const ed_enc_mm_args *)arg;
    const int nb = a->K / QK;
    const size_t rb = (size_t)nb * sizeof(blk_q8_0);
    const ed_pm_fns pm = *ED_PM;
    int64_t t0, t1, r0, r1;
    ed_range(a->T, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        ED_QUANT[ED_Q8_0](a->x + t * a->K, a->xq + t * rb, a->K);
        if (!pm.strip_q8_0) continue;
        const blk_q8_0 *q = (const blk_q8_0 *)(a->xq + t * rb);
        for (int b = 0; b < nb; b++) {
            a->dy[t * nb + b] = ED_PM_F(q[b].d);
            for (int j = 0; j < QK; j++) a->al[t * a->K + b * QK + j] = (uint8_t)q[b].qs[j] ^ 0x80;
        }
    }
    if (nth > 1) ed_barrier(a->pool);
    if (pm.strip_q8_0) {
        uint8_t *strip = a->strips + (size_t)ith * nb * ED_STRIP_BLOCK;
        ed_range((a->N + 15) / 16, ith, nth, &r0, &r1);
        for (int64_t s = r0; s < r1; s++) {
            const int nr = a->N - s * 16 < 16 ? (int)(a->N - s * 16) : 16;
            ed_enc_pack_strip(a->w, rb, s * 16, a->N, nb, strip);
            for (int64_t c0 = 0; c0 < a->T; c0 += ED_ENC_MM_COLS) {
                const int nc = a->T - c0 < ED_ENC_MM_COLS ? (int)(a->T - c0) : ED_ENC_MM_COLS;
                pm.strip_q8_0(nb, strip, a->al + c0 * a->K, (size_t)a->K, a->dy + c0 * nb, (size_t)nb, nc,
                              a->out + c0 * a->N + s * 16, (size_t)a->N, nr);
            }
        }
        return;
    }
    ed_range((a->N + 3) / 4, ith, nth, &r0, &r1);   /* groups of 4 rows */
    r0 *= 4; r1 = r1 * 4 < a->N ? r1 * 4 : a->N;
    for (int64_t c0 = 0; c0 < a->T; c0 += ED_ENC_MM_COLS) {
        const int64_t c1 = c0 + ED_ENC_MM_COLS < a->T ? c0 + ED_ENC_MM_COLS : a->T;
        for (int64_t r = r0; r < r1; r += 4) {  /* hot loop: tiles of 4 rows x 2 tokens */
            int64_t t = c0;
            if (r + 4 <= r1)
                for (; t + 2 <= c1; t += 2)
                    ed_pm_tile_q8(&pm, a->K, a->w + r * rb, rb, a->xq + t * rb, rb, a->out + t * a->N + r, (size_t)a->N);
            for (; t < c1; t++)
                for (int64_t i = r; i < r + 4 && i < r1; i++)
                    a->out[t * a->N + i] = ed_pm_dot_q8(&pm, a->K, a->w + i * rb, a->xq + t * rb);
        }
    }
}

/* out[t, r] = W[r] . x[t] for an F16 weight W (N rows of K), x rounded to F16 first: the bits
 * of edged._core.matmul's F16 product (the path's rows_f16), faster where encoder_x86.h has a
 * block kernel (ed_enc_mm_f16_ok). Phase 1 (tokens split over threads): x rows to F16 (the path's
 * conversion) and back to float. Phase 2: cache blocks of ED_ENC_F16_ROWS rows split over
 * threads, each passed by every token (4 at a time); the edges by the row kernel itself. */
#define ED_ENC_F16_ROWS 64
typedef struct {
    float *out;             /* (T, N) */
    const uint8_t *w;       /* N rows of K halves */
    const float *x;         /* (T, K) */
    uint8_t *xq;            /* (T, K) halves scratch */
    float *xf;              /* (T, K) floats scratch */
    int64_t T;
    int N, K;
    ed_pool *pool;
} ed_enc_mm_f16_args;

static int ed_enc_mm_f16_ok(int K) {
#if defined(__x86_64__)
    return ED_ENC_BLOCKS && K % 16 == 0 && !strcmp(ed_kern->family, "avx512");
#else
    (void)K;
    return 0;
#endif
}

static void ed_enc_mm_f16_task(void *arg, int ith, int nth) {
    const ed_enc_mm_f16_args *a = (const ed_enc_mm_f16_args *)arg;
    const int K = a->K, N = a->N;
    const size_t rb = (size_t)K * sizeof(ed_half);
    int64_t t0, t1, b0, b1;
    ed_range(a->T, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        ED_QUANT[ED_TRAITS[ED_F16].vec_type](a->x + t * K, a->xq + t * rb, K);
        const ed_half *h = (const ed_half *)(a->xq + t * rb);
        for (int i = 0; i < K; i++) a->xf[t * K + i] = ED_PM_F(h[i]);
    }
    if (nth > 1) ed_barrier(a->pool);
    const int64_t T4 = a->T & ~(int64_t)3;
    ed_range((N + ED_ENC_F16_ROWS - 1) / ED_ENC_F16_ROWS, ith, nth, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        const int r0 = (int)(b * ED_ENC_F16_ROWS);
        const int nr = N - r0 < ED_ENC_F16_ROWS ? N - r0 : ED_ENC_F16_ROWS, nr4 = nr & ~3;
#if defined(__x86_64__)
        ed_enc_mm_f16_avx512(K, (const ed_half *)(a->w + r0 * rb), (size_t)K, nr4, a->xf, (size_t)K,
                             (int)T4, a->out + r0, (size_t)N);
#endif
        if (nr > nr4 && T4)     /* the last rows of the block, every token of the blocks */
            ed_mdot_rows(ED_F16, K, a->w + (size_t)(r0 + nr4) * rb, rb, nr - nr4, a->xq, rb, (int)T4,
                         a->out + r0 + nr4, (size_t)N);
        if (a->T > T4)          /* the last tokens, every row of the block */
            ed_mdot_rows(ED_F16, K, a->w + (size_t)r0 * rb, rb, nr, a->xq + T4 * rb, rb, (int)(a->T - T4),
                         a->out + T4 * N + r0, (size_t)N);
    }
}

#endif
