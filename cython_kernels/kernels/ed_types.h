/* Weight-type traits for the forward pass: the one list of types (ED_TYPES), block layouts
 * (llama.cpp's, as stored in GGUF), activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16) and one
 * dot product per weight type against its activation format. Generic C here; SIMD variants in
 * ed_simd.h are chosen once at start-up (ed_types_init). One const table per path binds each
 * type to its functions (ed_kernels), so the forward pass never branches on the quantization
 * type or the CPU.
 */
#ifndef EDGED_ED_TYPES_H
#define EDGED_ED_TYPES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The types, one list: every table of weight types and activation formats (the enum below,
 * ED_TRAITS, ED_ACT, ED_TYPE_LIST, the weight quantizers and dequantizers, each path's dot and
 * tile tables in ed_simd.h / ed_simd_x86.inc / ed_simd_neon.inc, kernels_check.c's list) is
 * generated from these rows; edged/format/gguf.py and quants.py are checked against
 * ED_TYPE_LIST (core.type_list(), tests/format/test_type_list.py). One row per type:
 *     X(NAME, id, name, T, block, vec, W, A)
 *   NAME   ED_NAME, and the type's name in ggml and Python (GGMLType.NAME)
 *   id     the ggml type id (the GGUF tensor-info type field)
 *   name   the suffix of its per-type code: ed_dot_name, ed_q_name, ed_dq_name, ed_quant_name,
 *          and each path's dot_name / tile_name
 *   T      the C type of one block (of one element for the float types)
 *   block  elements per block
 *   vec    the activation format a weight of this type is multiplied with (ED_vec)
 *   W      1: a weight type (a plain C dot here and a dot and tile on every path)
 *   A      1: an activation format (a plain C quantizer ed_quant_name here, ED_QUANT on a path)
 * Float rows first, then the quantized blocks (ED_BLOCK_TYPES: the weight quantizers and
 * dequantizers take its W rows); the order is the order of the tests' tables. */
#define ED_FLOAT_TYPES(X) \
    X(F32,    0,  f32,    float,      1,   F32,  1, 1) \
    X(F16,    1,  f16,    ed_half,    1,   F16,  1, 1) \
    X(BF16,   30, bf16,   uint16_t,   1,   BF16, 1, 1)
#define ED_BLOCK_TYPES(X) \
    X(Q4_0,   2,  q4_0,   blk_q4_0,   QK,  Q8_0, 1, 0) \
    X(Q4_1,   3,  q4_1,   blk_q4_1,   QK,  Q8_1, 1, 0) \
    X(Q5_0,   6,  q5_0,   blk_q5_0,   QK,  Q8_0, 1, 0) \
    X(Q5_1,   7,  q5_1,   blk_q5_1,   QK,  Q8_1, 1, 0) \
    X(Q8_0,   8,  q8_0,   blk_q8_0,   QK,  Q8_0, 1, 1) \
    X(Q2_K,   10, q2_K,   blk_q2_K,   QKK, Q8_K, 1, 0) \
    X(Q3_K,   11, q3_K,   blk_q3_K,   QKK, Q8_K, 1, 0) \
    X(Q4_K,   12, q4_K,   blk_q4_K,   QKK, Q8_K, 1, 0) \
    X(Q5_K,   13, q5_K,   blk_q5_K,   QKK, Q8_K, 1, 0) \
    X(Q6_K,   14, q6_K,   blk_q6_K,   QKK, Q8_K, 1, 0) \
    X(IQ4_NL, 20, iq4_nl, blk_iq4_nl, QK,  Q8_0, 1, 0) \
    X(IQ4_XS, 23, iq4_xs, blk_iq4_xs, QKK, Q8_K, 1, 0) \
    X(MXFP4,  39, mxfp4,  blk_mxfp4,  QK,  Q8_0, 1, 0) \
    X(Q8_1,   9,  q8_1,   blk_q8_1,   QK,  Q8_1, 0, 1) \
    X(Q8_K,   15, q8_K,   blk_q8_K,   QKK, Q8_K, 0, 1)
#define ED_TYPES(X) ED_FLOAT_TYPES(X) ED_BLOCK_TYPES(X)
/* ED_IF_W(...): the arguments where a row's flag W (or A) is 1, nothing where it is 0 */
#define ED_IF_1(...) __VA_ARGS__
#define ED_IF_0(...)

#define ED_TYPE_ENUM(N, ID, NM, T, BS, VEC, W, A) ED_##N = ID,
enum { ED_TYPES(ED_TYPE_ENUM) ED_NTYPES = 40 /* the tables' size: every id is below it */ };
#undef ED_TYPE_ENUM

enum { ED_PROF_MATMUL, ED_PROF_QUANT, ED_PROF_ATTN, ED_PROF_NORM, ED_PROF_ROPE, ED_PROF_ACT,
       ED_PROF_OUTPUT, ED_PROF_N };

#define QK 32
#define QKK 256

typedef uint16_t ed_half;

typedef struct { ed_half d; uint8_t qs[QK / 2]; } blk_q4_0;
typedef struct { ed_half d, m; uint8_t qs[QK / 2]; } blk_q4_1;
typedef struct { ed_half d; uint8_t qh[4]; uint8_t qs[QK / 2]; } blk_q5_0;
typedef struct { ed_half d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } blk_q5_1;
typedef struct { ed_half d; int8_t qs[QK]; } blk_q8_0;
typedef struct { ed_half d, s; int8_t qs[QK]; } blk_q8_1;
typedef struct { uint8_t scales[QKK / 16]; uint8_t qs[QKK / 4]; ed_half d, dmin; } blk_q2_K;
typedef struct { uint8_t hmask[QKK / 8]; uint8_t qs[QKK / 4]; uint8_t scales[12]; ed_half d; } blk_q3_K;
typedef struct { ed_half d, dmin; uint8_t scales[12]; uint8_t qs[QKK / 2]; } blk_q4_K;
typedef struct { ed_half d, dmin; uint8_t scales[12]; uint8_t qh[QKK / 8]; uint8_t qs[QKK / 2]; } blk_q5_K;
typedef struct { uint8_t ql[QKK / 2]; uint8_t qh[QKK / 4]; int8_t scales[QKK / 16]; ed_half d; } blk_q6_K;
typedef struct { float d; int8_t qs[QKK]; int16_t bsums[QKK / 16]; } blk_q8_K;
/* the non-linear 4-bit types: nibbles index a 16-entry int8 table (ED_KV_IQ4NL / ED_KV_MXFP4);
 * IQ4_XS's 6-bit sub-block scales (value - 32) are split into low nibbles (scales_l, two per
 * byte) and 2 high bits each (scales_h); MXFP4's scale is an E8M0 exponent byte */
typedef struct { ed_half d; uint8_t qs[QK / 2]; } blk_iq4_nl;
typedef struct { ed_half d; uint16_t scales_h; uint8_t scales_l[QKK / 64]; uint8_t qs[QKK / 2]; } blk_iq4_xs;
typedef struct { uint8_t e; uint8_t qs[QK / 2]; } blk_mxfp4;

/* llama.cpp's kvalues_iq4nl, and its kvalues_mxfp4: the e2m1 values doubled (the E8M0 scale
 * is then halved, ed_e8m0_half) */
static const int8_t ED_KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t ED_KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
/* the same plus 12 (0..24: unsigned, for u8 x s8 products with the offset taken off the sums) */
static const int8_t ED_KV_MXFP4_U12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* IQ4_XS sub-block ib's scale, 0..63 (the weight scale is d * (value - 32)) */
static inline int ed_iq4_xs_ls(const blk_iq4_xs *x, int ib) {
    return ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((x->scales_h >> 2 * ib) & 3) << 4);
}

/* 2^(e - 128): half the E8M0 scale 2^(e - 127), exact (e < 2: the float subnormals) */
static inline float ed_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f; memcpy(&f, &bits, 4); return f;
}

/* ---------------------------------------------------------------- f16 / bf16 ------------ */
static inline float ed_fp16_to_fp32(ed_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else {  /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000 | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f; memcpy(&f, &bits, 4); return f;
}

static inline ed_half ed_fp32_to_fp16(float f) {  /* round to nearest even */
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return (ed_half)(sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0));
    if (ax >= 0x477ff000) return (ed_half)(sign | 0x7c00);          /* overflow -> inf */
    if (ax < 0x38800000) {                                          /* subnormal / zero */
        if (ax < 0x33000000) return (ed_half)sign;
        /* value = m * 2^(e-150); in units of 2^-24 (the f16 subnormal step): m >> (126-e) */
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        int s = (int)(126 - e);
        uint32_t r = m >> s, rem = m & ((1u << s) - 1), mid = 1u << (s - 1);
        if (rem > mid || (rem == mid && (r & 1))) r++;
        return (ed_half)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000) >> 13);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (ed_half)(sign | r);
}

static inline float ed_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16; float f; memcpy(&f, &bits, 4); return f;
}

static inline uint16_t ed_fp32_to_bf16(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 64);  /* quiet nan */
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

#define H2F(h) ed_fp16_to_fp32(h)

/* ---------------------------------------------------------------- activation quantizers -- */
static void ed_quant_f32(const float *x, void *y, int k) { memcpy(y, x, sizeof(float) * k); }

static void ed_quant_f16(const float *x, void *vy, int k) {
    ed_half *y = (ed_half *)vy;
    for (int i = 0; i < k; i++) y[i] = ed_fp32_to_fp16(x[i]);
}

static void ed_quant_bf16(const float *x, void *vy, int k) {
    uint16_t *y = (uint16_t *)vy;
    for (int i = 0; i < k; i++) y[i] = ed_fp32_to_bf16(x[i]);
}

/* Q8_0 / Q8_1 activations as llama.cpp's x86 build quantizes them (quantize_row_q8_0/_1 with
 * AVX: 127 / amax as the multiplier, halves rounded to even), not as its reference quantizer
 * for weights (1 / d, halves away from zero): the two differ in the last bit of the multiplier
 * and at ties, and each differing byte moves a logit by up to ~0.1. */
static inline int8_t ed_q8_act_round(float v) { return (int8_t)lrintf(v); }  /* to even */

static void ed_quant_q8_0(const float *x, void *vy, int k) {
    blk_q8_0 *y = (blk_q8_0 *)vy;
    for (int i = 0; i < k / QK; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) { float v = fabsf(x[i * QK + j]); if (v > amax) amax = v; }
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = ed_fp32_to_fp16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = ed_q8_act_round(x[i * QK + j] * id);
    }
}

static void ed_quant_q8_1(const float *x, void *vy, int k) {
    blk_q8_1 *y = (blk_q8_1 *)vy;
    for (int i = 0; i < k / QK; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) { float v = fabsf(x[i * QK + j]); if (v > amax) amax = v; }
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = ed_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK; j++) { y[i].qs[j] = ed_q8_act_round(x[i * QK + j] * id); sum += y[i].qs[j]; }
        y[i].s = ed_fp32_to_fp16(sum * d);
    }
}

static inline int ed_nearest_int(float fval) {
    float val = fval + 12582912.f; int i; memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static void ed_quant_q8_K(const float *x, void *vy, int k) {
    blk_q8_K *y = (blk_q8_K *)vy;
    for (int i = 0; i < k / QKK; i++, x += QKK) {
        float max = 0, amax = 0;
        for (int j = 0; j < QKK; j++) { float ax = fabsf(x[j]); if (ax > amax) { amax = ax; max = x[j]; } }
        if (!amax) { y[i].d = 0; memset(y[i].qs, 0, QKK); memset(y[i].bsums, 0, sizeof y[i].bsums); continue; }
        const float iscale = -127.f / max;
        for (int j = 0; j < QKK; j++) { int v = ed_nearest_int(iscale * x[j]); y[i].qs[j] = (int8_t)(v < 127 ? v : 127); }
        for (int j = 0; j < QKK / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[j * 16 + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ---------------------------------------------------------------- dot products ---------- */
static float ed_dot_f32(int n, const void *vx, const void *vy) {
    const float *x = (const float *)vx, *y = (const float *)vy;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)(x[i] * y[i]);
    return (float)s;
}

static float ed_dot_f16(int n, const void *vx, const void *vy) {
    const ed_half *x = (const ed_half *)vx, *y = (const ed_half *)vy;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)(H2F(x[i]) * H2F(y[i]));
    return (float)s;
}

static float ed_dot_bf16(int n, const void *vx, const void *vy) {
    const uint16_t *x = (const uint16_t *)vx, *y = (const uint16_t *)vy;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)(ed_bf16_to_fp32(x[i]) * ed_bf16_to_fp32(y[i]));
    return (float)s;
}

/* ---------------------------------------------------------------- the canonical order --
 * Every path computes a quantized weight row . activation row in ONE float order
 * (docs/kernels.md, "Canonical summation order"): block by block in increasing order, the
 * block's exact integer sum(s), then a fixed short sequence of float operations into one
 * float accumulator per (row, column), starting from 0:
 *     acc = fmaf(dw * dy, (float)isum, acc)              every type
 *     acc = fmaf(mw, sy, acc)                             Q4_1 / Q5_1: min x activation sum
 *     acc = fmaf(-(dmin * dy), (float)msum, acc)          Q2_K / Q4_K / Q5_K: the mins
 * (K-quants: one step per 256 super-block, the sub-block scales combined in integers.) No lane
 * partials and no horizontal float sums, so a one-token dot, a tile (a few tokens of one
 * prompt or the next tokens of several sessions) and a packed panel (rows or columns as SIMD lanes) give the same bits, whatever the
 * batch, the chunking or the threads; the functions below are that order written plainly. */
#define ED_STEP(acc, dw, dy, isum) ((acc) = fmaf((dw) * (dy), (float)(isum), (acc)))
#define ED_STEP_MIN(acc, mw, sy) ((acc) = fmaf((mw), (sy), (acc)))
#define ED_STEP_NEG(acc, dm, dy, msum) ((acc) = fmaf(-((dm) * (dy)), (float)(msum), (acc)))

static float ed_dot_q4_0(int n, const void *vx, const void *vy) {
    const blk_q4_0 *x = vx; const blk_q8_0 *y = vy;
    float acc = 0;
    for (int ib = 0; ib < n / QK; ib++) {
        int s = 0;
        for (int j = 0; j < QK / 2; j++)
            s += ((x[ib].qs[j] & 0xF) - 8) * y[ib].qs[j] + ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK / 2];
        ED_STEP(acc, H2F(x[ib].d), H2F(y[ib].d), s);
    }
    return acc;
}

static float ed_dot_q4_1(int n, const void *vx, const void *vy) {
    const blk_q4_1 *x = vx; const blk_q8_1 *y = vy;
    float acc = 0;
    for (int ib = 0; ib < n / QK; ib++) {
        int s = 0;
        for (int j = 0; j < QK / 2; j++)
            s += (x[ib].qs[j] & 0xF) * y[ib].qs[j] + (x[ib].qs[j] >> 4) * y[ib].qs[j + QK / 2];
        ED_STEP(acc, H2F(x[ib].d), H2F(y[ib].d), s);
        ED_STEP_MIN(acc, H2F(x[ib].m), H2F(y[ib].s));
    }
    return acc;
}

static float ed_dot_q5_0(int n, const void *vx, const void *vy) {
    const blk_q5_0 *x = vx; const blk_q8_0 *y = vy;
    float acc = 0;
    for (int ib = 0; ib < n / QK; ib++) {
        uint32_t qh; memcpy(&qh, x[ib].qh, 4);
        int s = 0;
        for (int j = 0; j < QK / 2; j++) {
            int x0 = (int)((x[ib].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            int x1 = (int)((x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            s += x0 * y[ib].qs[j] + x1 * y[ib].qs[j + QK / 2];
        }
        ED_STEP(acc, H2F(x[ib].d), H2F(y[ib].d), s);
    }
    return acc;
}

static float ed_dot_q5_1(int n, const void *vx, const void *vy) {
    const blk_q5_1 *x = vx; const blk_q8_1 *y = vy;
    float acc = 0;
    for (int ib = 0; ib < n / QK; ib++) {
        uint32_t qh; memcpy(&qh, x[ib].qh, 4);
        int s = 0;
        for (int j = 0; j < QK / 2; j++) {
            int x0 = (x[ib].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int x1 = (x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            s += x0 * y[ib].qs[j] + x1 * y[ib].qs[j + QK / 2];
        }
        ED_STEP(acc, H2F(x[ib].d), H2F(y[ib].d), s);
        ED_STEP_MIN(acc, H2F(x[ib].m), H2F(y[ib].s));
    }
    return acc;
}

static float ed_dot_q8_0(int n, const void *vx, const void *vy) {
    const blk_q8_0 *x = vx; const blk_q8_0 *y = vy;
    float acc = 0;
    for (int ib = 0; ib < n / QK; ib++) {
        int s = 0;
        for (int j = 0; j < QK; j++) s += x[ib].qs[j] * y[ib].qs[j];
        ED_STEP(acc, H2F(x[ib].d), H2F(y[ib].d), s);
    }
    return acc;
}

/* Q2_K: 16 groups of 16, 4-bit scale (low) and min (high) each:
 * isum = sum scale_g * sum(q2 * q8), msum = sum min_g * bsum_g */
static float ed_dot_q2_K(int n, const void *vx, const void *vy) {
    const blk_q2_K *x = vx; const blk_q8_K *y = vy;
    float acc = 0;
    for (int i = 0; i < n / QKK; i++) {
        const uint8_t *q2 = x[i].qs, *sc = x[i].scales;
        const int8_t *q8 = y[i].qs;
        int msum = 0, isum = 0, is = 0;
        for (int j = 0; j < 16; j++) msum += y[i].bsums[j] * (sc[j] >> 4);
        for (int k = 0; k < QKK / 128; k++, q2 += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int h = 0; h < 2; h++, q8 += 16) {
                    int s = 0;
                    for (int l = 0; l < 16; l++) s += q8[l] * ((q2[16 * h + l] >> shift) & 3);
                    isum += (sc[is++] & 0xF) * s;
                }
        ED_STEP(acc, H2F(x[i].d), y[i].d, isum);
        ED_STEP_NEG(acc, H2F(x[i].dmin), y[i].d, msum);
    }
    return acc;
}

/* Q3_K's sixteen 6-bit scales (minus 32) */
static inline void ed_q3_scales(const uint8_t *s12, int8_t *sc) {
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t a[4];
    memcpy(a, s12, 12);
    const uint32_t tmp = a[2];
    a[2] = ((a[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    a[3] = ((a[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    a[0] = (a[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    a[1] = (a[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(sc, a, 16);
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)(sc[j] - 32);
}

/* Q3_K: 16 groups of 16, weights (2 bits) - 4 where the hmask bit is clear:
 * isum = sum scale_g * sum(w * q8) */
static float ed_dot_q3_K(int n, const void *vx, const void *vy) {
    const blk_q3_K *x = vx; const blk_q8_K *y = vy;
    float acc = 0;
    int8_t sc[16];
    for (int i = 0; i < n / QKK; i++) {
        const uint8_t *q3 = x[i].qs, *hm = x[i].hmask;
        const int8_t *q8 = y[i].qs;
        ed_q3_scales(x[i].scales, sc);
        int isum = 0, g = 0;
        uint8_t m = 1;
        for (int j = 0; j < QKK; j += 128, q3 += 32)
            for (int sh = 0; sh < 8; sh += 2, m <<= 1)
                for (int h = 0; h < 2; h++, q8 += 16) {
                    int s = 0;
                    for (int l = 16 * h; l < 16 * h + 16; l++)
                        s += q8[l - 16 * h] * (((q3[l] >> sh) & 3) - (hm[l] & m ? 0 : 4));
                    isum += sc[g++] * s;
                }
        ED_STEP(acc, H2F(x[i].d), y[i].d, isum);
    }
    return acc;
}

static inline void ed_k_scales(const uint8_t *s12, uint8_t *scales, uint8_t *mins) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t utmp[4];
    memcpy(utmp, s12, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
    memcpy(scales, &utmp[0], 8);
    memcpy(mins, &utmp[2], 8);
}

/* Q4_K / Q5_K: one super-block whose 256 weights (0..31, without the scales) are in a:
 * isum = sum scale_g * sum(a * q8) over 8 groups of 32, msum = sum min_g * bsum_g */
static inline void ed_dot_k_block(const int8_t *a, const uint8_t *s12, ed_half xd, ed_half xdmin,
                                  const blk_q8_K *y, float *acc) {
    uint8_t scales[8], mins[8];
    const int8_t *q8 = y->qs;
    ed_k_scales(s12, scales, mins);
    int msum = 0, isum = 0;
    for (int j = 0; j < QKK / 16; j++) msum += y->bsums[j] * mins[j / 2];
    for (int j = 0; j < QKK / 32; j++, q8 += 32, a += 32) {
        int s = 0;
        for (int l = 0; l < 32; l++) s += q8[l] * a[l];
        isum += scales[j] * s;
    }
    ED_STEP(*acc, H2F(xd), y->d, isum);
    ED_STEP_NEG(*acc, H2F(xdmin), y->d, msum);
}

static float ed_dot_q4_K(int n, const void *vx, const void *vy) {
    const blk_q4_K *x = vx; const blk_q8_K *y = vy;
    int8_t aux8[QKK]; float acc = 0;
    for (int i = 0; i < n / QKK; i++) {
        const uint8_t *q4 = x[i].qs;
        int8_t *a = aux8;
        for (int j = 0; j < QKK / 64; j++) {
            for (int l = 0; l < 32; l++) a[l] = (int8_t)(q4[l] & 0xF);
            a += 32;
            for (int l = 0; l < 32; l++) a[l] = (int8_t)(q4[l] >> 4);
            a += 32; q4 += 32;
        }
        ed_dot_k_block(aux8, x[i].scales, x[i].d, x[i].dmin, &y[i], &acc);
    }
    return acc;
}

static float ed_dot_q5_K(int n, const void *vx, const void *vy) {
    const blk_q5_K *x = vx; const blk_q8_K *y = vy;
    int8_t aux8[QKK]; float acc = 0;
    for (int i = 0; i < n / QKK; i++) {
        const uint8_t *q4 = x[i].qs, *hm = x[i].qh;
        int8_t *a = aux8; uint8_t m = 1;
        for (int j = 0; j < QKK / 64; j++) {
            for (int l = 0; l < 32; l++) a[l] = (int8_t)((q4[l] & 0xF) + (hm[l] & m ? 16 : 0));
            a += 32; m <<= 1;
            for (int l = 0; l < 32; l++) a[l] = (int8_t)((q4[l] >> 4) + (hm[l] & m ? 16 : 0));
            a += 32; m <<= 1; q4 += 32;
        }
        ed_dot_k_block(aux8, x[i].scales, x[i].d, x[i].dmin, &y[i], &acc);
    }
    return acc;
}

/* Q6_K: 16 groups of 16, weights (6 bits) - 32, signed 8-bit scales:
 * isum = sum scale_g * sum(w * q8) */
static float ed_dot_q6_K(int n, const void *vx, const void *vy) {
    const blk_q6_K *x = vx; const blk_q8_K *y = vy;
    int8_t aux8[QKK]; float acc = 0;
    for (int i = 0; i < n / QKK; i++) {
        const uint8_t *q4 = x[i].ql, *qh = x[i].qh; const int8_t *q8 = y[i].qs;
        int8_t *a = aux8;
        for (int j = 0; j < QKK; j += 128) {
            for (int l = 0; l < 32; l++) {
                a[l + 0] = (int8_t)((q4[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                a[l + 32] = (int8_t)((q4[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                a[l + 64] = (int8_t)((q4[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                a[l + 96] = (int8_t)((q4[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            }
            a += 128; q4 += 64; qh += 32;
        }
        int isum = 0;
        for (int j = 0; j < QKK / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q8[16 * j + l] * aux8[16 * j + l];
            isum += x[i].scales[j] * s;
        }
        ED_STEP(acc, H2F(x[i].d), y[i].d, isum);
    }
    return acc;
}

/* The table types: every 32 weights are 16 bytes of nibbles (low nibbles: weights 0..15, high:
 * 16..31) indexing a 16-entry table. In the canonical order: the exact integer block sum, then
 * one ED_STEP per block (IQ4_NL: d_x, MXFP4: 2^(e-128), times d_y), or for IQ4_XS one per
 * super-block with the sub-block scales inside the integer sum (as the K-quants). */
static inline int ed_tbl_sum32(const int8_t *kv, const uint8_t *qs, const int8_t *q8) {
    int s = 0;
    for (int j = 0; j < QK / 2; j++) s += kv[qs[j] & 0xF] * q8[j] + kv[qs[j] >> 4] * q8[j + QK / 2];
    return s;
}

static float ed_dot_iq4_nl(int n, const void *vx, const void *vy) {
    const blk_iq4_nl *x = vx; const blk_q8_0 *y = vy;
    float acc = 0.0f;
    for (int ib = 0; ib < n / QK; ib++)
        ED_STEP(acc, H2F(x[ib].d), H2F(y[ib].d), ed_tbl_sum32(ED_KV_IQ4NL, x[ib].qs, y[ib].qs));
    return acc;
}

static float ed_dot_mxfp4(int n, const void *vx, const void *vy) {
    const blk_mxfp4 *x = vx; const blk_q8_0 *y = vy;
    float acc = 0.0f;
    for (int ib = 0; ib < n / QK; ib++)
        ED_STEP(acc, ed_e8m0_half(x[ib].e), H2F(y[ib].d), ed_tbl_sum32(ED_KV_MXFP4, x[ib].qs, y[ib].qs));
    return acc;
}

/* IQ4_XS: sum over the 8 sub-blocks of (ls - 32) * their table sums, exact in int32 */
static inline int ed_iq4_xs_isum(const blk_iq4_xs *x, const int8_t *q8) {
    int isum = 0;
    for (int ib = 0; ib < QKK / 32; ib++)
        isum += (ed_iq4_xs_ls(x, ib) - 32) * ed_tbl_sum32(ED_KV_IQ4NL, x->qs + 16 * ib, q8 + 32 * ib);
    return isum;
}

static float ed_dot_iq4_xs(int n, const void *vx, const void *vy) {
    const blk_iq4_xs *x = vx; const blk_q8_K *y = vy;
    float acc = 0.0f;
    for (int i = 0; i < n / QKK; i++) ED_STEP(acc, H2F(x[i].d), y[i].d, ed_iq4_xs_isum(&x[i], y[i].qs));
    return acc;
}

/* ---------------------------------------------------------------- the tables ------------ */
typedef float (*ed_dot_fn)(int n, const void *w, const void *xq);
typedef void (*ed_quant_fn)(const float *x, void *y, int k);

/* What a weight type is, on every path (llama.cpp's type_traits): its block, its bytes per
 * block, the activation format its dot takes, and the plain C dot above (the slow, obvious
 * twin every path is checked against). The path's own dot is ED_DOT[type] (ed_kernels). */
typedef struct {
    int block;            /* elements per block of the weight type */
    int type_size;        /* bytes per block */
    int vec_type;         /* activation format */
    ed_dot_fn ref;        /* plain C dot (ed_types.h) */
} ed_traits;

/* An activation format: its block, bytes per block and plain C quantizer; the path's own
 * (the same bytes) is ED_QUANT[format]. */
typedef struct { int block, type_size; ed_quant_fn ref; } ed_act_traits;

#define ED_TRAITS_ROW(N, ID, NM, T, BS, VEC, W, A) \
    ED_IF_##W([ED_##N] = {.block = BS, .type_size = sizeof(T), .vec_type = ED_##VEC, .ref = ed_dot_##NM},)
static const ed_traits ED_TRAITS[ED_NTYPES] = {ED_TYPES(ED_TRAITS_ROW)};
#undef ED_TRAITS_ROW
#define ED_ACT_ROW(N, ID, NM, T, BS, VEC, W, A) \
    ED_IF_##A([ED_##N] = {.block = BS, .type_size = sizeof(T), .ref = ed_quant_##NM},)
static const ed_act_traits ED_ACT[ED_NTYPES] = {ED_TYPES(ED_ACT_ROW)};
#undef ED_ACT_ROW

/* The list itself, for the tests and the Python side (core.type_list()): the rows above in
 * order, ended by a NULL name */
typedef struct { int id; const char *name; int block, type_size, vec_type, weight, act; } ed_type_row;
#define ED_LIST_ROW(N, ID, NM, T, BS, VEC, W, A) {ID, #N, BS, sizeof(T), ED_##VEC, W, A},
static const ed_type_row ED_TYPE_LIST[] = {ED_TYPES(ED_LIST_ROW) {0, NULL, 0, 0, 0, 0, 0}};
#undef ED_LIST_ROW

/* Checked here: ids below ED_NTYPES, no id twice (the sum of the rows' bits is their union
 * only if no bit is set twice), and each weight type's activation format is one */
#define ED_ID_BIT(N, ID, NM, T, BS, VEC, W, A) + (1ull << ID)
#define ED_ID_OR(N, ID, NM, T, BS, VEC, W, A) | (1ull << ID)
#define ED_ACT_FLAG(N, ID, NM, T, BS, VEC, W, A) ED_IS_ACT_##N = A,
enum { ED_TYPES(ED_ACT_FLAG) };
_Static_assert(ED_NTYPES <= 64 && (0 ED_TYPES(ED_ID_OR)) < (1ull << ED_NTYPES), "a type id is not below ED_NTYPES");
_Static_assert((0 ED_TYPES(ED_ID_BIT)) == (0 ED_TYPES(ED_ID_OR)), "two rows of ED_TYPES have one id");
#define ED_VEC_CHECK(N, ID, NM, T, BS, VEC, W, A) \
    _Static_assert(!W || ED_IS_ACT_##VEC, #N "'s activation format " #VEC " has A 0");
ED_TYPES(ED_VEC_CHECK)
#undef ED_VEC_CHECK
#undef ED_ID_BIT
#undef ED_ID_OR
#undef ED_ACT_FLAG

/* Tiles: out[c * ldo] = dot(w_row, xq + c * xs) for c < nc <= ED_MAX_COLS, the weight row
 * decoded once for all columns. Row kernels: out[c * ldo + r] = W[r] . xq[c] for
 * r < nr <= ED_ROWS_N (or the path's rows_n), c < nc <= ED_MAX_COLS (rows as SIMD lanes; the
 * same bits as the dot). */
#define ED_MAX_COLS 4
#define ED_ROWS_N 8
typedef void (*ed_tile_fn)(int k, const void *w, const void *xq, size_t xs, int nc, float *out, size_t ldo);
typedef void (*ed_rows_fn)(int k, const void *w, size_t wstride, int nr, const void *xq, size_t xs, int nc,
                            float *out, size_t ldo);
/* y[i] += a * x[i] over an F16 row (attention's V accumulation) */
typedef void (*ed_axpy_f16_fn)(int n, float a, const ed_half *x, float *y);
/* attention over the F16 KV cache for a block of query rows (ed_simd.h) */
/* one query row of a block: keys lo..hi; sink: one more logit in its softmax that adds no
   value (gpt-oss's attention sinks), -INFINITY for none */
typedef struct { const float *q; float *o; int lo, hi; float sink; } ed_attn_row;
typedef void (*ed_attn_fn)(int nr, const ed_attn_row *rw, const ed_half *k, const ed_half *v,
                           size_t ld, int hd, float scale, float *ws);
struct ed_gemm_path;  /* the packed-panel kernel of a path (ed_gemm.h) */
/* llama.cpp's float details of attention and the activations in a path's instructions
 * (ed_parity.h: the same bits as its portable C); NULL: that portable C */
typedef struct {
    float (*dot_f16)(int n, const ed_half *x, const ed_half *y);  /* attention's q.k, one row */
    void (*expf_sub)(int n, const float *x, float mx, float *y);            /* the softmax's exp */
    void (*f16_row)(int n, const float *x, ed_half *y);                     /* rounding to F16 */
    void (*silu_mul)(int n, float *g, const float *u);                      /* SwiGLU */
    void (*round_scale)(int n, float *x, float s);                          /* the F16 softmax row */
    float (*dot_q8_0)(int n, const void *w, const void *y);                 /* an encoder's Q8_0 product */
    void (*tile_q8_0)(int n, const uint8_t *w, size_t ws, const uint8_t *y, size_t ys,
                      float *out, size_t ldo);                          /* 4 rows x 2 of them */
    void (*strip_q8_0)(int nb, const uint8_t *strip, const uint8_t *a, size_t as, const float *dy,
                       size_t ds, int nc, float *out, size_t ldo, int nr);  /* 16 rows as lanes */
} ed_pm_fns;
struct ed_sample_fns;  /* the sampler's passes over the vocabulary (ed_sample.h) */

/* A kernel path: every function the forward pass calls that depends on the instruction set,
 * as one const table per path (ed_simd.h defines them, ed_types_init picks one). Per weight
 * type: the one-token dot, the tile (up to ED_MAX_COLS tokens: of one prompt, or the next
 * tokens of several sessions; every column equal to the one-token path bit for bit, the
 * canonical order above) and the row kernel (ED_ROWS_N weight rows x up to ED_MAX_COLS
 * tokens; optional). NULL tile: repeated dots. Beside the weight kernels: attention, the
 * float details the forward pass mirrors from llama.cpp, and the sampler's vocabulary passes. */
typedef struct {
    const char *family;              /* what EDGED_KERNELS names: generic, avx2, avx512, neon */
    const char *name;                /* the variant: "avx2+vnni", "neon+dotprod", ... */
    unsigned need;                   /* ED_CPU_* features (ed_simd.h) the CPU must have */
    const ed_dot_fn *dot;            /* [weight type] */
    const ed_quant_fn *quant;        /* [activation format] */
    const ed_tile_fn *tile;          /* [weight type] */
    const ed_rows_fn *rows;          /* [weight type] */
    const struct ed_gemm_path *gemm; /* packed panels for prompt batches */
    ed_axpy_f16_fn axpy_f16;
    ed_attn_fn attn;
    int rows_n;                      /* rows per row-kernel call (0: ED_ROWS_N) */
    /* [weight type] row kernels over weights repacked at load in the R4 layout (ed_repack.h);
     * the types listed here are repacked on this path (NULL: none, the mapped layout) */
    const ed_rows_fn *rows_r4;
    ed_pm_fns pm;                    /* llama.cpp's float details (ed_parity.h) */
    const struct ed_sample_fns *sample;  /* the sampler's passes (ed_sample.h) */
} ed_kernels;

/* The path in use: chosen by ed_types_init (ed_simd.h, which defines it: the generic path
 * until then). The names below read it; they are the only way the engine reaches a
 * path-specific function. */
static const ed_kernels *ed_kern;
#define ED_DOT (ed_kern->dot)
#define ED_QUANT (ed_kern->quant)
#define ED_TILE (ed_kern->tile)
#define ED_ROWS (ed_kern->rows)
#define ED_PATH (ed_kern->family)
#define ed_axpy_f16 (ed_kern->axpy_f16)
#define ed_attn (ed_kern->attn)
#define ED_PM (&ed_kern->pm)

/* F16 bits -> float for every half (the exact conversion), for kernels that would rather load
 * a float than convert; filled once by ed_types_init */
static float ED_H2F_TABLE[65536];

/* bytes of one activation row of k elements in the format a weight of `type` needs */
static size_t ed_act_row_bytes(int type, int64_t k) {
    const int vt = ED_TRAITS[type].vec_type;
    return (size_t)(k / ED_ACT[vt].block) * ED_ACT[vt].type_size;
}

#endif
