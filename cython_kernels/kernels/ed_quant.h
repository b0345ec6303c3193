/* Compiled weight quantizers: llama.cpp's algorithms, the fast twin of edged/format/quants.py
 * (tests check both produce the same bytes, and the weighted ones llama-quantize's). Single
 * rows of k floats (k a multiple of the block size) in, blocks out:
 *
 *   int ed_quantize_row(int type, const float *x, void *y, int64_t k)   the reference
 *       algorithms (no importance matrix); 0, or -1 if no quantizer
 *   int ed_quantize_row_w(int type, const float *x, const float *qw, void *y, int64_t k)
 *       with an importance row qw (k values from llama-imatrix): llama.cpp's quantize_<type>
 *       with quant_weights (Q4_0..Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS; Q8_0 and MXFP4 ignore it)
 *
 * Float operations run in the reference's order; contraction into FMA is disabled so every
 * architecture rounds the same way.
 */
#ifndef EDGED_ED_QUANT_H
#define EDGED_ED_QUANT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"

/* No contraction into FMA: gcc takes the attribute, clang (the wheels' zig cc) ignores it and
 * takes the pragma, which holds to the end of this header. */
#define ED_NOFMA __attribute__((optimize("fp-contract=off")))
#ifdef __clang__
#pragma float_control(push)
#pragma clang fp contract(off)
#endif
#define ED_GROUP_MAX_EPS 1e-15f

static inline int ed_qmax(int a, int b) { return a > b ? a : b; }
static inline int ed_qmin(int a, int b) { return a < b ? a : b; }

/* The value of largest magnitude among x[0..n) (the first on ties; 0 if all are 0): the sign
 * of the scale of the symmetric types follows it. */
static inline ED_NOFMA float ed_abs_max_signed(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) { const float ax = fabsf(x[i]); if (ax > amax) { amax = ax; max = x[i]; } }
    return max;
}

/* ----------------------------------------------------------------- 32-blocks --------- */
/* Each type computes its 32 levels q[j] (its own rounding, as llama.cpp's), then packs them:
 * q[j] in the low and q[j + 16] in the high nibble of qs[j]; the 5-bit types first move bit 4
 * of q[j] to bit j of qh. */
static inline ED_NOFMA void ed_pack_nibbles(const uint8_t *q, uint8_t *qs) {
    for (int j = 0; j < QK / 2; j++) qs[j] = q[j] | (uint8_t)(q[j + QK / 2] << 4);
}

static inline ED_NOFMA void ed_pack_q5(uint8_t *q, uint8_t *qh, uint8_t *qs) {
    uint32_t h = 0;
    for (int j = 0; j < QK; j++) { h |= ((uint32_t)(q[j] >> 4) & 1u) << j; q[j] &= 0x0F; }
    memcpy(qh, &h, 4);
    ed_pack_nibbles(q, qs);
}

static inline ED_NOFMA void ed_min_max(const float *x, int n, float *pmin, float *pmax) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < n; j++) { if (x[j] < min) min = x[j]; if (x[j] > max) max = x[j]; }
    *pmin = min; *pmax = max;
}

/* Levels of the symmetric types (Q4_0: half 8, Q5_0: half 16): d = the value of largest
 * magnitude / -half, q = (int8)(x / d + half + 0.5) capped at 2 half - 1. Returns d. */
static inline ED_NOFMA float ed_q32_levels_sym(const float *x, int half, uint8_t *q) {
    const float d = ed_abs_max_signed(x, QK) / -half, id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; j++) q[j] = (uint8_t)ed_qmin(2 * half - 1, (int8_t)(x[j] * id + (half + 0.5f)));
    return d;
}

/* Levels of the types with a min (Q4_1: nmax 15, Q5_1: nmax 31): d = (max - min) / nmax,
 * q = (x - min) / d + 0.5 truncated; llama.cpp caps (through int8) the 4-bit ones only. */
static inline ED_NOFMA void ed_q32_levels_min(const float *x, int nmax, int cap, ed_half *dd,
                                              ed_half *dmin, uint8_t *q) {
    float min, max;
    ed_min_max(x, QK, &min, &max);
    const float d = (max - min) / nmax, id = d ? 1.0f / d : 0.0f;
    *dd = ed_fp32_to_fp16(d); *dmin = ed_fp32_to_fp16(min);
    for (int j = 0; j < QK; j++) {
        const float v = (x[j] - min) * id + 0.5f;
        q[j] = cap ? (uint8_t)ed_qmin(nmax, (int8_t)v) : (uint8_t)v;
    }
}

static ED_NOFMA void ed_q_q4_0(const float *x, blk_q4_0 *y) {
    uint8_t q[QK];
    y->d = ed_fp32_to_fp16(ed_q32_levels_sym(x, 8, q));
    ed_pack_nibbles(q, y->qs);
}

static ED_NOFMA void ed_q_q5_0(const float *x, blk_q5_0 *y) {
    uint8_t q[QK];
    y->d = ed_fp32_to_fp16(ed_q32_levels_sym(x, 16, q));
    ed_pack_q5(q, y->qh, y->qs);
}

static ED_NOFMA void ed_q_q4_1(const float *x, blk_q4_1 *y) {
    uint8_t q[QK];
    ed_q32_levels_min(x, 15, 1, &y->d, &y->m, q);
    ed_pack_nibbles(q, y->qs);
}

static ED_NOFMA void ed_q_q5_1(const float *x, blk_q5_1 *y) {
    uint8_t q[QK];
    ed_q32_levels_min(x, 31, 0, &y->d, &y->m, q);
    ed_pack_q5(q, y->qh, y->qs);
}

static ED_NOFMA void ed_q_q8_0(const float *x, blk_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) { const float v = fabsf(x[j]); if (v > amax) amax = v; }
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    y->d = ed_fp32_to_fp16(d);
    for (int j = 0; j < QK; j++) y->qs[j] = (int8_t)roundf(x[j] * id);
}

/* ----------------------------------------------------------------- K-quant helpers --- */
static ED_NOFMA float ed_make_qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L,
                                   float *the_min, uint8_t *Laux, float rmin, float rdelta,
                                   int nstep, int use_mad) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i]; sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) { for (int i = 0; i < n; i++) L[i] = 0; *the_min = -min; return 0.0f; }
    float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        const int l = ed_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)ed_qmax(0, ed_qmin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = ed_qmax(0, ed_qmin(nmax, ed_nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sl += w[i] * l; sl2 += w[i] * l * l; sxl += w[i] * l * x[i];
        }
        const float D = sum_w * sl2 - sl * sl;
        if (D > 0) {
            float ts = (sum_w * sxl - sum_x * sl) / D, tm = (sl2 * sum_x - sl * sxl) / D;
            if (tm > 0) { tm = 0; ts = sxl / sl2; }
            float cur = 0;
            for (int i = 0; i < n; i++) {
                float diff = ts * Laux[i] + tm - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur += w[i] * diff;
            }
            if (cur < best) { memcpy(L, Laux, (size_t)n); best = cur; scale = ts; min = tm; }
        }
    }
    *the_min = -min;
    return scale;
}

static ED_NOFMA float ed_make_q3(int n, int nmax, const float *x, int8_t *L) {
    const float max = ed_abs_max_signed(x, n);
    if (fabsf(max) < ED_GROUP_MAX_EPS) { memset(L, 0, (size_t)n); return 0.0f; }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = ed_qmax(-nmax, ed_qmin(nmax - 1, ed_nearest_int(iscale * x[i])));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l; suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int nl = ed_qmax(-nmax, ed_qmin(nmax - 1, ed_nearest_int(x[i] * sl2 / slx)));
                if (nl != L[i]) {
                    slx += w * x[i] * nl; sl2 += w * nl * nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl; sumlx = slx; suml2 = sl2; changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* make_qx_quants with rmse_type 1: the symmetric scale maximising (sum w l x)^2 / sum w l l
 * over 19 trial scales around max / -nmax, w = qw (an importance row) or, without, x^2.
 * L = l + nmax in [0, 2 nmax). Used by Q6_K, and with weights by Q3_K, Q4_0, Q5_0. */
static ED_NOFMA float ed_make_qx1(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    const float max = ed_abs_max_signed(x, n);
    if (fabsf(max) < ED_GROUP_MAX_EPS) { memset(L, 0, (size_t)n); return 0.0f; }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = ed_qmax(-nmax, ed_qmin(nmax - 1, ed_nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        const float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * l; suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = ed_qmax(-nmax, ed_qmin(nmax - 1, ed_nearest_int(iscale * x[i])));
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * l; suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + ed_qmax(-nmax, ed_qmin(nmax - 1, ed_nearest_int(iscale * x[i]))));
            scale = sumlx / suml2; best = scale * sumlx;
        }
    }
    return scale;
}

/* make_qp_quants: levels 0..nmax of non-negative x (the K-quants' sub-block scales and mins)
 * under weights qw: the best of 9 trial scales around max / nmax by weighted squared error,
 * then up to 5 rounds moving single levels while (sum w l x)^2 / sum w l l grows. Levels are
 * capped above only and stored as bytes, as llama.cpp does. Returns the scale. */
static ED_NOFMA float ed_make_qp(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < ED_GROUP_MAX_EPS) { memset(L, 0, (size_t)n); return 0.0f; }
    float iscale = nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)ed_nearest_int(iscale * x[i]);
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; i++) { const float diff = x[i] - scale * L[i]; best_mse += qw[i] * diff * diff; }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * is + nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            const int l = ed_qmin(nmax, ed_nearest_int(iscale_is * x[i]));
            const float diff = x[i] - scale_is * l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) { best_mse = mse; iscale = iscale_is; }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = ed_qmin(nmax, ed_nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += qw[i] * x[i] * l; suml2 += qw[i] * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = qw[i];
            float slx = sumlx - w * x[i] * L[i], sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                const int nl = ed_qmin(nmax, ed_nearest_int(x[i] * sl2 / slx));
                if (nl != L[i]) {
                    slx += w * x[i] * nl; sl2 += w * nl * nl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) { L[i] = (uint8_t)nl; sumlx = slx; suml2 = sl2; changed++; }
                }
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The importance weights of the weighted quantizers: qw * sqrt(sigma2 + x^2), sigma2 the mean
 * square of the row (Q4_0..Q5_1) or super-block (K-quants; twice it except for Q2_K). */
static inline ED_NOFMA float ed_sigma2(const float *x, int64_t n, float mul) {
    float s = 0;
    for (int64_t j = 0; j < n; j++) s += x[j] * x[j];
    return mul * s / n;
}

static inline ED_NOFMA void ed_imp_weights(int n, const float *x, const float *qw, float sigma2, float *w) {
    for (int l = 0; l < n; l++) w[l] = qw[l] * sqrtf(sigma2 + x[l] * x[l]);
}

static void ed_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else { *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

/* The K-quants' last pass: the n levels of a group again, against the scale d and min dm as
 * stored (f16-rounded, 6- or 4-bit): L = clamp(nearest_int((x + dm) / d), lo, hi) - lo. A zero
 * scale keeps the levels of the fit. (x + 0) / d differs from x / d only in the sign of a zero,
 * which nearest_int drops. */
static inline ED_NOFMA void ed_requant_group(int n, const float *x, float d, float dm, int lo, int hi,
                                             uint8_t *L) {
    if (!d) return;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)(ed_qmax(lo, ed_qmin(hi, ed_nearest_int((x[i] + dm) / d))) - lo);
}

/* Q2_K/Q3_K 2-bit fields: per 128 levels, 32 bytes holding levels l, l+32, l+64, l+96 */
static inline ED_NOFMA void ed_pack_crumbs(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QKK; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* Q4_0..Q5_1 with an importance row (quantize_row_q4_0_impl .. q5_1_impl): weights
 * qw sqrt(sigma2 + x^2), sigma2 the mean square of the whole row; the symmetric types fit
 * their scale with make_qx_quants (rmse_type 1), the ones with a min with make_qkx3 (37
 * trial steps). */
static ED_NOFMA void ed_q32_w_sym(const float *x, const float *qw, float sigma2, int half, ed_half *d, uint8_t *q) {
    float w[QK];
    ed_imp_weights(QK, x, qw, sigma2, w);
    *d = ed_fp32_to_fp16(ed_make_qx1(QK, half, x, (int8_t *)q, w));
}

static ED_NOFMA void ed_q32_w_min(const float *x, const float *qw, float sigma2, int nmax, ed_half *d, ed_half *m,
                                  uint8_t *q) {
    float w[QK], min;
    uint8_t Laux[QK];
    ed_imp_weights(QK, x, qw, sigma2, w);
    *d = ed_fp32_to_fp16(ed_make_qkx2(QK, nmax, x, w, q, &min, Laux, -0.9f, 0.05f, 36, 0));
    *m = ed_fp32_to_fp16(-min);
}

static ED_NOFMA void ed_q_q4_0_w(const float *x, const float *qw, float sigma2, blk_q4_0 *y) {
    uint8_t q[QK];
    ed_q32_w_sym(x, qw, sigma2, 8, &y->d, q);
    ed_pack_nibbles(q, y->qs);
}

static ED_NOFMA void ed_q_q5_0_w(const float *x, const float *qw, float sigma2, blk_q5_0 *y) {
    uint8_t q[QK];
    ed_q32_w_sym(x, qw, sigma2, 16, &y->d, q);
    ed_pack_q5(q, y->qh, y->qs);
}

static ED_NOFMA void ed_q_q4_1_w(const float *x, const float *qw, float sigma2, blk_q4_1 *y) {
    uint8_t q[QK];
    ed_q32_w_min(x, qw, sigma2, 15, &y->d, &y->m, q);
    ed_pack_nibbles(q, y->qs);
}

static ED_NOFMA void ed_q_q5_1_w(const float *x, const float *qw, float sigma2, blk_q5_1 *y) {
    uint8_t q[QK];
    ed_q32_w_min(x, qw, sigma2, 31, &y->d, &y->m, q);
    ed_pack_q5(q, y->qh, y->qs);
}

/* ----------------------------------------------------------------- K-quants ---------- */
/* Q2_K with an importance row: quantize_row_q2_K_impl (weights qw sqrt(sigma2 + x^2), make_qkx3
 * with 37 trial steps per group of 16, the 4-bit scales and mins fitted by make_qp_quants) */
static ED_NOFMA void ed_q_q2_K_w(const float *x, const float *qw, blk_q2_K *y) {
    uint8_t L[QKK], Laux[16], Ls[16], Lm[16];
    float w[16], sw[16], mins[16], scales[16];
    const float sigma2 = ed_sigma2(x, QKK, 1);
    for (int j = 0; j < 16; j++) {
        ed_imp_weights(16, x + 16 * j, qw + 16 * j, sigma2, w);
        sw[j] = 0;
        for (int l = 0; l < 16; l++) sw[j] += w[l];
        scales[j] = ed_make_qkx2(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    }
    y->d = ed_fp32_to_fp16(ed_make_qp(16, 15, scales, Ls, sw));
    y->dmin = ed_fp32_to_fp16(ed_make_qp(16, 15, mins, Lm, sw));
    for (int j = 0; j < 16; j++) y->scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    for (int j = 0; j < 16; j++)
        ed_requant_group(16, x + 16 * j, ed_fp16_to_fp32(y->d) * (y->scales[j] & 0xF),
                         ed_fp16_to_fp32(y->dmin) * (y->scales[j] >> 4), 0, 3, L + 16 * j);
    ed_pack_crumbs(L, y->qs);
}

static ED_NOFMA void ed_q_q2_K(const float *x, blk_q2_K *y) {
    uint8_t L[QKK], Laux[16];
    float w[16], mins[16], scales[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        scales[j] = ed_make_qkx2(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
        const float is = 15.f / max_scale;
        for (int j = 0; j < 16; j++) y->scales[j] = (uint8_t)ed_nearest_int(is * scales[j]);
        y->d = ed_fp32_to_fp16(max_scale / 15.f);
    } else {
        memset(y->scales, 0, 16);
        y->d = ed_fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
        const float im = 15.f / max_min;
        for (int j = 0; j < 16; j++) y->scales[j] |= (uint8_t)(ed_nearest_int(im * mins[j]) << 4);
        y->dmin = ed_fp32_to_fp16(max_min / 15.f);
    } else {
        y->dmin = ed_fp32_to_fp16(0.f);
    }
    for (int j = 0; j < 16; j++)
        ed_requant_group(16, x + 16 * j, ed_fp16_to_fp32(y->d) * (y->scales[j] & 0xF),
                         ed_fp16_to_fp32(y->dmin) * (y->scales[j] >> 4), 0, 3, L + 16 * j);
    ed_pack_crumbs(L, y->qs);
}

/* Q3_K: the 16 signed 6-bit scale levels Ls (0..63, 32 = zero) packed, d stored, the levels
 * of each group of 16 again against the stored scales, then the high bits to hmask. */
static ED_NOFMA void ed_q3_store(const float *x, const int8_t *Ls, float d, int8_t *L, blk_q3_K *y) {
    memset(y->scales, 0, 12);
    for (int j = 0; j < 16; j++) {
        int l = Ls[j];
        if (j < 8) y->scales[j] = l & 0xF;
        else y->scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
        l >>= 4;
        y->scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
    }
    y->d = ed_fp32_to_fp16(d);
    for (int j = 0; j < 16; j++) {
        int8_t sc = j < 8 ? (int8_t)(y->scales[j] & 0xF) : (int8_t)(y->scales[j - 8] >> 4);
        sc = (int8_t)((sc | (((y->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
        ed_requant_group(16, x + 16 * j, ed_fp16_to_fp32(y->d) * sc, 0.0f, -4, 3, (uint8_t *)L + 16 * j);
    }
    memset(y->hmask, 0, 32);
    int m = 0; uint8_t hm = 1;
    for (int j = 0; j < QKK; j++) {
        if (L[j] > 3) { y->hmask[m] |= hm; L[j] -= 4; }
        if (++m == 32) { m = 0; hm <<= 1; }
    }
    ed_pack_crumbs((const uint8_t *)L, y->qs);
}

/* Q3_K without an importance row: make_q3_quants per group, the scales as multiples of
 * their largest / -32 (quantize_row_q3_K_ref) */
static ED_NOFMA void ed_q_q3_K(const float *x, blk_q3_K *y) {
    int8_t L[QKK], Ls[16];
    float scales[16];
    for (int j = 0; j < 16; j++) scales[j] = ed_make_q3(16, 4, x + 16 * j, L + 16 * j);
    const float max_scale = ed_abs_max_signed(scales, 16);
    if (!max_scale) {
        memset(Ls, 0, 16);  /* all scale bytes 0, d 0: the levels of the fit stay */
        ed_q3_store(x, Ls, 0.f, L, y);
        return;
    }
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < 16; j++) Ls[j] = (int8_t)(ed_qmax(-32, ed_qmin(31, (int8_t)ed_nearest_int(iscale * scales[j]))) + 32);
    ed_q3_store(x, Ls, 1 / iscale, L, y);
}

/* Q3_K with an importance row: quantize_row_q3_K_impl (make_qx_quants under qw sqrt(sigma2 +
 * x^2) per group, the scales fitted by make_qx_quants under the groups' weight sums) */
static ED_NOFMA void ed_q_q3_K_w(const float *x, const float *qw, blk_q3_K *y) {
    int8_t L[QKK], Ls[16];
    float w[16], sw[16], scales[16];
    const float sigma2 = ed_sigma2(x, QKK, 2);
    for (int j = 0; j < 16; j++) {
        ed_imp_weights(16, x + 16 * j, qw + 16 * j, sigma2, w);
        float sumw = 0;
        for (int l = 0; l < 16; l++) sumw += w[l];
        sw[j] = sumw;
        scales[j] = ed_make_qx1(16, 4, x + 16 * j, L + 16 * j, w);
    }
    const float d = ed_make_qx1(16, 32, scales, Ls, sw);
    ed_q3_store(x, Ls, d, L, y);
}

/* Q4_K and Q5_K's last steps: the 8 6-bit scale levels ls and min levels lm packed into
 * `packed` (12 bytes), d and dmin stored as f16, and the levels L of each group of 32 again
 * against the stored scale and min. */
static ED_NOFMA void ed_k4_store(const float *x, int nmax, const uint8_t *ls, const uint8_t *lm, float d,
                                 float dm, uint8_t *L, uint8_t *packed, ed_half *dd, ed_half *dmin) {
    memset(packed, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) { packed[j] = ls[j]; packed[j + 4] = lm[j]; }
        else {
            packed[j + 4] = (ls[j] & 0xF) | (uint8_t)((lm[j] & 0xF) << 4);
            packed[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            packed[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    *dd = ed_fp32_to_fp16(d);
    *dmin = ed_fp32_to_fp16(dm);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        ed_scale_min_k4(j, packed, &sc, &m);
        ed_requant_group(32, x + 32 * j, ed_fp16_to_fp32(*dd) * sc, ed_fp16_to_fp32(*dmin) * m, 0, nmax, L + 32 * j);
    }
}

/* Q4_K and Q5_K: 8 groups of 32 with 6-bit scales and mins. Without an importance row qw:
 * llama.cpp's reference (weights av_x + |x|, make_qkx2, scales and mins as multiples of their
 * maximum / 63); with one: quantize_row_q4_K_impl/q5_K_impl (weights qw sqrt(sigma2 + x^2),
 * make_qkx3 with 37 trial steps, scales and mins fitted by make_qp_quants; Q4_K does not cap
 * those levels at 63, Q5_K does). */
static ED_NOFMA void ed_q_k4_scales(const float *x, const float *qw, int nmax, uint8_t *L, uint8_t *packed,
                                    ed_half *dd, ed_half *dmin) {
    uint8_t Laux[32], ls[8], lm[8];
    float w[32], sw[8], mins[8], scales[8], max_scale = 0, max_min = 0;
    const float sigma2 = qw ? ed_sigma2(x, QKK, 2) : 0;
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        if (qw) {
            ed_imp_weights(32, xj, qw + 32 * j, sigma2, w);
            float sumw = 0;
            for (int l = 0; l < 32; l++) sumw += w[l];
            sw[j] = sumw;
            scales[j] = ed_make_qkx2(32, nmax, xj, w, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
            continue;
        }
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xj[l]);
        if (nmax == 15) scales[j] = ed_make_qkx2(32, nmax, xj, w, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20, 0);
        else scales[j] = ed_make_qkx2(32, nmax, xj, w, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (qw) {
        const float d = ed_make_qp(8, 63, scales, ls, sw), dm = ed_make_qp(8, 63, mins, lm, sw);
        if (nmax == 31) for (int j = 0; j < 8; j++) { ls[j] = ls[j] < 63 ? ls[j] : 63; lm[j] = lm[j] < 63 ? lm[j] : 63; }
        ed_k4_store(x, nmax, ls, lm, d, dm, L, packed, dd, dmin);
        return;
    }
    const float inv_s = max_scale > 0 ? 63.f / max_scale : 0.f, inv_m = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        const uint8_t a = (uint8_t)ed_nearest_int(inv_s * scales[j]), b = (uint8_t)ed_nearest_int(inv_m * mins[j]);
        ls[j] = a < 63 ? a : 63; lm[j] = b < 63 ? b : 63;
    }
    ed_k4_store(x, nmax, ls, lm, max_scale / 63.f, max_min / 63.f, L, packed, dd, dmin);
}

static void ed_q_q4_K_w(const float *x, const float *qw, blk_q4_K *y) {
    uint8_t L[QKK];
    ed_q_k4_scales(x, qw, 15, L, y->scales, &y->d, &y->dmin);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) y->qs[32 * j + l] = L[64 * j + l] | (uint8_t)(L[64 * j + l + 32] << 4);
}

static void ed_q_q5_K_w(const float *x, const float *qw, blk_q5_K *y) {
    uint8_t L[QKK];
    ed_q_k4_scales(x, qw, 31, L, y->scales, &y->d, &y->dmin);
    memset(y->qh, 0, 32);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QKK; n += 64) {
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) { l1 -= 16; y->qh[j] |= m1; }
            if (l2 > 15) { l2 -= 16; y->qh[j] |= m2; }
            y->qs[n / 2 + j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 <<= 2; m2 <<= 2;
    }
}

/* Q6_K: make_qx_quants per group of 16, under the importance row qw as it is (llama.cpp does
 * not multiply it by sqrt(sigma2 + x^2) here) or without one x^2 */
static ED_NOFMA void ed_q_q6_K_w(const float *x, const float *qw, blk_q6_K *y) {
    int8_t L[QKK];
    float scales[16];
    for (int ib = 0; ib < 16; ib++) scales[ib] = ed_make_qx1(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : NULL);
    const float max_scale = ed_abs_max_signed(scales, 16);
    if (fabsf(max_scale) < ED_GROUP_MAX_EPS) { memset(y, 0, sizeof *y); return; }
    const float iscale = -128.f / max_scale;
    y->d = ed_fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < 16; ib++) y->scales[ib] = (int8_t)ed_qmin(127, ed_nearest_int(iscale * scales[ib]));
    for (int j = 0; j < 16; j++)
        ed_requant_group(16, x + 16 * j, ed_fp16_to_fp32(y->d) * y->scales[j], 0.0f, -32, 31, (uint8_t *)L + 16 * j);
    uint8_t *ql = y->ql, *qh = y->qh;
    for (int j = 0; j < QKK; j += 128) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = q1 | (uint8_t)(q3 << 4);
            ql[l + 32] = q2 | (uint8_t)(q4 << 4);
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64; qh += 32;
    }
}

static void ed_q_q4_K(const float *x, blk_q4_K *y) { ed_q_q4_K_w(x, NULL, y); }
static void ed_q_q5_K(const float *x, blk_q5_K *y) { ed_q_q5_K_w(x, NULL, y); }
static void ed_q_q6_K(const float *x, blk_q6_K *y) { ed_q_q6_K_w(x, NULL, y); }

/* ----------------------------------------------------------------- table types ------- */
/* index of the table entry nearest x (ties to the upper one), llama.cpp's best_index_int8 */
static inline ED_NOFMA int ed_best_index_int8(const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) { const int mav = (ml + mu) / 2; if (x < val[mav]) mu = mav; else ml = mav; }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* IQ4_NL (nsub = 1) and IQ4_XS (nsub = 8 sub-blocks of 32): llama.cpp's
 * quantize_row_iq4_nl_impl with ntry = 7. Per sub-block, the scale maximising
 * (sum w q x)^2 / sum w q q over 15 trial scales around max / -127 (w = x^2, or with an
 * importance matrix qw * sqrt(sigma2 + x^2)); IQ4_XS then stores the sub-block scales as 6-bit
 * multiples of max_scale / -32 and requantizes against them. Writes d, the nibbles (16 per
 * 32) and, for IQ4_XS, the packed scales. */
static ED_NOFMA void ed_q_iq4(const float *x, const float *qw, int nsub, ed_half *dh, uint8_t *q4,
                              uint16_t *scales_h, uint8_t *scales_l) {
    const int8_t *values = ED_KV_IQ4NL;
    const int n = 32 * nsub, ntry = 7;
    float scales[QKK / 32], weight[32];
    uint8_t L[QKK];
    float sigma2 = 0;
    for (int j = 0; j < n; j++) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / n;
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nsub; ib++) {
        const float *xb = x + 32 * ib;
        if (qw) for (int j = 0; j < 32; j++) weight[j] = qw[32 * ib + j] * sqrtf(sigma2 + xb[j] * xb[j]);
        else for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) { const float ax = fabsf(xb[j]); if (ax > amax) { amax = ax; max = xb[j]; } }
        if (amax < ED_GROUP_MAX_EPS) { scales[ib] = 0; continue; }
        float d = -max / values[0], id = 1 / d, sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = values[ed_best_index_int8(values, id * xb[j])], w = weight[j];
            sumqx += w * q * xb[j]; sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float q = values[ed_best_index_int8(values, id * xb[j])], w = weight[j];
                sumqx += w * q * xb[j]; sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) { d = sumqx / sumq2; best = d * sumqx; }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) { amax_scale = fabsf(d); max_scale = d; }
    }
    if (nsub > 1) {
        const float d = -max_scale / 32, id = d ? 1 / d : 0.f;
        *dh = ed_fp32_to_fp16(d);
        *scales_h = 0;
        for (int ib = 0; ib < nsub; ib++) {
            int l = ed_qmax(-32, ed_qmin(31, ed_nearest_int(id * scales[ib])));
            const float dl = d * l, idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)ed_best_index_int8(values, idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(l & 0xF);
            else scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
            *scales_h |= (uint16_t)((l >> 4) << 2 * ib);
        }
    } else {
        *dh = ed_fp32_to_fp16(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)ed_best_index_int8(values, id * x[j]);
    }
    for (int i = 0; i < nsub; i++) ed_pack_nibbles(L + 32 * i, q4 + 16 * i);
}

static void ed_q_iq4_nl_w(const float *x, const float *qw, blk_iq4_nl *y) { ed_q_iq4(x, qw, 1, &y->d, y->qs, NULL, NULL); }
static void ed_q_iq4_xs_w(const float *x, const float *qw, blk_iq4_xs *y) {
    ed_q_iq4(x, qw, QKK / 32, &y->d, y->qs, &y->scales_h, y->scales_l);
}
static void ed_q_iq4_nl(const float *x, blk_iq4_nl *y) { ed_q_iq4_nl_w(x, NULL, y); }
static void ed_q_iq4_xs(const float *x, blk_iq4_xs *y) { ed_q_iq4_xs_w(x, NULL, y); }

/* MXFP4: llama.cpp's quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 (so the largest
 * e2m1 value, 6, covers amax), each weight the nearest table entry (the first on ties) */
static ED_NOFMA void ed_q_mxfp4(const float *x, blk_mxfp4 *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) if (amax < fabsf(x[j])) amax = fabsf(x[j]);
    const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
    const float d = ed_e8m0_half(e);
    uint8_t q[QK];
    y->e = e;
    for (int j = 0; j < QK; j++) {
        int best = 0;
        float best_err = fabsf(ED_KV_MXFP4[0] * d - x[j]);
        for (int i = 1; i < 16; i++) {
            const float err = fabsf(ED_KV_MXFP4[i] * d - x[j]);
            if (err < best_err) { best = i; best_err = err; }
        }
        q[j] = (uint8_t)best;
    }
    ed_pack_nibbles(q, y->qs);
}

static int ed_quantize_row(int type, const float *x, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    switch (type) {
#define ED_QCASE(N, ID, NM, T, BS, VEC, W, A) ED_IF_##W( \
    case ED_##N: for (int64_t i = 0; i < k / (BS); i++) ed_q_##NM(x + i * (BS), (T *)y + i); return 0;)
    ED_BLOCK_TYPES(ED_QCASE)
#undef ED_QCASE
    default: return -1;
    }
}

/* One row of k floats with the importance row qw (k values, llama-imatrix's, for this row's
 * matrix or expert) in, blocks out: llama.cpp's quantize_<type> with quant_weights. Q8_0 and
 * MXFP4 ignore qw there, and here. 0, or -1 if there is no such quantizer. */
static int ed_quantize_row_w(int type, const float *x, const float *qw, void *vy, int64_t k) {
    uint8_t *y = (uint8_t *)vy;
    float sigma2 = 0;
    switch (type) {
    case ED_Q4_0: case ED_Q4_1: case ED_Q5_0: case ED_Q5_1: sigma2 = ed_sigma2(x, k, 1); break;
    default: break;
    }
    switch (type) {
#define ED_QCASE32(T, name) \
    case T: for (int64_t i = 0; i < k / QK; i++) ed_q_##name##_w(x + i * QK, qw + i * QK, sigma2, (blk_##name *)y + i); return 0;
    ED_QCASE32(ED_Q4_0, q4_0) ED_QCASE32(ED_Q4_1, q4_1) ED_QCASE32(ED_Q5_0, q5_0) ED_QCASE32(ED_Q5_1, q5_1)
#undef ED_QCASE32
#define ED_QCASEW(T, name, bs) \
    case T: for (int64_t i = 0; i < k / (bs); i++) ed_q_##name##_w(x + i * (bs), qw + i * (bs), (blk_##name *)y + i); return 0;
    ED_QCASEW(ED_Q2_K, q2_K, QKK) ED_QCASEW(ED_Q3_K, q3_K, QKK) ED_QCASEW(ED_Q4_K, q4_K, QKK)
    ED_QCASEW(ED_Q5_K, q5_K, QKK) ED_QCASEW(ED_Q6_K, q6_K, QKK) ED_QCASEW(ED_IQ4_NL, iq4_nl, QK)
    ED_QCASEW(ED_IQ4_XS, iq4_xs, QKK)
#undef ED_QCASEW
    case ED_Q8_0: case ED_MXFP4: return ed_quantize_row(type, x, vy, k);
    default: return -1;
    }
}

#ifdef __clang__
#pragma float_control(pop)
#endif

#endif
