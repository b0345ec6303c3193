/* Standalone check of every kernel path this CPU (or emulator) supports against the generic C
 * path: random valid weight blocks of every type x random activations, odd row counts, single
 * dots and the tiled ed_mdot_rows. Prints one line per path/type and exits non-zero on a
 * mismatch; a "digest" line per path/type hashes the dot and tile results (so two builds or
 * CPUs can be compared bit for bit), says whether the dot is SIMD, and checks the tiles
 * (ED_TILE: a prompt's tokens, a decode batch's sessions) against the one-token path bit for
 * bit ("same-ok"). Built and run by
 * tests/test_kernels_cross.py (natively, and for aarch64 under qemu when a cross compiler is
 * installed), so the NEON path is exercised on an x86 machine.
 * The quantized types follow one canonical summation order (ed_types.h, ED_STEP) on every
 * path: their dots, tiles, row kernels and packed panels must equal the plain C dot bit for
 * bit ("canon-ok"), so every batch shape, chunking and thread split gives the same bits.
 * The float types (F32, F16, BF16) follow llama.cpp's order on every SIMD path ("floatorder";
 * BF16 on the AVX-512 paths: VDPBF16PS's, with the instruction and its emulation); the
 * generic C dot sums them in double.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include "forward.h"
#include "ed_quant.h"

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) { rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17; return (uint32_t)rng_state; }
static uint64_t fnv(uint64_t h, const float *v, int n) {
    const uint8_t *b = (const uint8_t *)v;
    for (size_t i = 0; i < sizeof(float) * (size_t)n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}
static float rndf(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }

/* byte offsets of half-float fields per block, so random blocks carry sane scales */
static void fix_halves(int type, uint8_t *blk) {
    int offs[2] = {-1, -1};
    switch (type) {
    case ED_Q4_0: case ED_Q5_0: case ED_Q8_0: case ED_IQ4_NL: case ED_IQ4_XS: offs[0] = 0; break;
    case ED_MXFP4: blk[0] = (uint8_t)(118 + rnd() % 8); break;  /* E8M0: 2^-9 .. 2^-2 */
    case ED_Q4_1: case ED_Q5_1: case ED_Q4_K: case ED_Q5_K: offs[0] = 0; offs[1] = 2; break;
    case ED_Q2_K: offs[0] = 80; offs[1] = 82; break;
    case ED_Q3_K: offs[0] = 108; break;
    case ED_Q6_K: offs[0] = 208; break;
    }
    for (int i = 0; i < 2; i++) if (offs[i] >= 0) {
        ed_half h = ed_fp32_to_fp16(rndf() * 0.05f);
        memcpy(blk + offs[i], &h, 2);
    }
}

/* the attention's F16 dot in one row's order (ed_pm_dot: the path's table) or a batch's (the
   ISA's function itself: no table names it) */
static float pm_dot(const ed_pm_fns *pm, int batch, int n, const ed_half *x, const ed_half *y) {
    if (!batch) return ed_pm_dot(pm, n, x, y);
#if defined(__x86_64__)
    if (pm->dot_f16) return ed_pm_dot_f16_x86(n, x, y, 1);
#elif defined(__aarch64__)
    if (pm->dot_f16) return ed_pm_dot_f16_neon(n, x, y, 1);
#endif
    return ed_pm_dot_f16(n, x, y, 1);
}

/* The float types' order on the SIMD paths (llama.cpp's tinyBLAS, as ed_simd_x86.inc's and
   ed_simd_neon.inc's float bodies run it): lane j of 16 sums the products k = j mod 16 by FMA,
   the 16-lane tree (ed_pm_hsum16), then the tail k >= n - n % 16 by FMA */
static float fval(int t, const void *p, int i) {
    return t == ED_F32 ? ((const float *)p)[i] : t == ED_F16 ? ed_fp16_to_fp32(((const ed_half *)p)[i])
                                                           : ed_bf16_to_fp32(((const uint16_t *)p)[i]);
}
/* BF16 on the AVX-512 paths: VDPBF16PS's order (ed_simd_x86.inc, ED_BF16_ROWS): 32 values at a
   time (zero-padded), lane j adding the products k = 2j + 1, then 2j, then the 16-lane tree */
static float bf16_pair_order_dot(int n, const uint16_t *x, const uint16_t *y) {
    float acc[16] = {0};
    for (int i = 0; i < n; i += 32)
        for (int l = 0; l < 16; l++)
            for (int k = i + 2 * l + 1; k >= i + 2 * l; k--)
                if (k < n) acc[l] = fmaf(ed_bf16_to_fp32(x[k]), ed_bf16_to_fp32(y[k]), acc[l]);
                else acc[l] = fmaf(0.0f, 0.0f, acc[l]);
    return ed_pm_hsum16(acc);
}
static float float_order_dot(int t, int n, const void *x, const void *y) {
    if (t == ED_BF16 && !strcmp(ed_kern->family, "avx512")) return bf16_pair_order_dot(n, x, y);
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(fval(t, x, i + l), fval(t, y, i + l), acc[l]);
    float s = ed_pm_hsum16(acc);
    for (; i < n; i++) s = fmaf(fval(t, x, i), fval(t, y, i), s);
    return s;
}

int main(void) {
    /* every weight type of the one list (ed_types.h ED_TYPES), in its order */
#define W_ID(N, ID, NM, T, BS, VEC, W, A) ED_IF_##W(ED_##N,)
#define W_NAME(N, ID, NM, T, BS, VEC, W, A) ED_IF_##W(#N,)
    static const int types[] = {ED_TYPES(W_ID)};
    static const char *names[] = {ED_TYPES(W_NAME)};
#undef W_ID
#undef W_NAME
    enum { NTYPES = sizeof types / sizeof types[0] };
    /* avx512nv: the AVX-512 path as a CPU without VNNI gets it; avx2nv: the AVX2 path as a
       CPU without AVX-VNNI gets it (the avx2 path takes AVX-VNNI where the CPU has it); neonnd:
       NEON without dotprod. Each label is the path ed_types_init selects for `force`. */
    static const char *paths[] = {"generic", "avx2", "avx2nv", "avx512", "avx512nv", "neon", "neonnd"};
    static const char *force[] = {"generic", "avx2", "avx2-vnni", "avx512", "avx512-vnni", "neon", "neon-dotprod"};
    enum { K = 512, ROWS = 45, COLS = 5 };  /* 45 = 16 + 16 + 13: whole and partial row-kernel calls */
    static uint8_t w[ROWS * K * 4], xq[COLS * K * 4], xq2[COLS * K * 4];
    static float x[COLS * K], ref[COLS * ROWS], got[COLS * ROWS], one[COLS * ROWS], one2[COLS * ROWS];
    int failures = 0;
    for (int i = 0; i < COLS * K; i++) x[i] = rndf();
    printf("features");
    for (int i = 0; ED_CPU_FEATURE_NAMES[i]; i++) if (ed_cpu_features() & (1u << i)) printf(" %s", ED_CPU_FEATURE_NAMES[i]);
    printf("\n");
    /* every compiled path's tables against the one list (ed_types.h): a dot for each weight type,
       a quantizer for each activation format, the sampler's passes; no kernel for a type that is
       no weight type: "tables VARIANT ok" */
    for (int i = 0; i < ED_NPATHS; i++) {
        const ed_kernels *k = &ED_PATHS[i];
        int ok = k->sample != NULL && k->gemm != NULL;
        for (const ed_type_row *r = ED_TYPE_LIST; r->name; r++)
            ok &= (!r->weight || k->dot[r->id] != NULL) && (!r->act || k->quant[r->id] != NULL);
        for (int t = 0; t < ED_NTYPES; t++)
            ok &= ED_TRAITS[t].ref != NULL || (!k->dot[t] && !k->tile[t] && !k->rows[t] &&
                                               !(k->rows_r4 && k->rows_r4[t]) && !k->gemm->unpack[t]);
        printf("tables %s %s\n", k->name, ok ? "ok" : "FAIL");
        failures += !ok;
    }
    for (int p = 0; p < 7; p++) {
        if (!ed_path_supported(force[p])) { printf("%s: not supported here\n", paths[p]); continue; }
        for (int ti = 0; ti < NTYPES; ti++) {
            const int t = types[ti];
            const ed_traits tr = ED_TRAITS[t];
            const size_t rb = (size_t)(K / tr.block) * tr.type_size, xr = ed_act_row_bytes(t, K);
            rng_state = 88172645463325252ull + (uint64_t)ti;  /* the same weights on every path */
            if (t == ED_F32) for (int i = 0; i < ROWS * K; i++) ((float *)w)[i] = rndf();
            else if (t == ED_F16) for (int i = 0; i < ROWS * K; i++) ((ed_half *)w)[i] = ed_fp32_to_fp16(rndf());
            else if (t == ED_BF16) for (int i = 0; i < ROWS * K; i++) ((uint16_t *)w)[i] = ed_fp32_to_bf16(rndf());
            else {
                for (size_t i = 0; i < ROWS * rb; i++) w[i] = (uint8_t)rnd();
                for (size_t b = 0; b < ROWS * rb / tr.type_size; b++) fix_halves(t, w + b * tr.type_size);
                if (t == ED_MXFP4)  /* every 8th row all at 2^-127 .. 2^-124 (E8M0 0..3: the kernels'
                                       halves 2^-128 and 2^-127 are float subnormals) */
                    for (int r = 3; r < ROWS; r += 8)
                        for (size_t b = 0; b < rb / tr.type_size; b++) w[r * rb + b * tr.type_size] = (uint8_t)(rnd() % 4);
            }
            for (int c = 0; c < COLS; c++) ED_ACT[tr.vec_type].ref(x + c * K, xq + c * xr, K);
            for (int c = 0; c < COLS; c++)
                for (int r = 0; r < ROWS; r++) ref[c * ROWS + r] = tr.ref(K, w + r * rb, xq + c * xr);
            double scale = 0;
            for (int i = 0; i < COLS * ROWS; i++) scale = fmax(scale, fabs(ref[i]));
            if (ed_types_init(force[p]) != 0) return 2;
            /* the activation quantizer may be path-specific too: quantize again */
            for (int c = 0; c < COLS; c++) ED_QUANT[tr.vec_type](x + c * K, xq + c * xr, K);
            double err = 0;
            const int canon = tr.block > 1;  /* quantized: bit-identical to the plain C dot */
            int canon_ok = 1;
            uint64_t digest = 1469598103934665603ull;  /* of every dot and tile result (no panels) */
            for (int c = 0; c < COLS; c++)
                for (int r = 0; r < ROWS; r++) {
                    got[c * ROWS + r] = ED_DOT[t](K, w + r * rb, xq + c * xr);
                    err = fmax(err, fabs(got[c * ROWS + r] - ref[c * ROWS + r]));
                }
            digest = fnv(digest, got, COLS * ROWS);
            canon_ok &= !memcmp(got, ref, sizeof(float) * COLS * ROWS);
            /* every row kernel and tile output equal to the path's own dot bit for bit (the
               float types keep the path's dot order: ED_FLOAT_BODY, the float row kernels) */
            static float dots[COLS * ROWS];
            memcpy(dots, got, sizeof dots);
            int same_ok = 1;
            ed_mdot_rows(t, K, w, rb, ROWS, xq, xr, COLS, got, ROWS);
            canon_ok &= !memcmp(got, ref, sizeof(float) * COLS * ROWS);
            same_ok &= !memcmp(got, dots, sizeof(float) * COLS * ROWS);
            for (int i = 0; i < COLS * ROWS; i++) err = fmax(err, fabs(got[i] - ref[i]));
            digest = fnv(digest, got, COLS * ROWS);
            for (int c = 0; c < COLS; c++)  /* matrix-vector rows, per token */
                ed_mdot_rows(t, K, w, rb, ROWS, xq + c * xr, xr, 1, one + c * ROWS, ROWS);
            for (int i = 0; i < COLS * ROWS; i++) err = fmax(err, fabs(one[i] - ref[i]));
            canon_ok &= !memcmp(one, ref, sizeof(float) * COLS * ROWS);
            same_ok &= !memcmp(one, dots, sizeof(float) * COLS * ROWS);
            digest = fnv(digest, one, COLS * ROWS);
            /* the row kernels' other shapes: decode batches of 2 .. COLS - 1 columns, and one
               token over 5 .. 7 rows (a partly filled 8-row step) */
            for (int nc = 2; nc < COLS; nc++) {
                ed_mdot_rows(t, K, w, rb, ROWS, xq, xr, nc, got, ROWS);
                canon_ok &= !memcmp(got, ref, sizeof(float) * nc * ROWS);
                same_ok &= !memcmp(got, dots, sizeof(float) * nc * ROWS);
            }
            for (int nr = 5; nr <= 7; nr++) {
                ed_mdot_rows(t, K, w, rb, nr, xq, xr, 1, got, nr);
                canon_ok &= !memcmp(got, ref, sizeof(float) * nr);
                same_ok &= !memcmp(got, dots, sizeof(float) * nr);
            }
            /* ED_TILE: every column equal to the one-token path bit for bit, for 1..4 columns;
               also over a row length
               whose tails differ: an odd number of 32-blocks (Q4_0's two chains), a float row
               that is not a multiple of 16 (the scalar tail) */
            const int k2 = tr.block == QK ? K - QK : tr.block == 1 ? K - 8 : K;
            for (int k = K; ED_TILE[t] && k >= k2; k -= (K - k2 ? K - k2 : 1)) {
                const size_t kr = ed_act_row_bytes(t, k);
                const float *want = one;
                if (k != K) {
                    for (int c = 0; c < COLS; c++) {
                        ED_QUANT[tr.vec_type](x + c * K, xq2 + c * kr, k);
                        ed_mdot_rows(t, k, w, rb, ROWS, xq2 + c * kr, kr, 1, one2 + c * ROWS, ROWS);
                    }
                    want = one2;
                }
                for (int nc = 1; nc <= ED_MAX_COLS; nc++) {
                    for (int r = 0; r < ROWS; r++) ED_TILE[t](k, w + r * rb, k == K ? xq : xq2, kr, nc, got + r, ROWS);
                    same_ok &= !memcmp(got, want, sizeof(float) * nc * ROWS);
                    if (k == K) canon_ok &= !memcmp(got, ref, sizeof(float) * nc * ROWS);
                }
            }
            failures += !same_ok;
            if (!canon && p > 0) {  /* a SIMD path's float dot in the order above, for K and a tail */
                int fo_ok = 1;
                for (int k = K; k >= K - 8; k -= 8)
                    for (int c = 0; c < COLS; c++)
                        for (int r = 0; r < ROWS; r++) {
                            const float a = ED_DOT[t](k, w + r * rb, xq + c * xr);
                            const float b = float_order_dot(t, k, w + r * rb, xq + c * xr);
                            fo_ok &= !memcmp(&a, &b, sizeof a);
                        }
#if defined(__x86_64__)
                if (t == ED_BF16 && !strcmp(ed_kern->family, "avx512")) {  /* and by the FMA emulation */
                    const int dp = ED_BF16_DP;
                    ED_BF16_DP = 0;
                    for (int k = K; k >= K - 8; k -= 8)
                        for (int c = 0; c < COLS; c++)
                            for (int r = 0; r < ROWS; r++) {
                                const float a = ED_DOT[t](k, w + r * rb, xq + c * xr);
                                const float b = bf16_pair_order_dot(k, (const uint16_t *)(w + r * rb),
                                                                    (const uint16_t *)(xq + c * xr));
                                fo_ok &= !memcmp(&a, &b, sizeof a);
                            }
                    ED_BF16_DP = dp;
                }
#endif
                printf("floatorder %s %s %s\n", paths[p], names[ti], fo_ok ? "ok" : "FAIL");
                failures += !fo_ok;
            }
            if (ed_gemm_ok(t)) {  /* packed panels, as a prompt batch uses them */
                static ed_ginfo info[COLS * (K / 32 + K / 16)];
                static uint8_t scratch[K * 64 + 4096] __attribute__((aligned(64)));
                const size_t il = ed_gemm_info_len(K);
                for (int c = 0; c < COLS; c++) ed_gemm_info(tr.vec_type, K, xq + c * xr, info + c * il);
                /* every token count: 1 .. COLS columns of the same activations */
                for (int nc = 1; nc <= COLS; nc++) {
                    ed_gemm_rows(t, K, w, rb, ROWS, xq, xr, info, il, nc, got, ROWS, scratch);
                    canon_ok &= !memcmp(got, ref, sizeof(float) * nc * ROWS);
                }
                double gerr = 0;
                for (int i = 0; i < COLS * ROWS; i++) gerr = fmax(gerr, fabs(got[i] - ref[i]));
                printf("%s %s panels max_abs_err %.3g\n", paths[p], names[ti], gerr);
                err = fmax(err, gerr);
            }
            printf("digest %s %s %016llx %s%s%s\n", paths[p], names[ti], (unsigned long long)digest,
                   ED_DOT[t] == tr.ref ? "generic-dot" : "simd-dot",
                   ED_TILE[t] ? (same_ok ? " same-ok" : " same-FAIL") : "",
                   canon ? (canon_ok ? " canon-ok" : " canon-FAIL") : "");
            failures += canon && !canon_ok;
            const int ok = err <= 1e-4 * (scale + 1e-3);
            failures += !ok;
            printf("%s %s max_abs_err %.3g scale %.3g %s\n", paths[p], names[ti], err, scale, ok ? "ok" : "FAIL");
            /* Weights repacked at load (ed_repack.h, the R4 layout): the path's R4 row kernel
               (or the generic twin), for 1 .. COLS columns and every row count the engine's
               tiles give, and the packed panels over the repacked rows equal the plain C dot on
               the mapped rows bit for bit; each row rebuilds to its mapped bytes:
               "repack PATH TYPE rows panels ok" */
            if (ed_r4_ok(t, K, ED_R4_ROWS)) {
                enum { G = ED_R4_ROWS, RR = ROWS - ROWS % G };
                static uint8_t wr[ROWS * K * 2], tmp[G * K * 2], back[K * 2];
                ed_r4_pack(t, K, w, rb, RR, wr, tmp);
                int rok = 1;
                for (int r = 0; r < RR; r++) {
                    ed_r4_unpack_row(t, K, wr + (size_t)(r / G) * G * rb, r % G, back);
                    rok &= !memcmp(back, w + r * rb, rb);
                }
                for (int nc = 1; nc <= COLS; nc++) {
                    ed_mdot_rows_r4(t, K, wr, rb, RR, xq, xr, nc, got, ROWS);
                    for (int c = 0; c < nc; c++) rok &= !memcmp(got + c * ROWS, ref + c * ROWS, sizeof(float) * RR);
                }
                static const int tiles[] = {G, 2 * G, 3 * G, 4 * G, 5 * G, 7 * G};  /* as ed_rows hands them out */
                for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++)
                    for (int r0 = 0; r0 + tiles[i] <= RR; r0 += 2 * G) {
                        ed_mdot_rows_r4(t, K, wr + (size_t)r0 * rb, rb, tiles[i], xq, xr, 1, got, ROWS);
                        rok &= !memcmp(got, ref + r0, sizeof(float) * tiles[i]);
                    }
                if (ed_gemm_ok(t)) {
                    /* 1 .. 9 tokens (the columns again from the 6th: ED_FN(gemm_r4)'s tiles of 4
                       tokens, then 3, 2, 1), every panel height (groups of G rows up to RR: whole
                       panels and partial ones), and an odd number of blocks (K - 32:
                       the 16 x 4 tile's lone first block), against the plain C dot */
                    enum { NC = 9 };
                    static ed_ginfo rinfo[NC * (K / 32 + K / 16)];
                    static float rdy[NC * K / 32 + 64], want[NC * ROWS], got9[NC * ROWS];
                    static uint8_t rscratch[K * 64 + 4096] __attribute__((aligned(64))), xq9[NC * K * 4];
                    const size_t il = ed_gemm_info_len(K);
                    static const int pr[] = {G, 2 * G, 3 * G, 4 * G, 5 * G, RR};
                    int pok = 1;
                    for (int k = K; k >= K - QK && k % tr.block == 0; k -= QK) {  /* K-quants: whole super-blocks */
                        for (int c = 0; c < NC; c++) {
                            memcpy(xq9 + c * xr, xq + (c % COLS) * xr, xr);
                            ed_gemm_info(tr.vec_type, k, xq9 + c * xr, rinfo + c * il);
                            if (ed_gemm_reads_dy(t, ED_LAYOUT_R4)) ed_gemm_dy_r4(k, xq9 + c * xr, c, rdy);
                            for (int r = 0; r < ROWS; r++) want[c * ROWS + r] = tr.ref(k, w + r * rb, xq9 + c * xr);
                        }
                        for (int nc = 1; nc <= NC; nc++)
                            for (size_t i = 0; i < sizeof pr / sizeof pr[0]; i++) {
                                ed_gemm_rows_layout(t, ED_LAYOUT_R4, k, wr, rb, pr[i], xq9, xr, rinfo, il, rdy, nc, got9,
                                                    ROWS, rscratch);
                                for (int c = 0; c < nc; c++)
                                    pok &= !memcmp(got9 + c * ROWS, want + c * ROWS, sizeof(float) * pr[i]);
                            }
                    }
                    rok &= pok;
                    /* the path's own kernel for panels packed from R4 groups (NEON+dotprod) */
                    if (ed_gemm_own_r4(t)) printf("repack %s %s panels kernel_r4 %s\n", paths[p], names[ti], pok ? "ok" : "FAIL");
                }
                printf("repack %s %s rows%s %s\n", paths[p], names[ti], ed_gemm_ok(t) ? " panels" : "",
                       rok ? "ok" : "FAIL");
                failures += !rok;
            }
            /* Row kernels at the edge of their integer ranges: every weight at the value whose
               products with |q| = 127 are largest (the i16 sums the kernels keep without VNNI
               must still be exact), against columns of +127 and -127, equal to the plain C dot
               bit for bit: "extreme PATH TYPE rows ok". Q4_0 and Q5_0 go into the x86 products
               unsigned (nibble 0..15, 0..31: fill 0xFF) with the offset taken off by the columns'
               block sums; their signed extreme (-8, -16: fill 0x00) is checked too. The R4 row
               kernels too, also on paths where the mapped rows have none (the K-quants with VNNI;
               Q6_K: weights 63 with scales -1 (0xFF), and scales -128 (0x80); Q2_K: weights 3,
               scales and mins 15; Q3_K: weights 3 (7 - 4) with scales 31, and -4 with -32;
               IQ4_XS: weights -127 with scales -32, and 113 with 31). */
            if ((ED_ROWS[t] && tr.block > 1) || ed_r4_wanted(t)) {  /* the quantized types' ranges */
                static const struct { int type; uint8_t fill; } edge[] = {
                    {ED_Q4_0, 0x00}, {ED_Q4_0, 0xFF}, {ED_Q5_0, 0x00}, {ED_Q5_0, 0xFF}, {ED_Q8_0, 0x80},
                    {ED_Q4_1, 0xFF}, {ED_Q5_1, 0xFF}, {ED_IQ4_NL, 0x00}, {ED_MXFP4, 0x77}, {ED_Q4_K, 0xFF},
                    {ED_Q5_K, 0xFF}, {ED_Q6_K, 0xFF}, {ED_Q6_K, 0x80}, {ED_Q2_K, 0xFF}, {ED_Q3_K, 0xFF}, {ED_Q3_K, 0x00},
                    {ED_IQ4_XS, 0x00}, {ED_IQ4_XS, 0xFF}};
                enum { ER = 16 };  /* the x86 kernels take 16 rows per call: both halves */
                static uint8_t we[ER * K * 2], xe[4 * K * 2];
                static float fe[4 * K], ge[4 * ER];
                int fills = 0, eok = 1;
                for (size_t e = 0; e < sizeof edge / sizeof edge[0]; e++) {
                    if (edge[e].type != t) continue;
                    fills++;
                    memset(we, edge[e].fill, ER * rb);
                    for (size_t b = 0; b < ER * rb / tr.type_size; b++) fix_halves(t, we + b * tr.type_size);
                    for (int c = 0; c < 4; c++) for (int i = 0; i < K; i++) fe[c * K + i] = c & 1 ? -1.0f : 1.0f;
                    for (int c = 0; c < 4; c++) ED_QUANT[tr.vec_type](fe + c * K, xe + c * xr, K);
                    for (int layout = 0; layout < 2; layout++) {  /* mapped, then repacked (R4) */
                        static uint8_t wr[ER * K * 2], tmp[ED_R4_ROWS * K * 2];
                        if (layout && !ed_r4_ok(t, K, ER)) break;
                        if (layout) ed_r4_pack(t, K, we, rb, ER, wr, tmp), ed_mdot_rows_r4(t, K, wr, rb, ER, xe, xr, 4, ge, ER);
                        else ed_mdot_rows(t, K, we, rb, ER, xe, xr, 4, ge, ER);
                        for (int c = 0; c < 4; c++)
                            for (int r = 0; r < ER; r++) {
                                const float want = tr.ref(K, we + r * rb, xe + c * xr);
                                eok &= !memcmp(&want, &ge[c * ER + r], sizeof want);
                            }
                    }
                }
                eok &= fills > 0;
                printf("extreme %s %s rows %s\n", paths[p], names[ti], eok ? "ok" : "FAIL");
                failures += !eok;
            }
            /* Packed panels of the wide types (u = w + 128 spans 0..255: Q8_0, IQ4_NL, IQ4_XS) at
               the edge of their integer ranges: every byte 0x7F / 0xFF (u = 255, 241; IQ4_XS's
               scales at their largest) and 0x80 / 0x00 (u = 0, 1; scales at -32) against columns
               of +127 and -127, equal to the plain C dot bit for bit. Without VNNI the x86 panels
               sum their nibbles' pairs in i16: "extreme PATH TYPE panels ok" */
            if (ed_gemm_ok(t) && ED_GEMM_TRAITS[t].wide) {
                const uint8_t fills[2][2] = {{0x7F, 0x80}, {0xFF, 0x00}};
                enum { ER = 2 * ED_PANEL };
                static uint8_t we[ER * K * 2], xe[4 * K * 2];
                static uint8_t escratch[K * 64 + 4096] __attribute__((aligned(64)));
                static ed_ginfo einfo[4 * (K / 32 + K / 16)];
                static float fe[4 * K], ge[4 * ER];
                const size_t il = ed_gemm_info_len(K);
                int eok = 1;
                for (int f = 0; f < 2; f++) {
                    const uint8_t fill = fills[t != ED_Q8_0][f];
                    memset(we, fill, ER * rb);
                    for (size_t b = 0; b < ER * rb / tr.type_size; b++) fix_halves(t, we + b * tr.type_size);
                    for (int c = 0; c < 4; c++) for (int i = 0; i < K; i++) fe[c * K + i] = c & 1 ? -1.0f : 1.0f;
                    for (int c = 0; c < 4; c++) ED_QUANT[tr.vec_type](fe + c * K, xe + c * xr, K);
                    for (int c = 0; c < 4; c++) ed_gemm_info(tr.vec_type, K, xe + c * xr, einfo + c * il);
                    ed_gemm_rows(t, K, we, rb, ER, xe, xr, einfo, il, 4, ge, ER, escratch);
                    for (int c = 0; c < 4; c++)
                        for (int r = 0; r < ER; r++) {
                            const float want = tr.ref(K, we + r * rb, xe + c * xr);
                            eok &= !memcmp(&want, &ge[c * ER + r], sizeof want);
                        }
                }
                printf("extreme %s %s panels %s\n", paths[p], names[ti], eok ? "ok" : "FAIL");
                failures += !eok;
            }
#if defined(__x86_64__)
            /* Q4_0 / Q5_0 rows of more than ED_ROWS_CS_MAX blocks (K = 16640): the x86 row kernels
               then form the columns' block sums per 16 rows instead of once per call; equal to the
               plain C dot bit for bit: "long PATH TYPE rows ok" */
            if (ED_ROWS[t] && (t == ED_Q4_0 || t == ED_Q5_0)) {
                enum { LK = 32 * 520, LR = 16 };
                static uint8_t wl[LR * LK], xl[4 * LK];
                static float fl[2 * LK], gl[2 * LR];
                const size_t lrb = (size_t)(LK / tr.block) * tr.type_size, lxr = ed_act_row_bytes(t, LK);
                for (size_t i = 0; i < LR * lrb; i++) wl[i] = (uint8_t)rnd();
                for (size_t b = 0; b < LR * lrb / tr.type_size; b++) fix_halves(t, wl + b * tr.type_size);
                for (int i = 0; i < 2 * LK; i++) fl[i] = rndf();
                for (int c = 0; c < 2; c++) ED_QUANT[tr.vec_type](fl + c * LK, xl + c * lxr, LK);
                ed_mdot_rows(t, LK, wl, lrb, LR, xl, lxr, 2, gl, LR);
                int lok = 1;
                for (int c = 0; c < 2; c++)
                    for (int r = 0; r < LR; r++) {
                        const float want = tr.ref(LK, wl + r * lrb, xl + c * lxr);
                        lok &= !memcmp(&want, &gl[c * LR + r], sizeof want);
                    }
                printf("long %s %s rows %s\n", paths[p], names[ti], lok ? "ok" : "FAIL");
                failures += !lok;
            }
#endif
        }
    }
    /* attention over a quantized KV cache (forward.h: ed_kv_store, ed_attention_exact) on every
       path against the generic one: the stored rows must be the same bytes, the outputs agree
       to float rounding. One line per path and cache type pair: "kvcache PATH K/V ... ok". */
    {
        enum { HD = 64, NH = 4, NKV = 2, NCTX = 40, NT = 3, KVD = NKV * HD, QD = NH * HD };
        static const int kt[] = {ED_Q8_0, ED_Q4_0, ED_Q8_0, ED_F16}, vt[] = {ED_Q8_0, ED_Q4_0, ED_F16, ED_Q8_0};
        static float kv[2][NCTX * KVD], q[NT * (QD + 2 * KVD)], out[NT * QD], want[4][NT * QD];
        static uint8_t kc[NCTX * KVD * 2], vc[NCTX * KVD * 2], kc0[4][NCTX * KVD * 2], vc0[4][NCTX * KVD * 2];
        static float att[NCTX + 64 * HD], vacc[80 * HD];
        static uint16_t qh[HD];
        for (int i = 0; i < NCTX * KVD; i++) { kv[0][i] = rndf(); kv[1][i] = rndf(); }
        for (int i = 0; i < NT * (QD + 2 * KVD); i++) q[i] = rndf();
        ed_layer layer; ed_model m; ed_state s;
        memset(&layer, 0, sizeof layer); memset(&m, 0, sizeof m); memset(&s, 0, sizeof s);
        m.head_dim = HD; m.n_head = NH; m.n_head_kv = NKV; m.attn_scale = 0.125f; m.n_layer = 1;
        m.layers = &layer;
        layer.head_dim = HD; layer.n_head_kv = NKV; layer.kv_src = 0;  /* the layer's own sizes */
        static size_t kv_off[2];  /* one layer: its K and V rows start at 0 */
        s.m = &m; s.kv_off = kv_off;
        s.n_ctx = NCTX; s.n_tokens = NT; s.pos = NCTX - NT; s.qkv = q; s.xb = out; s.att = att;
        s.att_stride = NCTX; s.qh = qh; s.vacc = vacc; s.k_cache = kc; s.v_cache = vc;
        for (int p = 0; p < 7; p++) {
            if (!ed_path_supported(force[p])) continue;
            for (int c = 0; c < 4; c++) {
                if (ed_types_init(force[p]) != 0) return 2;
                s.type_k = kt[c]; s.type_v = vt[c];
                s.k_row = ed_kv_bytes(kt[c], KVD); s.v_row = ed_kv_bytes(vt[c], KVD);
                for (int j = 0; j < NCTX; j++) {
                    ed_kv_store(kt[c], kv[0] + j * KVD, kc + j * s.k_row, KVD);
                    ed_kv_store(vt[c], kv[1] + j * KVD, vc + j * s.v_row, KVD);
                }
                ed_attention_exact(&s, &m, 0, 0, 1, QD + 2 * KVD);
                int same = 1;
                double err = 0, scale = 0;
                if (p == 0) {
                    memcpy(want[c], out, sizeof out);
                    memcpy(kc0[c], kc, sizeof kc); memcpy(vc0[c], vc, sizeof vc);  /* generic runs first */
                } else {
                    same = !memcmp(kc, kc0[c], NCTX * s.k_row) && !memcmp(vc, vc0[c], NCTX * s.v_row);
                }
                for (int i = 0; i < NT * QD; i++) {  /* (not fmax: aarch64 gcc 13's vectorizer stops on it) */
                    const double e = fabs((double)out[i] - want[c][i]), w = fabs((double)want[c][i]);
                    if (e > err) err = e;
                    if (w > scale) scale = w;
                }
                const int ok = same && err <= 1e-4 * (scale + 1e-3) && scale > 0;
                failures += !ok;
                printf("kvcache %s %s/%s max_abs_err %.3g scale %.3g %s %s\n", paths[p],
                       kt[c] == ED_F16 ? "f16" : kt[c] == ED_Q8_0 ? "q8_0" : "q4_0",
                       vt[c] == ED_F16 ? "f16" : vt[c] == ED_Q8_0 ? "q8_0" : "q4_0", err, scale,
                       same ? "same-bytes" : "other-bytes", ok ? "ok" : "FAIL");
            }
        }
    }
    /* quantizer bytes must not depend on the architecture: print a hash per type */
    {
        static float qx[8 * QKK];
        static uint8_t qy[8 * QKK * 2];
        rng_state = 12345;
        for (int i = 0; i < 8 * QKK; i++) qx[i] = rndf() * (i % 512 < 256 ? 1.0f : 0.01f);
        static const int qt[] = {ED_Q4_0, ED_Q4_1, ED_Q5_0, ED_Q5_1, ED_Q8_0, ED_Q2_K, ED_Q3_K, ED_Q4_K, ED_Q5_K, ED_Q6_K,
                                 ED_IQ4_NL, ED_IQ4_XS, ED_MXFP4};
        for (int i = 0; i < (int)(sizeof qt / sizeof qt[0]); i++) {
            ed_types_init("generic");
            const size_t nb = (size_t)(8 * QKK / ED_TRAITS[qt[i]].block) * ED_TRAITS[qt[i]].type_size;
            ed_quantize_row(qt[i], qx, qy, 8 * QKK);
            uint64_t h = 1469598103934665603ull;
            for (size_t j = 0; j < nb; j++) { h ^= qy[j]; h *= 1099511628211ull; }
            printf("quant %d %016llx\n", qt[i], (unsigned long long)h);
        }
    }
    {   /* the vector expf (softmax) and SiLU of this CPU's SIMD dispatch (ed_parity.h: AVX2 on
           x86, NEON on aarch64) equal the scalar code bit for bit, also past the exponent
           field, at +-0, +-inf and NaN: "parity simd expf silu ok" */
        enum { NP = 4096 + 7 };
        static float x[NP], u[NP], e1[NP], e2[NP], g1[NP], g2[NP];
        for (int i = 0; i < NP; i++) {
            const float r = rndf();
            x[i] = i % 3 == 0 ? r * 200.0f : i % 3 == 1 ? r * 12.0f : r * 0.01f;
            u[i] = rndf();
        }
        const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.7f, -88.7f, 103.0f, -103.0f, 1e30f, -1e30f};
        for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++) x[100 + 5 * i] = special[i];
        /* the SIMD table: the best path this CPU runs (x86: avx2 or avx512, aarch64: neon) */
        const ed_kernels *pk = ed_path_find(NULL);
        const ed_pm_fns none = {NULL}, *pm = pk && strcmp(pk->family, "generic") ? &pk->pm : &none;
        const int simd = pm->dot_f16 != NULL;
        ed_pm_expf_sub(pm, NP, x, 0.5f, e1);
        ed_pm_expf_sub(&none, NP, x, 0.5f, e2);
        memcpy(g1, x, sizeof x); memcpy(g2, x, sizeof x);
        ed_pm_silu_mul(pm, NP, g1, u);
        ed_pm_silu_mul(&none, NP, g2, u);
        int pok = 1;  /* bit for bit; a NaN's sign may differ (libm's fmaf against FMA's) */
        for (int i = 0; i < NP; i++)
            pok &= (isnan(e1[i]) ? isnan(e2[i]) : !memcmp(e1 + i, e2 + i, 4)) &&
                   (isnan(g1[i]) ? isnan(g2[i]) : !memcmp(g1 + i, g2 + i, 4));
        printf("parity %s expf silu %s\n", simd ? "simd" : "scalar", pok ? "ok" : "FAIL");
        failures += !pok;
        /* the F16 dot of attention (one row: 64 lanes, a batch: 16 lanes) over head sizes with
           and without a tail past the 64 lanes: "parity simd dot ok" */
        static ed_half h1[NP], h2[NP];
        for (int i = 0; i < NP; i++) h1[i] = ed_fp32_to_fp16(x[i] * 0.01f), h2[i] = ed_fp32_to_fp16(u[i]);
        h1[7] = ed_fp32_to_fp16(60000.0f); h2[7] = ed_fp32_to_fp16(60000.0f);  /* a product past F16, an inf in the sum */
        int dok = 1;
        static const int dn[] = {16, 48, 64, 80, 96, 128, 256, 4096};
        for (int b = 0; b < 2; b++)
            for (size_t i = 0; i < sizeof dn / sizeof dn[0]; i++)
                for (int o = 0; o + dn[i] <= NP && o < 64 * 4; o += 64) {
                    const float d1 = pm_dot(pm, b, dn[i], h1 + o, h2 + o), d2 = pm_dot(&none, b, dn[i], h1 + o, h2 + o);
                    dok &= !memcmp(&d1, &d2, 4);
                }
        printf("parity %s dot %s\n", simd ? "simd" : "scalar", dok ? "ok" : "FAIL");
        failures += !dok;
        /* the query's and the cache's F16 rows (ed_pm_f16_row: +-0, +-inf, NaN, overflow, F16
           subnormals and halfway cases) and the lane reduction of attention over fewer keys than
           lanes (ed_pm_reduce_lanes_sparse) equal the scalar code: "parity simd f16 lanes ok" */
        static ed_half f1[NP], f2[NP];
        static float fx[NP];
        for (int i = 0; i < NP; i++)
            fx[i] = i % 4 == 0 ? x[i] * 1e-6f : i % 4 == 1 ? x[i] * 400.0f : i % 4 == 2 ? x[i] : ldexpf(1.0f + (float)(i % 8) / 2048.0f, -14 - i % 12);
        ed_pm_f16_row(pm, NP, fx, f1);
        for (int i = 0; i < NP; i++) f2[i] = ed_fp32_to_fp16(fx[i]);
        int lok = !memcmp(f1, f2, sizeof f1);
        memcpy(g1, fx, sizeof fx); memcpy(g2, fx, sizeof fx);  /* the softmax row's F16 rounding */
        ed_pm_round_scale(pm, NP, g1, 0.37f);
        ed_pm_round_scale(&none, NP, g2, 0.37f);
        lok &= !memcmp(g1, g2, sizeof g1);
        enum { HD = 80 };
        static float lr[64][HD], zr[HD], tmp[16 * HD], o1[HD], o2[HD];
        const float *lp[64];
        static const int used[] = {1, 2, 5, 16, 17, 33, 63};
        for (size_t u = 0; u < sizeof used / sizeof used[0]; u++)
            for (int j0 = 0; j0 < 64; j0 += 23) {
                for (int l = 0; l < 64; l++) lp[l] = zr;
                for (int j = j0; j < j0 + used[u]; j++) {
                    for (int i = 0; i < HD; i++) lr[j % 64][i] = i % 7 == 0 ? 0.0f : x[(j * HD + i) % NP];
                    lp[j % 64] = lr[j % 64];
                }
                ed_pm_reduce_lanes(HD, 64, lp, tmp, o1);
                ed_pm_reduce_lanes_sparse(HD, lp, zr, tmp, o2);
                lok &= !memcmp(o1, o2, sizeof o1);
            }
        printf("parity %s f16 lanes %s\n", simd ? "simd" : "scalar", lok ? "ok" : "FAIL");
        failures += !lok;
    }
    {   /* each path's Q8_0 and Q8_1 activation quantizers (ED_QUANT) give ed_quant_q8_0's and
           ed_quant_q8_1's bytes: random rows, an all-zero block, halves at the rounding boundary
           (amax 127: the multiplier is 1, so 2.5 and -3.5 are ties to even), +-0 and a block past
           the int8 range of a plain cast: "actquant PATH Q8_0 same-bytes ok", "... Q8_1 ..." */
        enum { NQ = 64 * QK };
        static float qx[NQ];
        static uint8_t q1[NQ * 2], q2[NQ * 2];
        rng_state = 777;
        for (int i = 0; i < NQ; i++) qx[i] = rndf() * (i % 96 < 32 ? 100.0f : 0.02f);
        for (int i = 0; i < QK; i++) qx[i] = 0.0f;
        for (int i = 0; i < QK; i++) qx[QK + i] = i == 0 ? 127.0f : (float)(i % 9) - 4.5f + (i & 1 ? 0.0f : 1.0f);
        qx[2 * QK] = -0.0f; qx[2 * QK + 1] = 2.5f; qx[2 * QK + 2] = -127.0f;
        for (int i = 0; i < QK; i++) qx[3 * QK + i] = i == 5 ? -3e38f : 1e37f * (float)(i - 16);
        static const struct { int type; const char *name; size_t blk; void (*ref)(const float *, void *, int); } aq[] = {
            {ED_Q8_0, "Q8_0", sizeof(blk_q8_0), ed_quant_q8_0}, {ED_Q8_1, "Q8_1", sizeof(blk_q8_1), ed_quant_q8_1}};
        for (int a = 0; a < 2; a++) {
            aq[a].ref(qx, q2, NQ);
            for (int p = 0; p < 7; p++) {
                if (!ed_path_supported(force[p])) continue;
                ed_types_init(force[p]);
                memset(q1, 0xA5, sizeof q1);
                ED_QUANT[aq[a].type](qx, q1, NQ);
                const int qok = !memcmp(q1, q2, (size_t)NQ / QK * aq[a].blk);
                printf("actquant %s %s same-bytes %s\n", paths[p], aq[a].name, qok ? "ok" : "FAIL");
                failures += !qok;
            }
        }
    }
    return failures ? 1 : 0;
}
