/* The same weights of a type with an R4 layout in the mapped layout and repacked (R4,
 * ed_repack.h) in one process: one token, 4 sessions and a 64-token prompt through the packed
 * panels, the two layouts' passes alternated, best of PASSES in thread CPU time (a busy machine
 * inflates both alike), and whether the two layouts give the same bits (they must). "% of a read":
 * the one-token R4 pass against a plain read of the same buffer (ed_readbw.h), best of PASSES.
 *
 *   gcc -O3 -std=gnu11 -pthread -Icython_kernels/kernels -Icython_kernels/forward tools/bench_r4.c -lm -o /tmp/bench_r4
 *   /tmp/bench_r4 TYPE K [MIB] [PATH] [PASSES]      e.g. /tmp/bench_r4 Q4_0 896 128 avx2-vnni 11
 *
 * Rows are walked in chunks of 112 as the engine's threads take a 0.5B model's 896-row
 * matrices; PATH as in bench_tiles.c (default: the best this CPU runs). */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sys/mman.h>
#include "forward.h"
#include "ed_quant.h"
#include "ed_readbw.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { CHUNK = 112, NP = 64 };

static void rows(int type, int layout, int K, const uint8_t *w, size_t rb, int R, const uint8_t *xq, size_t xs, int nc, float *out) {
    for (int r = 0; r < R; r += CHUNK) {
        const int n = R - r < CHUNK ? R - r : CHUNK;
        if (layout == ED_LAYOUT_R4) ed_mdot_rows_r4(type, K, w + r * rb, rb, n, xq, xs, nc, out + r, R);
        else ed_mdot_rows(type, K, w + r * rb, rb, n, xq, xs, nc, out + r, R);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s Q4_0|Q4_1|Q5_0|Q5_1|Q8_0|IQ4_NL|MXFP4|Q2_K|Q3_K|Q4_K|Q5_K|Q6_K|IQ4_XS K [MIB] [PATH] [PASSES]\n", argv[0]); return 2; }
    static const char *const names[ED_NTYPES] = {[ED_Q4_0] = "Q4_0", [ED_Q4_1] = "Q4_1", [ED_Q5_0] = "Q5_0",
        [ED_Q5_1] = "Q5_1", [ED_Q8_0] = "Q8_0", [ED_IQ4_NL] = "IQ4_NL", [ED_MXFP4] = "MXFP4", [ED_Q4_K] = "Q4_K",
        [ED_Q5_K] = "Q5_K", [ED_Q6_K] = "Q6_K", [ED_Q2_K] = "Q2_K", [ED_Q3_K] = "Q3_K", [ED_IQ4_XS] = "IQ4_XS"};
    int type = -1;
    for (int t = 0; t < ED_NTYPES; t++) if (names[t] && !strcmp(argv[1], names[t])) type = t;
    const int K = atoi(argv[2]), mib = argc > 3 ? atoi(argv[3]) : 128, passes = argc > 5 ? atoi(argv[5]) : 9;
    if (type < 0 || !ed_r4_ok(type, K, ED_R4_ROWS) || K <= 0 || K % ED_TRAITS[type].block || mib <= 0 || passes <= 0) { fprintf(stderr, "bad TYPE, K, MIB or PASSES\n"); return 2; }
    if (ed_types_init(argc > 4 ? argv[4] : NULL) != 0) { fprintf(stderr, "path %s not supported here\n", argv[4]); return 2; }
    ed_pm_init();
    const size_t rb = (size_t)K / ED_TRAITS[type].block * ED_TRAITS[type].type_size;
    const int R = (int)((size_t)mib * 1048576 / rb / 16 * 16);
    /* on 2 MiB pages where the kernel allows (THP "madvise"), as the engine's numpy arena */
    const size_t wb = (rb * R + 2097151) & ~(size_t)2097151;
    uint8_t *w[2] = {aligned_alloc(2097152, wb), aligned_alloc(2097152, wb)};
    for (int l = 0; l < 2; l++) madvise(w[l], wb, MADV_HUGEPAGE);
    float *xf = malloc(sizeof(float) * K * 4);
    srand(1);
    for (int r = 0; r < R; r++) {  /* really quantized rows, a few different ones */
        if (r < 8) for (int i = 0; i < K; i++) xf[i] = rand() / (float)RAND_MAX - 0.5f;
        if (r < 8) ed_quantize_row(type, xf, w[0] + r * rb, K);
        else memcpy(w[0] + r * rb, w[0] + (r % 8) * rb, rb);
    }
    uint8_t *tmp = malloc(ED_R4_ROWS * rb);
    ed_r4_pack(type, K, w[0], rb, R, w[1], tmp);
    const int vt = ED_TRAITS[type].vec_type;
    const size_t kr = ed_act_row_bytes(type, K);
    uint8_t *xq = aligned_alloc(64, (kr * NP + 63) & ~(size_t)63);
    const size_t il = ed_gemm_info_len(K);
    ed_ginfo *info = malloc(sizeof(ed_ginfo) * il * NP);
    float *dy = malloc(sizeof(float) * ed_gemm_dy_len(NP, K));
    for (int c = 0; c < NP; c++) {
        if (c < 4) for (int i = 0; i < K; i++) xf[c * K + i] = rand() / (float)RAND_MAX - 0.5f;
        ED_QUANT[vt](xf + (c % 4) * K, xq + c * kr, K);
        ed_gemm_info(vt, K, xq + c * kr, info + c * il);
        if (vt == ED_Q8_0) ed_gemm_dy_r4(K, xq + c * kr, c, dy);
    }
    const int RP = R < (int)(16 * 1048576 / rb) ? R : (int)(16 * 1048576 / rb) / 16 * 16;  /* panels: 16 MiB */
    uint8_t *scratch = aligned_alloc(64, ed_gemm_scratch(K));
    float *out[2] = {malloc(sizeof(float) * (size_t)R * NP), malloc(sizeof(float) * (size_t)R * NP)};
    double best[2][3] = {{1e9, 1e9, 1e9}, {1e9, 1e9, 1e9}}, best_read = 1e9;
    int same = 1;
    volatile uint64_t sink = 0;
    for (int it = 0; it < passes; it++) {
        const double t0 = now();  /* a plain read of the repacked buffer, the ceiling of one token */
        sink ^= ed_read_pass(w[1], rb * (size_t)R);
        const double tr = now() - t0;
        if (tr < best_read) best_read = tr;
        for (int m = 0; m < 3; m++) {  /* one token, 4 sessions, the prompt */
            for (int l = 0; l < 2; l++) {
                const double t0 = now();
                if (m < 2) rows(type, l, K, w[l], rb, R, xq, kr, m ? 4 : 1, out[l]);
                else if (ed_gemm_ok(type)) ed_gemm_rows_layout(type, l, K, w[l], rb, RP, xq, kr, info, il, dy, NP, out[l], RP, scratch);
                const double t = now() - t0;
                if (t < best[l][m]) best[l][m] = t;
            }
            const size_t nout = m == 2 ? (size_t)RP * NP : (size_t)R * (m ? 4 : 1);
            same &= !memcmp(out[0], out[1], sizeof(float) * nout);
        }
    }
    printf("%s %s K=%d, %d MiB: one token mapped %.2f ms, R4 %.2f ms (%.3fx; R4 %.1f GB/s, %.0f%% of a read); 4 sessions %.2f / %.2f ms (%.3fx; "
           "4 vs 1: %.2fx / %.2fx); prompt panels (64 tokens, 16 MiB) %.2f / %.2f ms (%.3fx); bits %s\n",
           ed_kern->name, argv[1], K, mib, best[0][0] * 1e3, best[1][0] * 1e3, best[1][0] / best[0][0], mib * 1048576.0 / best[1][0] * 1e-9, 100 * best_read / best[1][0],
           best[0][1] * 1e3, best[1][1] * 1e3, best[1][1] / best[0][1], best[0][1] / best[0][0], best[1][1] / best[1][0],
           best[0][2] * 1e3, best[1][2] * 1e3, best[1][2] / best[0][2], same ? "same" : "DIFFER");
    return same ? 0 : 1;
}
