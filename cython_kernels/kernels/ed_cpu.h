/* ed_cpu.h: which x86-64 SIMD extensions this CPU has and the OS has switched on, read from
 * CPUID and XCR0 (XGETBV) directly.
 *
 * Not __builtin_cpu_supports: that builtin reads a table filled by the compiler's runtime
 * library, and the runtimes differ. zig's clang, which builds the manylinux2014 wheels
 * (tools/build-wheels.sh), reports no AVX2 or AVX-512 at all on CPUs that have them, so the
 * wheels ran the generic path. An extension counts only when CPUID names it and the OS saves
 * its registers on a context switch (XCR0: SSE+AVX state for AVX/AVX2/FMA/F16C/AVX-VNNI, plus
 * opmask and the upper ZMM state for AVX-512), as Intel's SDM prescribes.
 */
#ifndef ED_CPU_H
#define ED_CPU_H
#if defined(__x86_64__)
#include <cpuid.h>

typedef struct {
    int avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avxvnni, avx512bf16;
} ed_x86_cpu;

static ed_x86_cpu ed_x86_cpu_detect(void) {
    ed_x86_cpu c = {0};
    unsigned a, b, cx, d;
    unsigned max_leaf = __get_cpuid_max(0, 0);
    if (max_leaf < 1) return c;
    __cpuid_count(1, 0, a, b, cx, d);
    const int osxsave = (cx >> 27) & 1, avx = (cx >> 28) & 1;
    if (!osxsave || !avx) return c;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const int os_avx = (xcr0_lo & 0x6u) == 0x6u;              /* XMM and YMM state */
    const int os_avx512 = os_avx && (xcr0_lo & 0xe0u) == 0xe0u; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (!os_avx) return c;
    c.fma = (cx >> 12) & 1;
    c.f16c = (cx >> 29) & 1;
    if (max_leaf < 7) return c;
    __cpuid_count(7, 0, a, b, cx, d);
    const unsigned max_sub7 = a;
    c.avx2 = (b >> 5) & 1;
    if (os_avx512) {
        c.avx512f = (b >> 16) & 1;
        c.avx512dq = (b >> 17) & 1;
        c.avx512bw = (b >> 30) & 1;
        c.avx512vl = (b >> 31) & 1;
        c.avx512vnni = (cx >> 11) & 1;
    }
    if (max_sub7 >= 1) {
        __cpuid_count(7, 1, a, b, cx, d);
        c.avxvnni = (a >> 4) & 1;
        if (os_avx512) c.avx512bf16 = (a >> 5) & 1;
    }
    return c;
}

#endif
#endif
