/* Dequantization of weight rows (embedding lookups, debugging): the compiled twin of
 * edged/quants.py's dequantize, with the same float operations in the same order (so the same
 * bits as the PyPI gguf package's dequantize, which the tests check).
 *
 *   int ed_dequantize_row(int type, const void *x, float *y, int64_t k)  0, or -1 (no type)
 */
#ifndef EDGED_ED_DEQUANT_H
#define EDGED_ED_DEQUANT_H

#include <stdint.h>
#include <string.h>
#include "ed_types.h"

/* No contraction into FMA: gcc takes the attribute, clang (the wheels' zig cc) ignores it and
 * takes the pragma, which holds to the end of this header. */
#define ED_DQ __attribute__((optimize("fp-contract=off")))
#ifdef __clang__
#pragma float_control(push)
#pragma clang fp contract(off)
#endif

static ED_DQ void ed_dq_q4_0(const blk_q4_0 *x, float *y) {
    const float d = H2F(x->d);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((x->qs[j] & 0xF) - 8);
        y[j + QK / 2] = d * (float)((x->qs[j] >> 4) - 8);
    }
}

static ED_DQ void ed_dq_q4_1(const blk_q4_1 *x, float *y) {
    const float d = H2F(x->d), m = H2F(x->m);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)(x->qs[j] & 0xF) + m;
        y[j + QK / 2] = d * (float)(x->qs[j] >> 4) + m;
    }
}

static ED_DQ void ed_dq_q5_0(const blk_q5_0 *x, float *y) {
    const float d = H2F(x->d);
    uint32_t qh; memcpy(&qh, x->qh, 4);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((int)((x->qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
        y[j + QK / 2] = d * (float)((int)((x->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
}

static ED_DQ void ed_dq_q5_1(const blk_q5_1 *x, float *y) {
    const float d = H2F(x->d), m = H2F(x->m);
    uint32_t qh; memcpy(&qh, x->qh, 4);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((x->qs[j] & 0xF) | (((qh >> j) & 1) << 4)) + m;
        y[j + QK / 2] = d * (float)((x->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
    }
}

static ED_DQ void ed_dq_q8_0(const blk_q8_0 *x, float *y) {
    const float d = H2F(x->d);
    for (int j = 0; j < QK; j++) y[j] = (float)x->qs[j] * d;
}

static ED_DQ void ed_dq_q2_K(const blk_q2_K *x, float *y) {
    const float d = H2F(x->d), dmin = H2F(x->dmin);
    for (int e = 0; e < QKK; e++) {
        const int half = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32;
        const uint8_t sc = x->scales[e / 16];
        const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
        y[e] = dl * (float)((x->qs[32 * half + l] >> shift) & 3) - ml;
    }
}

static ED_DQ void ed_dq_q3_K(const blk_q3_K *x, float *y) {
    const float d = H2F(x->d);
    int8_t sc[16];
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (x->scales[j] & 0xF) : (x->scales[j - 8] >> 4);
        const int hi = (x->scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
    for (int e = 0; e < QKK; e++) {
        const int half = e / 128, m = e / 32, shift = 2 * ((e % 128) / 32), l = e % 32;
        const int q = ((x->qs[32 * half + l] >> shift) & 3) - ((x->hmask[l] >> m) & 1 ? 0 : 4);
        y[e] = (d * (float)sc[e / 16]) * (float)q;
    }
}

static ED_DQ void ed_dq_k4(const uint8_t *s12, float d, float dmin, const uint8_t *qs,
                           const uint8_t *qh, float *y) {
    uint8_t sc[8], mn[8];
    ed_k_scales(s12, sc, mn);
    for (int e = 0; e < QKK; e++) {
        const int g = e / 32, chunk = e / 64, l = e % 32;
        int q = g % 2 ? qs[32 * chunk + l] >> 4 : qs[32 * chunk + l] & 0xF;
        if (qh) q |= ((qh[l] >> g) & 1) << 4;
        y[e] = (d * (float)sc[g]) * (float)q - dmin * (float)mn[g];
    }
}

static ED_DQ void ed_dq_q4_K(const blk_q4_K *x, float *y) { ed_dq_k4(x->scales, H2F(x->d), H2F(x->dmin), x->qs, NULL, y); }
static ED_DQ void ed_dq_q5_K(const blk_q5_K *x, float *y) { ed_dq_k4(x->scales, H2F(x->d), H2F(x->dmin), x->qs, x->qh, y); }

static ED_DQ void ed_dq_q6_K(const blk_q6_K *x, float *y) {
    const float d = H2F(x->d);
    for (int e = 0; e < QKK; e++) {
        const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
        const uint8_t lb = x->ql[64 * half + 32 * (quarter & 1) + l];
        const int low = quarter < 2 ? lb & 0xF : lb >> 4;
        const int high = (x->qh[32 * half + l] >> (2 * quarter)) & 3;
        y[e] = (d * (float)x->scales[e / 16]) * (float)((low | (high << 4)) - 32);
    }
}

static ED_DQ void ed_dq_tbl32(const int8_t *kv, float d, const uint8_t *qs, float *y) {
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)kv[qs[j] & 0xF];
        y[j + QK / 2] = d * (float)kv[qs[j] >> 4];
    }
}

static ED_DQ void ed_dq_iq4_nl(const blk_iq4_nl *x, float *y) { ed_dq_tbl32(ED_KV_IQ4NL, H2F(x->d), x->qs, y); }
static ED_DQ void ed_dq_mxfp4(const blk_mxfp4 *x, float *y) { ed_dq_tbl32(ED_KV_MXFP4, ed_e8m0_half(x->e), x->qs, y); }

static ED_DQ void ed_dq_iq4_xs(const blk_iq4_xs *x, float *y) {
    const float d = H2F(x->d);
    for (int ib = 0; ib < QKK / 32; ib++)
        ed_dq_tbl32(ED_KV_IQ4NL, d * (float)(ed_iq4_xs_ls(x, ib) - 32), x->qs + 16 * ib, y + 32 * ib);
}

static int ed_dequantize_row(int type, const void *vx, float *y, int64_t k) {
    const uint8_t *x = (const uint8_t *)vx;
    switch (type) {
    case ED_F32: memcpy(y, x, (size_t)k * 4); return 0;
    case ED_F16: for (int64_t i = 0; i < k; i++) y[i] = H2F(((const ed_half *)x)[i]); return 0;
    case ED_BF16: for (int64_t i = 0; i < k; i++) y[i] = ed_bf16_to_fp32(((const uint16_t *)x)[i]); return 0;
#define ED_DQCASE(N, ID, NM, T, BS, VEC, W, A) ED_IF_##W( \
    case ED_##N: for (int64_t i = 0; i < k / (BS); i++) ed_dq_##NM((const T *)x + i, y + i * (BS)); return 0;)
    ED_BLOCK_TYPES(ED_DQCASE)
#undef ED_DQCASE
    default: return -1;
    }
}

#ifdef __clang__
#pragma float_control(pop)
#endif

#endif
