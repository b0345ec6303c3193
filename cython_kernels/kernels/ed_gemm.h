/* Packed matrix-matrix products for prompt batches (included by ed_simd.h).
 *
 * A tile of one weight row against a few tokens (ED_TILE) ends every block in a horizontal
 * sum and a scalar scale. For a batch of many tokens edged instead unpacks a panel of
 * ED_PANEL (16) weight rows into a scratch buffer, once per call, in an interleaved layout:
 * for each group of G weights, G/4 vectors of 64 bytes, vector q holding weights 4q..4q+3 of
 * all 16 rows (row r in 32-bit lane r). One u8 x s8 dot-product instruction against 4
 * activation bytes broadcast to every lane then adds 4 products to each row's lane, so a
 * panel's 16 outputs for one token come out in one register with no horizontal sums, and the
 * per-block scales are applied 16 rows at a time. The panel is reused for every token of
 * the batch, so unpacking costs little against the products.
 *
 * The panels compute the canonical order of every path (ed_types.h, ED_STEP), with rows as
 * lanes: a group g is G consecutive weights u - off (u unsigned in the panel, off a per-type
 * integer; offset types may be stored lifted to off = 128 where the kernel has no i16 limit).
 * Per group the integer sum  sum u*q - off * sum q  is exact. The 32-block types (a group is
 * a block) then take, per group and token, the block's steps with A = the block's d and C =
 * its min m (Q4_1, Q5_1):  acc = fma(A * dy, isum, acc) [acc = fma(C, dy * sum q, acc)].
 * The K-quants (a group is a sub-block) combine the groups of a super-block in integers,
 * isum = sum scale_g * (group sum), msum = sum min_g * sum q_g, and take the super-block's
 * steps with its d and dmin:  acc = fma(d * dy, isum, acc) [acc = fma(-(dmin * dy), msum, acc)].
 * The x86 kernels form the term that multiplies the activation group sums once per
 * super-block, T = sum w_g * sum q_g (w: the mins, or the scales of an offset type), by i16
 * pair products of the panel's ED_GEMM_SB_PAIRS against ed_ginfo.qpair: msum = T, or
 * isum = sum sc_g * (raw group sum) - off * T; the same exact integers.
 * The activation side (per group: dy, 128 * sum q, the stored d * sum q of Q8_1) does not
 * depend on the weight type and is computed once per batch, when the activations are
 * quantized.
 *
 *   ed_gemm_ok(type)            1 when the selected path packs `type`
 *   ed_gemm_info_len(K)         ed_ginfo entries per activation row of K
 *   ed_gemm_info(vt, K, xq, info)   one quantized activation row's group info
 *   ed_gemm_scratch(K)          bytes of one thread's scratch for weight rows of K
 *   ed_gemm_dy_r4(K, xq, t, dy)  token t's Q8_0 block scales as floats, for a path's own R4 panels
 *   ed_gemm_rows(type, K, w, row_bytes, nr, xq, xs, info, is, n, out, ldo, scratch)
 *                               out[c*ldo + r] = W[r] . xq[c] for r < nr, c < n; token c's
 *                               info at info + c*is
 *   ed_gemm_rows_layout(type, layout, K, w, row_bytes, nr, xq, xs, info, is, dy, n, ...)
 *                               the same for W in a repacked layout (ed_repack.h); dy: the
 *                               tokens' ed_gemm_dy_r4 when ed_gemm_reads_dy(type, layout), else unused
 */
#ifndef EDGED_ED_GEMM_H
#define EDGED_ED_GEMM_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"
#include "ed_repack.h"

#ifndef ED_ALIGN
#define ED_ALIGN(n) (((n) + 63) & ~(size_t)63)
#endif

#define ED_PANEL 16
/* Below this many tokens the row tiles (ED_TILE) are used: unpacking every weight into panels
 * is a fixed cost per product that fewer tokens do not repay. 0 (the default): the selected
 * path's own threshold (ed_gemm_path.min_cols, measured: BENCHMARKS.md "Packed panels: from
 * how many tokens"); tests set one with gemm_min_cols(). */
static int ED_GEMM_MIN_COLS = 0;

/* per token and group: the activation scale dy, 128 * sum q (for offset types), dy * sum q;
 * qpair, for an even group g: sum q of groups g and g + 1 as two int16 (low: g), so one
 * i16 pair-product instruction adds both groups' min or offset terms of a K-quant */
typedef struct { float dy; int32_t yoff; float dys; int32_t qpair; } ed_ginfo;

/* unpack one weight row of K into u (K bytes) and A, C (K / G floats each) */
typedef void (*ed_unpack_fn)(const void *row, int K, uint8_t *u, float *A, float *C);
/* the same, with `lift` added to every u (128 - off, or 128 for a wide type's signed panel:
 * ed_gemm_pack): the path's fast versions (ED_GEMM_UNPACK) */
typedef void (*ed_unpack_lift_fn)(const void *row, int K, uint8_t *u, float *A, float *C, uint8_t lift);
/* the G rows of an R4 group (ed_repack.h) unpacked as a path's ed_unpack_lift_fn unpacks each
 * (row i at u + i * K, its A at A + i * (K / 32)); for the 32-block types, whose C is 0 */
typedef void (*ed_unpack_r4_fn)(const uint8_t *group, int K, uint8_t *u, float *A, uint8_t lift);

/* G weights per group; the offset; the unpacker; groups per super-block (K-quants and IQ4_XS,
 * whose groups are combined in integers) or 0 (32-block types); wide: u spans more than
 * 0..127, so u8 x s8 pairs overflow the i16 sums of non-VNNI kernels */
typedef struct { int G, off; ed_unpack_fn unpack; int gps, wide; } ed_gemm_traits;

static void ed_unpack_q4_0(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q4_0 *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        for (int j = 0; j < QK / 2; j++) { u[j] = x[b].qs[j] & 0xF; u[j + QK / 2] = x[b].qs[j] >> 4; }
        A[b] = H2F(x[b].d); C[b] = 0.0f;
    }
}

static void ed_unpack_q4_1(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q4_1 *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        for (int j = 0; j < QK / 2; j++) { u[j] = x[b].qs[j] & 0xF; u[j + QK / 2] = x[b].qs[j] >> 4; }
        A[b] = H2F(x[b].d); C[b] = H2F(x[b].m);
    }
}

static void ed_unpack_q5_0(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q5_0 *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        uint32_t qh; memcpy(&qh, x[b].qh, 4);
        for (int j = 0; j < QK / 2; j++) {
            u[j] = (uint8_t)((x[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4));
            u[j + QK / 2] = (uint8_t)((x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        A[b] = H2F(x[b].d); C[b] = 0.0f;
    }
}

static void ed_unpack_q5_1(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q5_1 *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        uint32_t qh; memcpy(&qh, x[b].qh, 4);
        for (int j = 0; j < QK / 2; j++) {
            u[j] = (uint8_t)((x[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4));
            u[j + QK / 2] = (uint8_t)((x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        A[b] = H2F(x[b].d); C[b] = H2F(x[b].m);
    }
}

static void ed_unpack_q8_0(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q8_0 *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        for (int j = 0; j < QK; j++) u[j] = (uint8_t)(x[b].qs[j] + 128);
        A[b] = H2F(x[b].d); C[b] = 0.0f;
    }
}

/* K-quants with 8 groups of 32: element order of the dequantizer (64 per pair of groups) */
static void ed_unpack_q4_K(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q4_K *x = vx;
    uint8_t sc[8], mn[8];
    for (int i = 0; i < K / QKK; i++, u += QKK, A += 8, C += 8) {
        ed_k_scales(x[i].scales, sc, mn);
        const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = x[i].qs + 32 * j;
            for (int l = 0; l < 32; l++) { u[64 * j + l] = q[l] & 0xF; u[64 * j + 32 + l] = q[l] >> 4; }
        }
        for (int j = 0; j < 8; j++) { A[j] = d * sc[j]; C[j] = -dmin * mn[j]; }
    }
}

static void ed_unpack_q5_K(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q5_K *x = vx;
    uint8_t sc[8], mn[8];
    for (int i = 0; i < K / QKK; i++, u += QKK, A += 8, C += 8) {
        ed_k_scales(x[i].scales, sc, mn);
        const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = x[i].qs + 32 * j, *h = x[i].qh;
            const int b0 = 2 * j, b1 = 2 * j + 1;
            for (int l = 0; l < 32; l++) {
                u[64 * j + l] = (uint8_t)((q[l] & 0xF) | (((h[l] >> b0) & 1) << 4));
                u[64 * j + 32 + l] = (uint8_t)((q[l] >> 4) | (((h[l] >> b1) & 1) << 4));
            }
        }
        for (int j = 0; j < 8; j++) { A[j] = d * sc[j]; C[j] = -dmin * mn[j]; }
    }
}

/* K-quants with 16 groups of 16 */
static void ed_unpack_q6_K(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q6_K *x = vx;
    for (int i = 0; i < K / QKK; i++, u += QKK, A += 16, C += 16) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            uint8_t *o = u + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (uint8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
                o[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                o[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        const float d = H2F(x[i].d);
        for (int j = 0; j < 16; j++) { A[j] = d * x[i].scales[j]; C[j] = 0.0f; }
    }
}

static void ed_unpack_q3_K(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q3_K *x = vx;
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    for (int i = 0; i < K / QKK; i++, u += QKK, A += 16, C += 16) {
        const uint8_t *q3 = x[i].qs, *hm = x[i].hmask;
        uint8_t *o = u, m = 1;
        for (int j = 0; j < QKK; j += 128, q3 += 32)
            for (int sh = 0; sh < 8; sh += 2, o += 32, m <<= 1)
                for (int l = 0; l < 32; l++) o[l] = (uint8_t)(((q3[l] >> sh) & 3) + (hm[l] & m ? 4 : 0));
        uint32_t a[4];
        memcpy(a, x[i].scales, 12);
        const uint32_t tmp = a[2];
        a[2] = ((a[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        a[3] = ((a[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        a[0] = (a[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
        a[1] = (a[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        const int8_t *sc = (const int8_t *)a;
        const float d = H2F(x[i].d);
        for (int j = 0; j < 16; j++) { A[j] = d * (sc[j] - 32); C[j] = 0.0f; }
    }
}

static void ed_unpack_q2_K(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_q2_K *x = vx;
    for (int i = 0; i < K / QKK; i++, u += QKK, A += 16, C += 16) {
        const uint8_t *q = x[i].qs;
        uint8_t *o = u;
        for (int n = 0; n < QKK; n += 128, q += 32)
            for (int sh = 0; sh < 8; sh += 2, o += 32)
                for (int l = 0; l < 32; l++) o[l] = (q[l] >> sh) & 3;
        const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
        for (int j = 0; j < 16; j++) { A[j] = d * (x[i].scales[j] & 0xF); C[j] = -dmin * (x[i].scales[j] >> 4); }
    }
}

/* The table types: u = table value + off (IQ4: + 128, 1..241; MXFP4: + 12, 0..24), A the
 * block's scale (IQ4_XS: d * (sub-block scale - 32)), C = 0 */
static inline void ed_unpack_tbl32(const int8_t *kv, int off, const uint8_t *qs, uint8_t *u) {
    for (int j = 0; j < QK / 2; j++) {
        u[j] = (uint8_t)(kv[qs[j] & 0xF] + off);
        u[j + QK / 2] = (uint8_t)(kv[qs[j] >> 4] + off);
    }
}

static void ed_unpack_iq4_nl(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_iq4_nl *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        ed_unpack_tbl32(ED_KV_IQ4NL, 128, x[b].qs, u);
        A[b] = H2F(x[b].d); C[b] = 0.0f;
    }
}

static void ed_unpack_mxfp4(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_mxfp4 *x = vx;
    for (int b = 0; b < K / QK; b++, u += QK) {
        ed_unpack_tbl32(ED_KV_MXFP4, 12, x[b].qs, u);
        A[b] = ed_e8m0_half(x[b].e); C[b] = 0.0f;
    }
}

static void ed_unpack_iq4_xs(const void *vx, int K, uint8_t *u, float *A, float *C) {
    const blk_iq4_xs *x = vx;
    for (int i = 0; i < K / QKK; i++, A += 8, C += 8) {
        const float d = H2F(x[i].d);
        for (int ib = 0; ib < 8; ib++, u += 32) {
            ed_unpack_tbl32(ED_KV_IQ4NL, 128, x[i].qs + 16 * ib, u);
            A[ib] = d * (float)(ed_iq4_xs_ls(&x[i], ib) - 32); C[ib] = 0.0f;
        }
    }
}

static const ed_gemm_traits ED_GEMM_TRAITS[ED_NTYPES] = {
    [ED_Q4_0] = {.G = 32, .off = 8, .unpack = ed_unpack_q4_0},
    [ED_Q4_1] = {.G = 32, .off = 0, .unpack = ed_unpack_q4_1},
    [ED_Q5_0] = {.G = 32, .off = 16, .unpack = ed_unpack_q5_0},
    [ED_Q5_1] = {.G = 32, .off = 0, .unpack = ed_unpack_q5_1},
    [ED_Q8_0] = {.G = 32, .off = 128, .unpack = ed_unpack_q8_0, .wide = 1},
    [ED_Q2_K] = {.G = 16, .off = 0, .unpack = ed_unpack_q2_K, .gps = 16},
    [ED_Q3_K] = {.G = 16, .off = 4, .unpack = ed_unpack_q3_K, .gps = 16},
    [ED_Q4_K] = {.G = 32, .off = 0, .unpack = ed_unpack_q4_K, .gps = 8},
    [ED_Q5_K] = {.G = 32, .off = 0, .unpack = ed_unpack_q5_K, .gps = 8},
    [ED_Q6_K] = {.G = 16, .off = 32, .unpack = ed_unpack_q6_K, .gps = 16},
    [ED_IQ4_NL] = {.G = 32, .off = 128, .unpack = ed_unpack_iq4_nl, .wide = 1},
    [ED_IQ4_XS] = {.G = 32, .off = 128, .unpack = ed_unpack_iq4_xs, .gps = 8, .wide = 1},
    [ED_MXFP4] = {.G = 32, .off = 12, .unpack = ed_unpack_mxfp4},
};

/* A K-quant super-block's integer group scales and mins (0 where the type has an offset
 * instead) and its d, dmin, as the canonical order combines them (ed_types.h) */
static void ed_gemm_kscales(int type, const uint8_t *blk, int32_t *sc, int32_t *mn, float *d, float *dmin) {
    uint8_t s8[8], m8[8];
    int8_t q3[16];
    *dmin = 0.0f;
    switch (type) {
    case ED_Q2_K: {
        const blk_q2_K *x = (const blk_q2_K *)blk;
        for (int j = 0; j < 16; j++) { sc[j] = x->scales[j] & 0xF; mn[j] = x->scales[j] >> 4; }
        *d = H2F(x->d); *dmin = H2F(x->dmin);
        break; }
    case ED_Q3_K: {
        const blk_q3_K *x = (const blk_q3_K *)blk;
        ed_q3_scales(x->scales, q3);
        for (int j = 0; j < 16; j++) { sc[j] = q3[j]; mn[j] = 0; }
        *d = H2F(x->d);
        break; }
    case ED_Q4_K: case ED_Q5_K: {
        const blk_q4_K *x4 = (const blk_q4_K *)blk;
        const blk_q5_K *x5 = (const blk_q5_K *)blk;
        ed_k_scales(type == ED_Q4_K ? x4->scales : x5->scales, s8, m8);
        for (int j = 0; j < 8; j++) { sc[j] = s8[j]; mn[j] = m8[j]; }
        *d = H2F(type == ED_Q4_K ? x4->d : x5->d); *dmin = H2F(type == ED_Q4_K ? x4->dmin : x5->dmin);
        break; }
    case ED_Q6_K: {
        const blk_q6_K *x = (const blk_q6_K *)blk;
        for (int j = 0; j < 16; j++) { sc[j] = x->scales[j]; mn[j] = 0; }
        *d = H2F(x->d);
        break; }
    case ED_IQ4_XS: {
        const blk_iq4_xs *x = (const blk_iq4_xs *)blk;
        for (int j = 0; j < 8; j++) { sc[j] = ed_iq4_xs_ls(x, j) - 32; mn[j] = 0; }
        *d = H2F(x->d);
        break; }
    }
}

/* The path's panel kernel: 16 rows (panel u: ng groups of G*16 bytes) against nc tokens.
 * gps = 0 (32-block types): ac holds per group 16 A then 16 C floats. gps > 0 (K-quants):
 * per super-block, for each of its gps groups 16 int32 scales then 16 int32 mins, then 16 d
 * and 16 dmin floats, then for each pair of groups 16 int32 ed_gemm_pair()s of the pair's
 * mins (types with a min) or scales (offset types), against ed_ginfo.qpair
 * (ED_GEMM_SB_FLOATS, ED_GEMM_SB_PAIRS). off: the offset to take off each group's sum;
 * has_c: the type has a min term. Token c's group g starts at xq + c*xs + goff[g];
 * info[c*is + g] is its ed_ginfo. Writes out[c*ldo + r] for r < nr. */
#define ED_GEMM_SB_FLOATS(gps) ((size_t)(2 * (gps) + 2 + (gps) / 2) * ED_PANEL)
#define ED_GEMM_SB_PAIRS(gps) ((size_t)(2 * (gps) + 2) * ED_PANEL)  /* where the pairs start */
typedef void (*ed_gemm_kernel_fn)(int ng, int G, int gps, int off, int has_c, const uint8_t *pu, const float *ac,
                                  const int32_t *goff, const uint8_t *xq, size_t xs,
                                  const ed_ginfo *info, size_t is, int nc, float *out, size_t ldo,
                                  int nr);
/* the path's transpose of 16 unpacked rows (row r at u + r*K) into panel order */
typedef void (*ed_gemm_transpose_fn)(const uint8_t *u, int K, int G, uint8_t *pu);
static void ed_gemm_transpose_generic(const uint8_t *u, int K, int G, uint8_t *pu) {
    for (int g = 0; g < K / G; g++)
        for (int q = 0; q < G / 4; q++, pu += 4 * ED_PANEL)
            for (int r = 0; r < ED_PANEL; r++) memcpy(pu + 4 * r, u + (size_t)r * K + g * G + 4 * q, 4);
}

/* A path's panels (its row of ed_kernels, ed_types.h): */
struct ed_gemm_path {
    ed_gemm_kernel_fn kernel;            /* NULL: no panels on this path */
    /* 1: the kernel takes offset types lifted to off = 128 (the u8 x s8 products need no i16
     * headroom: VNNI); 0: unlifted values, each offset folded into C = -off * A */
    int lift;
    int i16;  /* 1: the kernel sums u8 x s8 pairs in i16 (no VNNI), which wide types (ed_gemm_traits) would overflow */
    /* lift 0: values are stored with the type's own offset, which the kernel takes off */
    ed_gemm_transpose_fn transpose;
    ed_unpack_lift_fn unpack[ED_NTYPES];  /* path-specific unpackers, else NULL */
    int min_cols;  /* tokens from which a product uses the panels (ED_GEMM_MIN_COLS = 0) */
    /* the panel (pu, ac) of rows [0, nr) (a multiple of G) of a matrix in the R4 layout
     * (ed_repack.h) straight from its groups, in the path's own order, and the kernel that reads
     * it (out, ldo, nr as the kernel's), for the types the path repacks (ed_kernels.rows_r4; see
     * ed_gemm_own_r4); or NULL: each row rebuilt, then ed_gemm_pack */
    void (*pack_r4)(int type, int K, const uint8_t *w, size_t row_bytes, int nr, uint8_t *pu, float *ac);
    void (*kernel_r4)(int K, const uint8_t *pu, const float *ac, const uint8_t *xq, size_t xs,
                      const float *dy, int nc, float *out, size_t ldo, int nr);
    /* without pack_r4: the groups unpacked a group at a time for ed_gemm_pack, else NULL (each
     * row rebuilt, then unpacked) */
    ed_unpack_r4_fn unpack_r4[ED_NTYPES];
    /* 1: the wide types' panels hold the signed values v = u - 128 (ed_gemm_pack unpacks them with
     * lift 128: u + 128 wraps to v), for a kernel that sums u8 x s8 pairs in i16 (the sign trick) */
    int signed_v;
};
/* no panels; min_cols keeps the former 8, which the scheduler's two cost fits split at */
static const struct ed_gemm_path ED_GEMM_NONE = {.kernel = NULL, .lift = 1, .i16 = 0,
                                                 .transpose = ed_gemm_transpose_generic, .min_cols = 8};
#define ED_GEMM_KERNEL (ed_kern->gemm->kernel)
/* 1 when an R4 matrix of `type` has the path's own R4 panels (pack_r4): only the types the path
 * repacks itself (EDGED_REPACK=r4 gives other types the layout on any path) */
static inline int ed_gemm_own_r4(int type) {
    return ed_kern->gemm->pack_r4 && ed_kern->rows_r4 && ed_kern->rows_r4[type];
}
#define ED_GEMM_LIFT (ed_kern->gemm->lift)
#define ED_GEMM_I16 (ed_kern->gemm->i16)
#define ED_GEMM_UNPACK (ed_kern->gemm->unpack)
#define ED_GEMM_TRANSPOSE (ed_kern->gemm->transpose)
#define ED_GEMM_SIGNED (ed_kern->gemm->signed_v)
/* the threshold in force: the override, else the path's */
static int ed_gemm_min_cols(void) { return ED_GEMM_MIN_COLS ? ED_GEMM_MIN_COLS : ed_kern->gemm->min_cols; }

static int ed_gemm_ok(int type) {
    return ED_GEMM_KERNEL && type >= 0 && type < ED_NTYPES && ED_GEMM_TRAITS[type].unpack &&
           !(ED_GEMM_I16 && ED_GEMM_TRAITS[type].wide);
}

/* byte offset of the quantized values in a block of activation format vt */
static inline int ed_act_qs_at(int vt) {
    return vt == ED_Q8_0 ? (int)offsetof(blk_q8_0, qs)
         : vt == ED_Q8_1 ? (int)offsetof(blk_q8_1, qs) : (int)offsetof(blk_q8_K, qs);
}

/* two small integers (|v| < 2^15: group sums of q, scales, mins) as the int16 pair (lo, hi) */
static inline int32_t ed_gemm_pair(int32_t lo, int32_t hi) {
    return (int32_t)(((uint32_t)hi << 16) | ((uint32_t)lo & 0xFFFFu));
}

static size_t ed_gemm_info_len(int64_t K) { return (size_t)(K / 32 + K / 16); }

/* One quantized activation row (format vt, K elements): its groups of 32 (entries
 * [0, K/32)) and of 16 (entries [K/32, K/32 + K/16)). */
static void ed_gemm_info(int vt, int K, const uint8_t *row, ed_ginfo *info) {
    const int be = ED_ACT[vt].block, bb = ED_ACT[vt].type_size;
    const int qs_at = ed_act_qs_at(vt);
    ed_ginfo *i16 = info + K / 32;
    for (int g = 0; g < K / 16; g++) {
        const uint8_t *blk = row + (g * 16 / be) * bb;
        const float dy = vt == ED_Q8_K ? ((const blk_q8_K *)blk)->d : H2F(((const blk_q8_0 *)blk)->d);
        const int8_t *q = (const int8_t *)(blk + qs_at + (g * 16) % be);
        int32_t sum = 0;
        for (int j = 0; j < 16; j++) sum += q[j];
        i16[g] = (ed_ginfo){dy, 128 * sum, dy * (float)sum, 0};
    }
    for (int g = 0; g + 1 < K / 16; g += 2) i16[g].qpair = ed_gemm_pair(i16[g].yoff / 128, i16[g + 1].yoff / 128);
    for (int g = 0; g < K / 32; g++) {
        const int32_t sum = (i16[2 * g].yoff + i16[2 * g + 1].yoff) / 128;
        const float dy = i16[2 * g].dy;
        float dys = dy * (float)sum;
        if (vt == ED_Q8_1) dys = H2F(((const blk_q8_1 *)(row + g * bb))->s);  /* its stored d * sum, as the dot uses */
        info[g] = (ed_ginfo){dy, 128 * sum, dys, 0};
    }
    for (int g = 0; g + 1 < K / 32; g += 2) info[g].qpair = ed_gemm_pair(info[g].yoff / 128, info[g + 1].yoff / 128);
}

/* A path's own R4 panel kernel (pack_r4, ed_gemm_own_r4) reads the Q8_0 activations' block scales as floats, 4
 * tokens side by side per block: token t's scale of block b at dy[(t / 4) * (K / 32) * 4 + 4 * b
 * + t % 4], so ed_gemm_dy_len(n, K) floats for n tokens (exact conversions: the bits of the dot
 * do not change, only its loads). */
static inline int ed_gemm_reads_dy(int type, int layout) { return layout == ED_LAYOUT_R4 && ed_gemm_own_r4(type); }
static size_t ed_gemm_dy_len(int64_t n, int64_t K) { return (size_t)((n + 3) / 4 * 4) * (size_t)(K / QK); }
static void ed_gemm_dy_r4(int K, const uint8_t *row, int t, float *dy) {
    const blk_q8_0 *x = (const blk_q8_0 *)row;
    float *d = dy + (size_t)(t / 4) * (K / QK) * 4 + t % 4;
    for (int b = 0; b < K / QK; b++) d[4 * b] = H2F(x[b].d);
}

/* floats of one row's A and C (K / 16 groups at most, 2 x K / 32 = 4 x K / 32) or of an R4 group's
 * A (ED_R4_ROWS x K / 32) */
#define ED_GEMM_ABUF(K) ((size_t)(K) / QK * ED_R4_ROWS)
static size_t ed_gemm_scratch(int64_t K) {
    const size_t ng = (size_t)K / 16;  /* the most groups any type has */
    return ED_ALIGN((size_t)K * ED_PANEL)                /* the panel */
         + ED_ALIGN((ng * 2 + (size_t)K / QKK * 10) * ED_PANEL * sizeof(float))  /* its A, C / scales */
         + ED_ALIGN((size_t)K * ED_PANEL)                /* 16 unpacked rows */
         + ED_ALIGN(ED_GEMM_ABUF(K) * sizeof(float))     /* one row's A, C or an R4 group's G x K / 32 A */
         + ED_ALIGN(ng * sizeof(int32_t))                /* group offsets */
         + ED_ALIGN((size_t)K / QK * sizeof(blk_q8_0) * ED_R4_ROWS);  /* one repacked group rebuilt */
}

/* rows [0, nr) of W (nr <= 16) into the interleaved panel; rows past nr are zero. A repacked W
 * (layout ED_LAYOUT_R4) has each group rebuilt into rowbuf (G rows) first. */
static void ed_gemm_pack(int type, int layout, int K, const uint8_t *w, size_t row_bytes, int nr,
                         uint8_t *pu, float *ac, uint8_t *ubuf, float *abuf, uint8_t *rowbuf) {
    const ed_gemm_traits *t = &ED_GEMM_TRAITS[type];
    const int G = t->G, ng = K / G, gps = t->gps;
    const uint8_t lift = (uint8_t)(t->off && ED_GEMM_LIFT ? 128 - t->off : ED_GEMM_SIGNED && t->wide ? 128 : 0);
    const int bs = ED_TRAITS[type].type_size;
    float *cbuf = abuf + ng;
    const ed_unpack_r4_fn u4 = layout == ED_LAYOUT_R4 ? ed_kern->gemm->unpack_r4[type] : NULL;
    if (u4) {  /* a 32-block type (gps 0, C 0) in R4 groups: one group per call */
        for (int r = 0; r < ED_PANEL; r += ED_R4_ROWS) {
            if (r < nr) u4(w + (size_t)r * row_bytes, K, ubuf + (size_t)r * K, abuf, lift);
            else {
                memset(ubuf + (size_t)r * K, 0, (size_t)K * ED_R4_ROWS);
                memset(abuf, 0, sizeof(float) * (size_t)ng * ED_R4_ROWS);
            }
            for (int i = 0; i < ED_R4_ROWS; i++)
                for (int g = 0; g < ng; g++) {
                    ac[g * 2 * ED_PANEL + r + i] = abuf[i * ng + g];
                    ac[g * 2 * ED_PANEL + ED_PANEL + r + i] = 0.0f;
                }
        }
    } else for (int r = 0; r < ED_PANEL; r++) {
        uint8_t *u = ubuf + (size_t)r * K;
        const uint8_t *row = w + (size_t)r * row_bytes;
        if (r < nr && layout == ED_LAYOUT_R4) {  /* each group rebuilt once, at its first row */
            if (r % ED_R4_ROWS == 0) ed_r4_group(type, 0, K, rowbuf, row_bytes, (uint8_t *)row);
            row = rowbuf + (size_t)(r % ED_R4_ROWS) * row_bytes;
        }
        if (r < nr && ED_GEMM_UNPACK[type]) {
            ED_GEMM_UNPACK[type](row, K, u, abuf, cbuf, lift);
        } else if (r < nr) {
            t->unpack(row, K, u, abuf, cbuf);
            if (lift) for (int k = 0; k < K; k++) u[k] += lift;
        } else {
            memset(u, 0, (size_t)K);
            memset(abuf, 0, sizeof(float) * 2 * (size_t)ng);
        }
        if (!gps) {
            for (int g = 0; g < ng; g++) {
                ac[g * 2 * ED_PANEL + r] = abuf[g];
                ac[g * 2 * ED_PANEL + ED_PANEL + r] = cbuf[g];
            }
            continue;
        }
        for (int i = 0; i < K / QKK; i++) {
            float *sb = ac + i * ED_GEMM_SB_FLOATS(gps), d = 0.0f, dmin = 0.0f;
            int32_t sc[16] = {0}, mn[16] = {0};
            if (r < nr) ed_gemm_kscales(type, row + (size_t)i * bs, sc, mn, &d, &dmin);
            for (int j = 0; j < gps; j++) {
                memcpy(sb + j * 2 * ED_PANEL + r, sc + j, 4);
                memcpy(sb + j * 2 * ED_PANEL + ED_PANEL + r, mn + j, 4);
            }
            sb[gps * 2 * ED_PANEL + r] = d;
            sb[gps * 2 * ED_PANEL + ED_PANEL + r] = dmin;
            const int32_t *pw = t->off ? sc : mn;
            for (int j = 0; j < gps; j += 2) {
                const int32_t pv = ed_gemm_pair(pw[j], pw[j + 1]);
                memcpy(sb + ED_GEMM_SB_PAIRS(gps) + (size_t)j / 2 * ED_PANEL + r, &pv, 4);
            }
        }
    }
    ED_GEMM_TRANSPOSE(ubuf, K, G, pu);
}

/* out[c*ldo + r] = W[r] . xq[c] for r < nr (any; a multiple of ED_R4_ROWS for ED_LAYOUT_R4), c < n:
 * panels of 16 rows, each unpacked once */
static void ed_gemm_rows_layout(int type, int layout, int K, const uint8_t *w, size_t row_bytes, int nr,
                                const uint8_t *xq, size_t xs, const ed_ginfo *info, size_t is,
                                const float *dy, int n, float *out, size_t ldo, uint8_t *scratch) {
    const ed_gemm_traits *t = &ED_GEMM_TRAITS[type];
    const int G = t->G, ng = K / G, has_c = t->off == 0, off = t->off && ED_GEMM_LIFT ? 128 : t->off;
    const size_t ngmax = (size_t)K / 16;
    const int vt = ED_TRAITS[type].vec_type;
    const int be = ED_ACT[vt].block, bb = ED_ACT[vt].type_size;
    const int qs_at = ed_act_qs_at(vt);
    uint8_t *pu = scratch;
    float *ac = (float *)(pu + ED_ALIGN((size_t)K * ED_PANEL));
    uint8_t *ubuf = (uint8_t *)ac + ED_ALIGN((ngmax * 2 + (size_t)K / QKK * 10) * ED_PANEL * sizeof(float));
    float *abuf = (float *)(ubuf + ED_ALIGN((size_t)K * ED_PANEL));
    int32_t *goff = (int32_t *)((uint8_t *)abuf + ED_ALIGN(ED_GEMM_ABUF(K) * sizeof(float)));
    uint8_t *rowbuf = (uint8_t *)goff + ED_ALIGN(ngmax * sizeof(int32_t));
    for (int g = 0; g < ng; g++) goff[g] = (g * G / be) * bb + qs_at + (g * G) % be;
    if (G == 16) info += K / 32;
    for (int r0 = 0; r0 < nr; r0 += ED_PANEL) {
        const int pr = nr - r0 < ED_PANEL ? nr - r0 : ED_PANEL;
        if (ed_gemm_reads_dy(type, layout)) {
            ed_kern->gemm->pack_r4(type, K, w + (size_t)r0 * row_bytes, row_bytes, pr, pu, ac);
            ed_kern->gemm->kernel_r4(K, pu, ac, xq, xs, dy, n, out + r0, ldo, pr);
            continue;
        }
        ed_gemm_pack(type, layout, K, w + (size_t)r0 * row_bytes, row_bytes, pr, pu, ac, ubuf, abuf, rowbuf);
        ED_GEMM_KERNEL(ng, G, t->gps, off, has_c, pu, ac, goff, xq, xs, info, is, n, out + r0, ldo, pr);
    }
}

static void ed_gemm_rows(int type, int K, const uint8_t *w, size_t row_bytes, int nr,
                         const uint8_t *xq, size_t xs, const ed_ginfo *info, size_t is, int n,
                         float *out, size_t ldo, uint8_t *scratch) {
    ed_gemm_rows_layout(type, ED_LAYOUT_MAPPED, K, w, row_bytes, nr, xq, xs, info, is, NULL, n, out, ldo, scratch);
}

#endif
