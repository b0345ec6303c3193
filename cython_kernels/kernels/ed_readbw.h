/* A read-bandwidth reference for the kernel benchmarks (tools/bench_kernels.py): one pass over
 * a buffer with the widest loads of the selected path and 8 independent accumulators, so the
 * loop is bounded by memory (or by the caches' load rate) and not by a dependency chain or by
 * narrow loads. Each 64 bytes of the buffer is loaded once and XORed into one of the
 * accumulators; the XOR of them is returned, so no compiler may drop the loads.
 *
 *   uint64_t ed_read_pass(const uint8_t *p, size_t n)   n bytes from p (any alignment; the
 *                                                       last n % 512 bytes by 8-byte words,
 *                                                       any last n % 8 not read)
 *   const char *ed_read_pass_loads(void)                what it loads with, for the output
 *
 * avx512 paths: 64-byte loads (zmm), avx2: 32-byte (ymm), neon: 16-byte (q registers),
 * generic: 8-byte words. */
#ifndef EDGED_ED_READBW_H
#define EDGED_ED_READBW_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "ed_types.h"
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

static uint64_t ed_read_words(const uint8_t *p, size_t n) {
    uint64_t a[8] = {0}, v;
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 8; j++) { memcpy(&v, p + i + 8 * j, 8); a[j] ^= v; }
    for (; i + 8 <= n; i += 8) { memcpy(&v, p + i, 8); a[0] ^= v; }
    return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

#if defined(__x86_64__)
__attribute__((target("avx512f")))
static uint64_t ed_read_zmm(const uint8_t *p, size_t n) {
    __m512i a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 512 <= n; i += 512)
        for (int j = 0; j < 8; j++) a[j] = _mm512_xor_si512(a[j], _mm512_loadu_si512((const void *)(p + i + 64 * j)));
    for (int j = 1; j < 8; j++) a[0] = _mm512_xor_si512(a[0], a[j]);
    uint64_t o[8];
    _mm512_storeu_si512((void *)o, a[0]);
    return o[0] ^ o[1] ^ o[2] ^ o[3] ^ o[4] ^ o[5] ^ o[6] ^ o[7] ^ ed_read_words(p + i, n - i);
}

__attribute__((target("avx2")))
static uint64_t ed_read_ymm(const uint8_t *p, size_t n) {
    __m256i a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 512 <= n; i += 512)
        for (int j = 0; j < 8; j++) {  /* two 32-byte loads per 64-byte line, 4 lines in flight per chain pair */
            a[j] = _mm256_xor_si256(a[j], _mm256_loadu_si256((const __m256i *)(p + i + 64 * j)));
            a[j] = _mm256_xor_si256(a[j], _mm256_loadu_si256((const __m256i *)(p + i + 64 * j + 32)));
        }
    for (int j = 1; j < 8; j++) a[0] = _mm256_xor_si256(a[0], a[j]);
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)o, a[0]);
    return o[0] ^ o[1] ^ o[2] ^ o[3] ^ ed_read_words(p + i, n - i);
}
#elif defined(__aarch64__)
static uint64_t ed_read_q(const uint8_t *p, size_t n) {
    uint64x2_t a[8];
    for (int j = 0; j < 8; j++) a[j] = vdupq_n_u64(0);
    size_t i = 0;
    for (; i + 512 <= n; i += 512)
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 4; h++) a[j] = veorq_u64(a[j], vld1q_u64((const uint64_t *)(p + i + 64 * j + 16 * h)));
    for (int j = 1; j < 8; j++) a[0] = veorq_u64(a[0], a[j]);
    return vgetq_lane_u64(a[0], 0) ^ vgetq_lane_u64(a[0], 1) ^ ed_read_words(p + i, n - i);
}
#endif

static uint64_t ed_read_pass(const uint8_t *p, size_t n) {
#if defined(__x86_64__)
    if (!strcmp(ED_PATH, "avx512")) return ed_read_zmm(p, n);
    if (!strcmp(ED_PATH, "avx2")) return ed_read_ymm(p, n);
#elif defined(__aarch64__)
    if (!strcmp(ED_PATH, "neon")) return ed_read_q(p, n);
#endif
    return ed_read_words(p, n);
}

static const char *ed_read_pass_loads(void) {
#if defined(__x86_64__)
    if (!strcmp(ED_PATH, "avx512")) return "64-byte zmm loads";
    if (!strcmp(ED_PATH, "avx2")) return "32-byte ymm loads";
#elif defined(__aarch64__)
    if (!strcmp(ED_PATH, "neon")) return "16-byte q loads";
#endif
    return "8-byte loads";
}

#endif
