/* The packed-panel prompt GEMM alone (ed_gemm.h's ed_gemm_rows), one thread: milliseconds per
 * prompt of N tokens against R weight rows of K, and a checksum of the output bits, so two
 * builds can be compared for speed and for identical results.
 *
 *   gcc -O3 -std=gnu11 -pthread -Icython_kernels/kernels -Icython_kernels/forward tools/bench_panels.c -lm -o /tmp/bench_panels
 *   /tmp/bench_panels TYPE [K] [R] [N] [PATH]     e.g. /tmp/bench_panels Q4_K 896 4864 512 avx512
 *
 * TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS; K (default 896, the
 * 0.5B shape's n_embd), R rows (default 4864, its n_ff), N tokens (default 512); PATH as
 * EDGED_KERNELS (generic, avx2, avx2-vnni, avx512, avx512-vnni). Weights and activations are
 * really quantized random rows (fixed seed). Best of 7 passes in thread CPU time (a busy
 * machine inflates it less than wall time). Built against another checkout's headers
 * (-I../base/cython_kernels/...), the same source measures that checkout; the checksum then
 * says whether both give the same bits.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include "forward.h"
#include "ed_quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static const char *names[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                  "IQ4_NL", "IQ4_XS"};
    static const int types[] = {ED_Q4_0, ED_Q4_1, ED_Q5_0, ED_Q5_1, ED_Q8_0, ED_Q2_K, ED_Q3_K, ED_Q4_K, ED_Q5_K, ED_Q6_K,
                                ED_IQ4_NL, ED_IQ4_XS};
    if (argc < 2) { fprintf(stderr, "usage: %s TYPE [K] [R] [N] [PATH]\n", argv[0]); return 2; }
    int type = -1;
    for (int i = 0; i < (int)(sizeof types / sizeof types[0]); i++) if (!strcmp(argv[1], names[i])) type = types[i];
    const int K = argc > 2 ? atoi(argv[2]) : 896, R = argc > 3 ? atoi(argv[3]) : 4864, N = argc > 4 ? atoi(argv[4]) : 512;
    if (type < 0 || K <= 0 || R <= 0 || N <= 0) { fprintf(stderr, "bad TYPE, K, R or N\n"); return 2; }
    if (ed_types_init(argc > 5 ? argv[5] : NULL) != 0) { fprintf(stderr, "path %s not supported here\n", argv[5]); return 2; }
    if (K % ED_TRAITS[type].block) { fprintf(stderr, "K must be a multiple of %d\n", ED_TRAITS[type].block); return 2; }
    if (!ed_gemm_ok(type)) { printf("%s: no panels on %s\n", argv[1], ed_kern->name); return 0; }
    const size_t rb = (size_t)K / ED_TRAITS[type].block * ED_TRAITS[type].type_size;
    uint8_t *w = aligned_alloc(64, (rb * R + 63) & ~(size_t)63);
    float *xf = malloc(sizeof(float) * K);
    srand(1);
    for (int r = 0; r < R; r++) {  /* really quantized rows, all different */
        for (int i = 0; i < K; i++) xf[i] = (rand() / (float)RAND_MAX - 0.5f) * (1.0f + (float)(i % 7));
        ed_quantize_row(type, xf, w + r * rb, K);
    }
    const int vt = ED_TRAITS[type].vec_type;
    const size_t kr = ed_act_row_bytes(type, K), il = ed_gemm_info_len(K);
    uint8_t *xq = aligned_alloc(64, (kr * N + 63) & ~(size_t)63);
    ed_ginfo *info = malloc(sizeof(ed_ginfo) * il * N);
    uint8_t *scratch = aligned_alloc(64, ed_gemm_scratch(K));
    for (int c = 0; c < N; c++) {
        for (int i = 0; i < K; i++) xf[i] = rand() / (float)RAND_MAX - 0.5f;
        ED_QUANT[vt](xf, xq + c * kr, K);
        ed_gemm_info(vt, K, xq + c * kr, info + c * il);
    }
    float *out = malloc(sizeof(float) * (size_t)R * N);
    double best = 1e9;
    for (int it = 0; it < 7; it++) {
        const double t0 = now();
        ed_gemm_rows(type, K, w, rb, R, xq, kr, info, il, N, out, R, scratch);
        const double t = now() - t0;
        if (t < best) best = t;
    }
    uint64_t h = 1469598103934665603ull;  /* FNV-1a over the output bits */
    const uint8_t *ob = (const uint8_t *)out;
    for (size_t i = 0; i < sizeof(float) * (size_t)R * N; i++) h = (h ^ ob[i]) * 1099511628211ull;
    printf("%s %s K=%d R=%d N=%d: %.2f ms (%.1f GOPS) bits %016llx\n", ed_kern->name, argv[1], K, R, N, best * 1e3,
           2.0 * K * R * N / best / 1e9, (unsigned long long)h);
    return 0;
}
