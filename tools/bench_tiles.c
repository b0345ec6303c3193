/* Decode-batch tiles and prompt panels against the one-token kernel, one thread: the cost of 2
 * and 4 sessions' columns over weights larger than the caches, relative to one token, and of a
 * 64-token prompt batch through the packed panels (ed_gemm.h) per token.
 *
 *   gcc -O3 -std=gnu11 -pthread -Icython_kernels/kernels -Icython_kernels/forward tools/bench_tiles.c -lm -o /tmp/bench_tiles
 *   /tmp/bench_tiles TYPE K [MIB] [PATH] [PASSES]      e.g. /tmp/bench_tiles Q5_0 896 256 avx512
 *
 * TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K; PATH: generic, avx2, avx512, neon, or
 * avx2-vnni / avx512-vnni / neon-dotprod (the variant without that feature; default: the best
 * this CPU runs); MIB of weights (default 256). One token goes through ed_mdot_rows (the engine's
 * one-token path: row kernels or the dot), the batch as forward.h's ed_rows calls it (the row
 * kernels where the type has them, else the tile ED_TILE per row). Best of PASSES (default 9) passes each, interleaved, in thread CPU time (so a busy machine inflates
 * them less than wall time). Built against another checkout's headers (-I../base/...), the
 * same source measures that checkout: compare the printed ms side by side.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include "forward.h"
#include "ed_quant.h"

static double now(void) {  /* this thread's CPU time: the figures hold on a shared machine */
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* rows per ed_mdot_rows call: a thread's chunk as forward.h's ed_chunk_rows makes it for a
 * 0.5B model's 896-row matrices on one thread: 112 rows) */
enum { CHUNK = 112 };

/* the next token of nc sessions, as forward.h's ed_rows runs a decode batch */
static void batch(int type, int K, const uint8_t *w, size_t rb, int R, const uint8_t *xs, size_t sr, int nc, float *out) {
#ifdef ED_ROWS_N  /* row kernels (rows as lanes) take every column */
    if (ED_ROWS[type]) {
        for (int r = 0; r < R; r += CHUNK) ed_mdot_rows(type, K, w + r * rb, rb, R - r < CHUNK ? R - r : CHUNK, xs, sr, nc, out + r, R);
        return;
    }
#endif
    for (int r = 0; r < R; r++) ED_TILE[type](K, w + r * rb, xs, sr, nc, out + r, R);
}

int main(int argc, char **argv) {
    static const char *names[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};
    static const int types[] = {ED_Q4_0, ED_Q4_1, ED_Q5_0, ED_Q5_1, ED_Q8_0, ED_Q2_K, ED_Q3_K, ED_Q4_K, ED_Q5_K, ED_Q6_K};
    if (argc < 3) { fprintf(stderr, "usage: %s TYPE K [MIB] [PATH] [PASSES]\n", argv[0]); return 2; }
    int type = -1;
    for (int i = 0; i < 10; i++) if (!strcmp(argv[1], names[i])) type = types[i];
    const int K = atoi(argv[2]), mib = argc > 3 ? atoi(argv[3]) : 256, passes = argc > 5 ? atoi(argv[5]) : 9;
    if (type < 0 || K <= 0 || mib <= 0 || passes <= 0) { fprintf(stderr, "bad TYPE, K, MIB or PASSES\n"); return 2; }
    if (ed_types_init(argc > 4 ? argv[4] : NULL) != 0) { fprintf(stderr, "path %s not supported here\n", argv[4]); return 2; }
    if (K % ED_TRAITS[type].block) { fprintf(stderr, "K must be a multiple of %d\n", ED_TRAITS[type].block); return 2; }
    ed_pm_init();
    const size_t rb = (size_t)K / ED_TRAITS[type].block * ED_TRAITS[type].type_size;
    const int R = (int)((size_t)mib * 1048576 / rb / 16 * 16);  /* weights larger than the caches */
    uint8_t *w = aligned_alloc(64, (rb * R + 63) & ~(size_t)63);
    float *xf = malloc(sizeof(float) * K * 4);
    srand(1);
    for (int r = 0; r < R; r++) {  /* really quantized rows, a few different ones */
        if (r < 8) for (int i = 0; i < K; i++) xf[i] = rand() / (float)RAND_MAX - 0.5f;
        if (r < 8) ed_quantize_row(type, xf, w + r * rb, K);
        else memcpy(w + r * rb, w + (r % 8) * rb, rb);
    }
    for (int i = 0; i < K * 4; i++) xf[i] = rand() / (float)RAND_MAX - 0.5f;
    const int vt = ED_TRAITS[type].vec_type;
    const size_t kr = ed_act_row_bytes(type, K), sr = kr;
    uint8_t *xq = aligned_alloc(64, (kr * 4 + 63) & ~(size_t)63), *xs = xq;
    for (int c = 0; c < 4; c++) ED_QUANT[vt](xf + c * K, xq + c * kr, K);
    if (!ED_TILE[type]) { printf("%s: no tile on %s\n", argv[1], ED_PATH); return 0; }
    float *out = malloc(sizeof(float) * R * 64);
    /* a 64-token prompt through the panels, over the first 16 MiB of rows (per token) */
    enum { NP = 64 };
    const int RP = R < (int)(16 * 1048576 / rb) ? R : (int)(16 * 1048576 / rb) / 16 * 16;
    uint8_t *xp = aligned_alloc(64, (kr * NP + 63) & ~(size_t)63);
    const size_t il = ed_gemm_info_len(K);
    ed_ginfo *info = malloc(sizeof(ed_ginfo) * il * NP);
    uint8_t *scratch = aligned_alloc(64, ed_gemm_scratch(K));
    for (int c = 0; c < NP; c++) {
        ED_QUANT[vt](xf + (c % 4) * K, xp + c * kr, K);
        ed_gemm_info(vt, K, xp + c * kr, info + c * il);
    }
    double b1 = 1e9, b2 = 1e9, b4 = 1e9, bp = 1e9;
    for (int it = 0; it < passes; it++) {
        const double t0 = now();
        for (int r = 0; r < R; r += CHUNK) ed_mdot_rows(type, K, w + r * rb, rb, R - r < CHUNK ? R - r : CHUNK, xq, kr, 1, out + r, 1);
        const double t1 = now();
        batch(type, K, w, rb, R, xs, sr, 2, out);
        const double t2 = now();
        batch(type, K, w, rb, R, xs, sr, 4, out);
        const double t3 = now();
        if (ed_gemm_ok(type)) ed_gemm_rows(type, K, w, rb, RP, xp, kr, info, il, NP, out, RP, scratch);
        const double t4 = now();
        if (t1 - t0 < b1) b1 = t1 - t0;
        if (t2 - t1 < b2) b2 = t2 - t1;
        if (t3 - t2 < b4) b4 = t3 - t2;
        if (t4 - t3 < bp) bp = t4 - t3;
    }
    printf("%s %s K=%d, %.0f MiB: one token %.3f ms (%.1f GB/s); 2 sessions %.3f ms, %.2fx; 4 sessions %.3f ms, %.2fx of one token "
           "(tokens per CPU second: %.2fx); prompt panels %.3f ms per token per 16 MiB%s\n", ed_kern->name, argv[1], K,
           rb * R / 1048576.0, b1 * 1e3, rb * R / b1 / 1e9, b2 * 1e3, b2 / b1, b4 * 1e3, b4 / b1, 4 * b1 / b4, bp * 1e3 / NP,
           ed_gemm_ok(type) ? "" : " (no panels)");
    return 0;
}
