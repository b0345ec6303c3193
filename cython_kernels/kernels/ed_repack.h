/* Weights repacked at load for a path's row kernels (included by ed_gemm.h).
 *
 * The mapped layout (GGUF's: each weight row its blocks in order) makes a row kernel load every
 * row's block scale on its own and add each row's lane sums into one block sum (or, on x86,
 * transpose each block of 8 rows into row lanes). A path whose kernels read G rows side by side
 * (ed_kernels.rows_r4: NEON with dotprod for Q4_0 and Q8_0, every x86 path for Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4 and the K-quants) gets a copy of those matrices in the R4 layout instead (rows interleaved in runs of 4
 * bytes), written once at load into one aligned arena (edged/engine/repack.py; the mapped pages
 * of those tensors are then released). G = ED_R4_ROWS is the rows of one vector register of
 * 4-byte lanes: 4 on Arm (128-bit NEON), 8 on x86 (256-bit AVX2 lanes):
 *
 *   rows Gg..Gg+G-1 are one group of G * row_bytes bytes at the same offset as in the mapping;
 *   inside it, block b of the G rows is  { ed_half d[G]; uint8_t qh[G][4]; uint8_t qs[G * QS]; }
 *   (qh for Q5_0 only; QS = 16 for Q4_0 and Q5_0, 32 for Q8_0: the same bytes per block as G
 *   mapped blocks), row i's scale in d[i], its fifth bits (Q5_0's qh) in qh[i] as bit planes
 *   (ed_r4_planes) and its quant bytes 4k..4k+3 at qs[4Gk + 4i .. 4Gk + 4i + 3]. In general a
 *   mapped block is a head (F16 halves: d, and m / dmin where the type has one; MXFP4: its one
 *   E8M0 byte) and then dwords; an R4 block holds the G rows' head units side by side (unit j of
 *   row i at G u j + u i, u = 2 or 1 bytes), then each dword run (dword k of row i at
 *   G head + 4Gk + 4i). The types beyond Q4_0 / Q5_0 / Q8_0 only where G = 8 (x86, whose row
 *   kernels take 8 rows as lanes): Q4_1, Q5_1 (d[8], m[8], then as Q4_0 / Q5_0), IQ4_NL (as
 *   Q4_0), MXFP4 ({ uint8_t e[8]; uint8_t qs[8 * 16]; }), Q4_K (super-blocks of 256:
 *   { ed_half d[8], dmin[8]; uint32_t sc[3][8]; uint32_t qs[32][8]; }, the 12 bytes of packed
 *   scales and mins as 3 dwords per row, lane-parallel to unpack) and Q5_K
 *   ({ ed_half d[8], dmin[8]; uint32_t sc[3][8]; uint32_t qh[8][8]; uint32_t qs[32][8]; }) and Q6_K
 *   ({ ed_half d[8]; uint32_t ql[32][8]; uint32_t qh[16][8]; int8_t sc[4][8][4]; }: ql and qh rewritten as
 *   whole 6-bit values, ed_q6_fields) and Q2_K
 *   ({ ed_half d[8], dmin[8]; uint8_t sc[4][8][4]; uint32_t qs[16][8]; }) and Q3_K ({ ed_half d[8];
 *   uint32_t x[8][8], y[8][8], z[8][8]; uint32_t sc[3][8]; }: hmask and qs rewritten as whole 3-bit
 *   values, ed_q3_fields); their mapped blocks keep
 *   the halves last, the R4 blocks first; IQ4_XS ({ ed_half d[8]; uint16_t scales_h[8];
 *   uint32_t scales_l[8]; uint32_t qs[32][8]; })
 *
 * so one vector load holds 4 bytes of each of the G rows (what SDOT by lane multiplies with 4
 * activation bytes; an x86 row kernel's transposed register), one load the G rows' scales and
 * one their fifth bits (one shift per register), and a group's blocks follow each other: a
 * kernel over a chunk of rows reads one sequential stream (on x86 two interleaved groups of 4
 * rows per register were two streams that restarted every group: 0.4x the bandwidth of one).
 * On Arm, Q4_0's bytes are stored XOR 0x88:
 * each nibble q becomes the 4-bit two's complement of q - 8, so a shift left by 4 (low nibble)
 * or a mask of the high nibble gives 16 * (q - 8) as a signed byte, with no subtraction; the
 * kernels' integer block sums are then 16 times the mapped ones, exact, and the conversion to
 * float divides by 16 exactly (SCVTF with 4 fraction bits), so the canonical float step
 * (ED_STEP, ed_types.h) sees the same integer and every output keeps the plain C dot's bits.
 * x86 keeps the nibbles as mapped (its kernels multiply them unsigned and take the offset off
 * with the activations' block sums).
 *
 *   ed_r4_ok(type, ne0, ne1)      1 when a matrix of this type and shape can take the layout
 *   ed_r4_pack(type, K, src, row_bytes, nrows, dst, tmp)   mapped -> R4 (dst may be src: in place);
 *                                 tmp: G * row_bytes bytes
 *   ed_r4_group(type, dir, K, rows, row_bytes, group)   one group of G rows to R4 (dir 1) or back
 *   ed_r4_unpack_row(type, K, group, i, row)   row i (0..G-1) of a group back to mapped blocks
 *   ed_r4_rows_generic(...)       the slow, obvious twin of a path's R4 row kernel (any CPU)
 */
#ifndef EDGED_ED_REPACK_H
#define EDGED_ED_REPACK_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"

enum { ED_LAYOUT_MAPPED = 0, ED_LAYOUT_R4 = 1 };
#if defined(__x86_64__) || defined(__i386__)
#define ED_R4_ROWS 8
#else
#define ED_R4_ROWS 4
#endif

/* A mapped block is a head of ed_r4_units units of ed_r4_unit bytes (F16 halves: d; Q4_1, Q5_1:
 * d, m; Q4_K, Q5_K: d, dmin; MXFP4: its E8M0 byte) and then dwords (Q5_0, Q5_1: qh, then the
 * quants; the K-quants: their 12 bytes of packed scales and mins, then Q5_K's qh, then the
 * quants). In an R4 block the G rows' unit j sit side by side (at G u j), then each dword run:
 * dword k of row i at G head + 4Gk + 4i. */
static inline int ed_r4_unit(int type) { return type == ED_MXFP4 ? 1 : 2; }
static inline int ed_r4_units(int type) {
    return type == ED_Q4_1 || type == ED_Q5_1 || type == ED_Q4_K || type == ED_Q5_K || type == ED_Q2_K ||
           type == ED_IQ4_XS ? 2 : 1;
}
static inline int ed_r4_head(int type) { return ed_r4_unit(type) * ed_r4_units(type); }
static inline int ed_r4_dwords(int type) { return (ED_TRAITS[type].type_size - ed_r4_head(type)) / 4; }
/* where the head sits in a mapped block: first, except Q2_K's d, dmin and Q3_K's, Q6_K's d after their
 * dwords (an R4 block holds the heads first all the same) */
static inline int ed_r4_tail(int type) { return type == ED_Q2_K || type == ED_Q3_K || type == ED_Q6_K; }
static inline int ed_r4_hoff(int type) { return ed_r4_tail(type) ? 4 * ed_r4_dwords(type) : 0; }
static inline int ed_r4_doff(int type) { return ed_r4_tail(type) ? 0 : ed_r4_head(type); }
static inline uint8_t ed_r4_xor(int type) { return ED_R4_ROWS == 4 && type == ED_Q4_0 ? 0x88 : 0x00; }

/* beyond Q4_0, Q5_0 and Q8_0 only where groups are 8 rows (x86: its row kernels take 8 rows as lanes) */
static int ed_r4_ok(int type, int64_t ne0, int64_t ne1) {
    const int t = type == ED_Q4_0 || type == ED_Q5_0 || type == ED_Q8_0 ||
                  (ED_R4_ROWS == 8 && (type == ED_Q4_1 || type == ED_Q5_1 || type == ED_IQ4_NL || type == ED_MXFP4 ||
                                       type == ED_Q2_K || type == ED_Q3_K || type == ED_Q4_K || type == ED_Q5_K ||
                                       type == ED_Q6_K || type == ED_IQ4_XS));
    return t && ne0 > 0 && ne0 % ED_TRAITS[type].block == 0 && ne1 > 0 && ne1 % ED_R4_ROWS == 0;
}

/* Q5_0's fifth bits as bit planes: bit k of byte i is bit 4k + i of qh (the fifth bit of weight
 * 4k + i), so for the weights of an x86 register k (bytes 4k..4k+3 of the row's 32 weights in
 * the order the kernels hold them: low nibbles then high ones) one shift brings their 4 bits
 * to bit 4 of each byte (ed_r4_planes back: the inverse) */
static inline uint32_t ed_r4_planes(uint32_t qh, int back) {
    uint32_t p = 0;
    for (int i = 0; i < 4; i++) {  /* bits i, i + 4, ..., i + 28 of qh <-> byte i of the planes */
        uint32_t v;
        if (back) {
            v = qh >> 8 * i & 0xFF;
            v = (v | v << 12) & 0x000F000Fu;
            v = (v | v << 6) & 0x03030303u;
            v = (v | v << 3) & 0x11111111u;
            p |= v << i;
        } else {
            v = qh >> i & 0x11111111u;
            v = (v | v >> 3) & 0x03030303u;
            v = (v | v >> 6) & 0x000F000Fu;
            v = (v | v >> 12) & 0xFFu;
            p |= v << 8 * i;
        }
    }
    return p;
}

#if ED_R4_ROWS == 8 && defined(__SSE2__)
#include <emmintrin.h>
/* runs k..k+3 of a block's 8 rows (at rk: 4 x 32 bytes) <-> dwords k..k+3 of each row (at m[i] +
 * off), both ways by two 4 x 4 dword transposes (their own inverse); SSE2, every x86-64 CPU */
static inline void ed_r4_runs4(uint8_t *rk, uint8_t *const m[8], int off, int dir) {
    for (int q = 0; q < 2; q++) {  /* rows 4q..4q+3 */
        __m128i a[4];
        for (int j = 0; j < 4; j++)
            a[j] = _mm_loadu_si128((const __m128i *)(dir ? m[4 * q + j] + off : rk + 32 * j + 16 * q));
        const __m128i t0 = _mm_unpacklo_epi32(a[0], a[1]), t1 = _mm_unpacklo_epi32(a[2], a[3]);
        const __m128i t2 = _mm_unpackhi_epi32(a[0], a[1]), t3 = _mm_unpackhi_epi32(a[2], a[3]);
        const __m128i o[4] = {_mm_unpacklo_epi64(t0, t1), _mm_unpackhi_epi64(t0, t1),
                              _mm_unpacklo_epi64(t2, t3), _mm_unpackhi_epi64(t2, t3)};
        for (int j = 0; j < 4; j++)
            _mm_storeu_si128((__m128i *)(dir ? rk + 32 * j + 16 * q : m[4 * q + j] + off), o[j]);
    }
}
#endif

/* Q3_K's 3-bit values in 3-bit fields (x86 R4 only): for each of the 32 weight positions l of a
 * super-block the 8 values v_f = lo_f + 4 hb_f of fields f = 4j + s (weight 128j + 32s + l; lo_f
 * bits 2s..2s+1 of qs[32j + l], hb_f bit f of hmask[l]) are 24 bits in the bytes hmask[l] = X,
 * qs[l] = Y, qs[32 + l] = Z:
 *   X = v0 | v1 << 3 | lo6 << 6,   Y = v2 | v3 << 3 | lo7 << 6,   Z = v4 | v5 << 3 | hb6 << 6 | hb7 << 7
 * so a kernel takes six values with one mask each (v1, v3, v5 as 8 v) and v6, v7 with two shifts
 * (the mapped bits cost a shift, a mask and an or per value for the hmask bit alone). In place on
 * a block's first 96 bytes; dir 1 to the fields, dir 0 back (8 positions per 64-bit word: every
 * shift is masked to its bytes). */
static inline void ed_q3_fields(uint8_t *b, int dir) {
    const uint64_t B = 0x0101010101010101ull, B3 = 3 * B, B4 = 4 * B, B7 = 7 * B;
    for (int w = 0; w < 4; w++) {
        uint64_t h, q0, q1;
        memcpy(&h, b + 8 * w, 8), memcpy(&q0, b + 32 + 8 * w, 8), memcpy(&q1, b + 64 + 8 * w, 8);
        if (dir) {
            const uint64_t v0 = (q0 & B3) | (h << 2 & B4), v1 = (q0 >> 2 & B3) | (h << 1 & B4);
            const uint64_t v2 = (q0 >> 4 & B3) | (h & B4), v3 = (q0 >> 6 & B3) | (h >> 1 & B4);
            const uint64_t v4 = (q1 & B3) | (h >> 2 & B4), v5 = (q1 >> 2 & B3) | (h >> 3 & B4);
            const uint64_t x = v0 | v1 << 3 | (q1 >> 4 & B3) << 6, y = v2 | v3 << 3 | (q1 >> 6 & B3) << 6;
            const uint64_t z = v4 | v5 << 3 | (h >> 6 & B) << 6 | (h >> 7 & B) << 7;
            h = x, q0 = y, q1 = z;
        } else {
            const uint64_t x = h, y = q0, z = q1;
            const uint64_t v0 = x & B7, v1 = x >> 3 & B7, v2 = y & B7, v3 = y >> 3 & B7, v4 = z & B7, v5 = z >> 3 & B7;
            h = (v0 >> 2 & B) | (v1 >> 2 & B) << 1 | (v2 >> 2 & B) << 2 | (v3 >> 2 & B) << 3 | (v4 >> 2 & B) << 4 |
                (v5 >> 2 & B) << 5 | (z >> 6 & B) << 6 | (z >> 7 & B) << 7;
            q0 = (v0 & B3) | (v1 & B3) << 2 | (v2 & B3) << 4 | (v3 & B3) << 6;
            q1 = (v4 & B3) | (v5 & B3) << 2 | (x >> 6 & B3) << 4 | (y >> 6 & B3) << 6;
        }
        memcpy(b + 8 * w, &h, 8), memcpy(b + 32 + 8 * w, &q0, 8), memcpy(b + 64 + 8 * w, &q1, 8);
    }
}

/* Q6_K's 6-bit values whole (x86 R4 only): for each half j and position l (0..31) the values v_t
 * (t = 0..3, weight 128j + 32t + l; the low nibbles in ql[64j + l] (t = 0, 2) and ql[64j + 32 + l]
 * (t = 1, 3), the top two bits t in qh[32j + l]) become the bytes ql[64j + l] = A, ql[64j + 32 + l]
 * = B, qh[32j + l] = C:
 *   A = v0 | (v3 & 3) << 6,   B = v1 | (v3 >> 2 & 3) << 6,   C = v2 | (v3 >> 4) << 6
 * so three values are one mask each (the mapped bits: four to five operations per value). In place
 * on a block's first 192 bytes, dir 1 to the fields, dir 0 back. */
static inline void ed_q6_fields(uint8_t *b, int dir) {
    const uint64_t B = 0x0101010101010101ull, B3 = 3 * B, B15 = 15 * B, B63 = 63 * B;
    for (int j = 0; j < 2; j++)
        for (int w = 0; w < 4; w++) {
            uint8_t *pa = b + 64 * j + 8 * w, *pb = pa + 32, *pc = b + 128 + 32 * j + 8 * w;
            uint64_t a, bb, c;
            memcpy(&a, pa, 8), memcpy(&bb, pb, 8), memcpy(&c, pc, 8);
            if (dir) {
                const uint64_t v0 = (a & B15) | (c & B3) << 4, v1 = (bb & B15) | (c >> 2 & B3) << 4;
                const uint64_t v2 = (a >> 4 & B15) | (c >> 4 & B3) << 4, v3 = (bb >> 4 & B15) | (c >> 6 & B3) << 4;
                a = v0 | (v3 & B3) << 6, bb = v1 | (v3 >> 2 & B3) << 6, c = v2 | (v3 >> 4 & B3) << 6;
            } else {
                const uint64_t v0 = a & B63, v1 = bb & B63, v2 = c & B63;
                const uint64_t v3 = (a >> 6 & B3) | (bb >> 6 & B3) << 2 | (c >> 6 & B3) << 4;
                a = (v0 & B15) | (v2 & B15) << 4, bb = (v1 & B15) | (v3 & B15) << 4;
                c = (v0 >> 4 & B3) | (v1 >> 4 & B3) << 2 | (v2 >> 4 & B3) << 4 | (v3 >> 4 & B3) << 6;
            }
            memcpy(pa, &a, 8), memcpy(pb, &bb, 8), memcpy(pc, &c, 8);
        }
}

/* the types whose x86 R4 blocks hold their values whole (ed_q3_fields, ed_q6_fields) */
static inline void ed_r4_fields(int type, uint8_t *b, int dir) {
    if (type == ED_Q3_K) ed_q3_fields(b, dir); else ed_q6_fields(b, dir);
}

/* one block of the G rows: to R4 (dir 1: the G mapped blocks at m[i] -> r) or back (dir 0; the
 * prompt panels rebuild each group this way, so no library calls in its loops) */
static inline void ed_r4_block(int type, int dir, uint8_t *r, uint8_t *const m_[ED_R4_ROWS]) {
    const int u = ed_r4_unit(type), nu = ed_r4_units(type), hd = u * nu, nd = ed_r4_dwords(type), G = ED_R4_ROWS;
    const int fl = ED_R4_ROWS == 8 && (type == ED_Q3_K || type == ED_Q6_K);  /* values whole (ed_r4_fields) */
    uint8_t fb[fl && dir ? ED_R4_ROWS : 1][sizeof(blk_q6_K)];
    uint8_t *m[ED_R4_ROWS];
    for (int i = 0; i < G; i++) {
        m[i] = m_[i];
        if (fl && dir) {  /* the fields into a copy: the mapped rows stay as they are */
            memcpy(fb[i], m_[i], ED_TRAITS[type].type_size);
            ed_r4_fields(type, fb[i], 1);
            m[i] = fb[i];
        }
    }
    const int ho = ed_r4_hoff(type), dof = ed_r4_doff(type);
    const uint32_t x = ed_r4_xor(type) * 0x01010101u;
    const int k0 = type == ED_Q5_0 || type == ED_Q5_1;  /* dword 0 (qh) as bit planes */
    for (int i = 0; i < G; i++) {
        uint8_t *mi = m[i], *ri = r + u * i;
        for (int j = 0; j < nu; j++)
            for (int b = 0; b < u; b++) {
                if (dir) ri[G * u * j + b] = mi[ho + u * j + b]; else mi[ho + u * j + b] = ri[G * u * j + b];
            }
        uint8_t *rd = r + G * hd + 4 * i, *md = mi + dof;
        uint32_t v;
        if (k0) {
            memcpy(&v, dir ? md : rd, 4);
            v = ed_r4_planes(v, !dir);
            memcpy(dir ? rd : md, &v, 4);
        }
        int k = k0;
#if ED_R4_ROWS == 8 && defined(__SSE2__)
        if (i == 0) {  /* x86 (no XOR): four runs of the 8 rows at a time, by 4 x 4 dword transposes */
            for (; k + 4 <= nd; k += 4) ed_r4_runs4(r + G * hd + 4 * G * k, m, dof + 4 * k, dir);
        } else k += (nd - k0) / 4 * 4;
#endif
        if (dir) for (; k < nd; k++) { memcpy(&v, md + 4 * k, 4); v ^= x; memcpy(rd + 4 * G * k, &v, 4); }
        else for (; k < nd; k++) { memcpy(&v, rd + 4 * G * k, 4); v ^= x; memcpy(md + 4 * k, &v, 4); }
    }
    if (fl && !dir) for (int i = 0; i < G; i++) ed_r4_fields(type, m[i], 0);
}

/* one group both ways: G mapped rows (rows, row_bytes apart) -> R4 bytes at group (G * row_bytes)
 * (dir 1), or back (dir 0) */
static void ed_r4_group(int type, int dir, int K, uint8_t *rows, size_t row_bytes, uint8_t *group) {
    const int bs = ED_TRAITS[type].type_size;
    for (int b = 0; b < K / ED_TRAITS[type].block; b++, group += ED_R4_ROWS * bs) {
        uint8_t *m[ED_R4_ROWS];
        for (int i = 0; i < ED_R4_ROWS; i++) m[i] = rows + (size_t)i * row_bytes + (size_t)b * bs;
        ed_r4_block(type, dir, group, m);
    }
}

/* rows [0, nrows) (a multiple of G) of src into dst; dst == src repacks in place (each group is
 * first copied to tmp, G * row_bytes bytes) */
static void ed_r4_pack(int type, int K, const uint8_t *src, size_t row_bytes, int64_t nrows,
                       uint8_t *dst, uint8_t *tmp) {
    const size_t gb = ED_R4_ROWS * row_bytes;
    for (int64_t g = 0; g < nrows / ED_R4_ROWS; g++) {
        memcpy(tmp, src + (size_t)g * gb, gb);
        ed_r4_group(type, 1, K, tmp, row_bytes, dst + (size_t)g * gb);
    }
}

/* row i of the R4 group at `group` as its mapped blocks (row_bytes bytes) */
static void ed_r4_unpack_row(int type, int K, const uint8_t *group, int i, uint8_t *row) {
    const int bs = ED_TRAITS[type].type_size;
    uint8_t skip[sizeof(blk_q6_K)];  /* the other rows' blocks go here (the largest block) */
    for (int b = 0; b < K / ED_TRAITS[type].block; b++, group += ED_R4_ROWS * bs, row += bs) {
        uint8_t *m[ED_R4_ROWS];
        for (int j = 0; j < ED_R4_ROWS; j++) m[j] = skip;
        m[i] = row;
        ed_r4_block(type, 0, (uint8_t *)group, m);
    }
}

/* out[c * ldo + r] = W[r] . xq[c] for r < nr (a multiple of G), c < nc, W in the R4 layout
 * from w: each row rebuilt into its mapped blocks, then the plain C dot (ed_types.h) */
static void ed_r4_rows_generic(int type, int K, const uint8_t *w, size_t row_bytes, int nr,
                               const uint8_t *xq, size_t xs, int nc, float *out, size_t ldo) {
    uint8_t row[row_bytes];
    for (int r = 0; r < nr; r++) {
        ed_r4_unpack_row(type, K, w + (size_t)(r / ED_R4_ROWS) * ED_R4_ROWS * row_bytes, r % ED_R4_ROWS, row);
        for (int c = 0; c < nc; c++) out[(size_t)c * ldo + r] = ED_TRAITS[type].ref(K, row, xq + (size_t)c * xs);
    }
}

#endif
