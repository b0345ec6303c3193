/* The blocked prompt attention alone (the path's ed_kern->attn, ed_attn_x86.inc), one thread:
 * 300 random blocks of 1..32 query rows over an F16 cache of up to 600 keys (7 query heads per
 * KV head: the rows of one token share their keys; every 3rd block a sliding window, every 5th
 * a sink, every 7th block tiny queries that round to F16 subnormals), the thread CPU time and
 * an FNV digest of all output bits, so two builds can be compared for speed and for identical
 * results (the blocked kernel must give the one-token attention's bits).
 *
 *   gcc -O3 -std=gnu11 -pthread -Icython_kernels/kernels -Icython_kernels/forward tools/bench_attn_blocks.c -lm -o /tmp/ba
 *   /tmp/ba [PATH] [HEAD_DIM] [PROMPT]      e.g. /tmp/ba avx512 64
 *
 * With PROMPT (e.g. 512), the blocks are instead those of one causal prompt batch of PROMPT
 * tokens as forward.h cuts it for one KV head of 7 query heads: 4 tokens x 7 heads (28 rows) a
 * block, token t over keys [0, t] (qwen2.5-0.5B's attention, one KV head of one layer).
 *
 * Built against another checkout's headers (-I../base/cython_kernels/...), the same source
 * measures that checkout.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include "forward.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* one block through the path's kernel: its thread CPU time added to *t, its output bits to *h */
static void run(int nr, const ed_attn_row *rw, const ed_half *k, const ed_half *v, int ld, int hd,
                float *ws, const float *o, double *t, uint64_t *h) {
    const double t0 = now();
    ed_kern->attn(nr, rw, k, v, ld, hd, 0.125f, ws);
    *t += now() - t0;
    const uint8_t *ob = (const uint8_t *)o;
    for (size_t i = 0; i < sizeof(float) * nr * hd; i++) *h = (*h ^ ob[i]) * 1099511628211ull;
}
int main(int argc, char **argv) {
    if (ed_types_init(argc > 1 ? argv[1] : NULL)) return 2;
    const int hd = argc > 2 ? atoi(argv[2]) : 64, H = 7, ld = 2 * hd;
    const int prompt = argc > 3 ? atoi(argv[3]) : 0, nctx = prompt > 600 ? prompt : 600;
    ed_half *k = malloc(sizeof(ed_half) * nctx * ld), *v = malloc(sizeof(ed_half) * nctx * ld);
    srand(3);
    for (int i = 0; i < nctx * ld; i++) { k[i] = ed_fp32_to_fp16((rand() / (float)RAND_MAX - 0.5f) * 4); v[i] = ed_fp32_to_fp16(rand() / (float)RAND_MAX - 0.5f); }
    float *q = malloc(sizeof(float) * 32 * hd), *o = malloc(sizeof(float) * 32 * hd);
    float *ws = aligned_alloc(64, sizeof(float) * ed_attn_ws_floats(hd, nctx + 64));
    uint64_t h = 1469598103934665603ull; double t = 0;
    for (int t0 = 0; t0 < prompt; t0 += 4) {  /* a prompt batch: 4 tokens x H heads a block */
        const int nr = (prompt - t0 < 4 ? prompt - t0 : 4) * H;
        ed_attn_row rw[32];
        for (int r = 0; r < nr; r++) {
            for (int d = 0; d < hd; d++) q[r * hd + d] = (rand() / (float)RAND_MAX - 0.5f) * 3;
            rw[r] = (ed_attn_row){q + r * hd, o + r * hd, 0, t0 + r / H, -INFINITY};
        }
        run(nr, rw, k, v, ld, hd, ws, o, &t, &h);
    }
    if (prompt) {
        printf("%s hd=%d prompt %d attn %.2f ms bits %016llx\n", ed_kern->name, hd, prompt, t * 1e3, (unsigned long long)h);
        return 0;
    }
    for (int it = 0; it < 300; it++) {
        const int nr = 1 + rand() % 32, pos = rand() % 500, sink = it % 5 == 0;
        ed_attn_row rw[32];
        for (int r = 0; r < nr; r++) {
            for (int d = 0; d < hd; d++) q[r * hd + d] = (rand() / (float)RAND_MAX - 0.5f) * (it % 7 == 0 ? 1e-6f : 3);
            const int tok = r / H;  /* rows of one token share their keys */
            rw[r] = (ed_attn_row){q + r * hd, o + r * hd, it % 3 == 0 ? tok : 0, pos + tok, sink ? 0.5f : -INFINITY};
        }
        run(nr, rw, k, v, ld, hd, ws, o, &t, &h);
    }
    printf("%s hd=%d attn %.2f ms bits %016llx\n", ed_kern->name, hd, t * 1e3, (unsigned long long)h);
    return 0;
}
