#!/usr/bin/env python3
"""Instructions per 32 weights of each aarch64 dot product and tile, counted under qemu (no Arm
machine needed; qemu's timings mean nothing, its instruction counts do). Builds a small driver
with aarch64-linux-gnu-gcc -O3 (as setup.py builds the module), runs it under qemu-aarch64 with
an execution trace, and sums the instructions executed inside each kernel function: the generic
C dot, the NEON dot and 4-token tile, and the same with dotprod. One row of K = 4096 weights.
"rows r4+dp": the row kernel over weights repacked at load (ed_repack.h, dotprod only), 16 rows.

    python tools/neon_icount.py
    python tools/neon_icount.py --cc "python -m ziglang cc -target aarch64-linux-musl"   # as the wheels

--cc: the C compiler (a command; default aarch64-linux-gnu-gcc). The wheels are built with zig cc
(clang, tools/build-wheels.sh), whose code for the same source can differ by several instructions
per 32 weights; a static aarch64 binary is needed (zig: the musl target).
"""
import argparse
import collections
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
K, C = 4096, 4

DRIVER = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include "forward.h"
#include "ed_quant.h"
static uint64_t s = 88172645463325252ull;
static uint32_t rnd(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return (uint32_t)s; }
static float rndf(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }
int main(void) {
    static const int types[] = {%(ids)s};
    static uint8_t w[%(K)d * 4], xq[%(C)d * %(K)d * 4];
    static uint8_t wr[16 * %(K)d * 2], wt[16 * %(K)d * 2], tmp[4 * %(K)d * 2];
    static float x[%(C)d * %(K)d], f[%(K)d], out[%(C)d], rows[16];
    volatile float sink = 0;
    for (int i = 0; i < %(C)d * %(K)d; i++) x[i] = rndf();
    for (int i = 0; i < %(K)d; i++) f[i] = rndf();
    for (unsigned ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti];
        const ed_traits tr = ED_TRAITS[t];
        const size_t xr = ed_act_row_bytes(t, %(K)d);
        if (ed_quantize_row(t, f, w, %(K)d))  /* a valid weight row; float types as they are */
            ED_ACT[t].ref(f, w, %(K)d);
        for (int c = 0; c < %(C)d; c++) ED_ACT[tr.vec_type].ref(x + c * %(K)d, xq + c * xr, %(K)d);
        sink += tr.ref(%(K)d, w, xq);
        /* the two NEON tables' rows (ed_simd.h), without and with dotprod */
        sink += ed_neon_dot[t](%(K)d, w, xq); ed_neon_tile[t](%(K)d, w, xq, xr, %(C)d, out, 1); sink += out[0];
        sink += ed_neondp_dot[t](%(K)d, w, xq); ed_neondp_tile[t](%(K)d, w, xq, xr, %(C)d, out, 1); sink += out[0];
        /* the row kernels (ED_ROWS) for one token: ED_ROWS_N rows, as ed_mdot_rows calls them
           (the same row each time, ws = 0) */
        if (ed_neon_rows[t]) {
            ed_neon_rows[t](%(K)d, w, 0, ED_ROWS_N, xq, xr, 1, rows, 1); sink += rows[0];
            ed_neondp_rows[t](%(K)d, w, 0, ED_ROWS_N, xq, xr, 1, rows, 1); sink += rows[0];
        }
        if (ed_neondp_rows_r4[t]) {  /* 16 copies of the row, repacked */
            const size_t rb = (size_t)(%(K)d / tr.block) * tr.type_size;
            for (int r = 0; r < 16; r++) memcpy(wt + r * rb, w, rb);
            ed_r4_pack(t, %(K)d, wt, rb, 16, wr, tmp);
            ed_neondp_rows_r4[t](%(K)d, wr, rb, 16, xq, xr, 1, rows, 1); sink += rows[0];
        }
    }
    return sink == 12345.0f;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cc", default=shutil.which("aarch64-linux-gnu-gcc"), help="C compiler command for aarch64")
    a = ap.parse_args()
    cc = shlex.split(a.cc) if a.cc else None
    nm_tool = shutil.which("aarch64-linux-gnu-nm") or shutil.which("llvm-nm") or "nm"
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not cc or not qemu:
        sys.exit("needs aarch64-linux-gnu-gcc and qemu-aarch64 (tools/bootstrap.sh)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe, log = (os.path.join(tmp, n) for n in ("icount.c", "icount", "trace.log"))
        with open(src, "w") as fh:
            fh.write(DRIVER.replace("%(ids)s", ", ".join("ED_" + t for t in TYPES)).replace("%(K)d", str(K))
                     .replace("%(C)d", str(C)))
        subprocess.run([*cc, "-O3", "-fno-math-errno", "-DNDEBUG", "-std=gnu11", "-pthread", "-static",
                        *("-I" + d for d in glob.glob(os.path.join(ROOT, "cython_kernels", "*/"))), src, "-lm", "-o", exe], check=True)
        subprocess.run([qemu, "-cpu", "max", "-d", "in_asm,exec,nochain", "-D", log, exe], check=True)
        syms = []  # (start, end, name) of the kernel functions
        nm = subprocess.run([nm_tool, "-S", "--defined-only", exe], capture_output=True, text=True)
        for line in nm.stdout.splitlines():
            p = line.split()
            if len(p) == 4 and re.fullmatch(r"ed_(neon_|neondp_)?(dot|tile|rows)_\w+", p[3]):
                syms.append((int(p[0], 16), int(p[0], 16) + int(p[1], 16), p[3]))
        tb_len, runs, start, n = {}, collections.Counter(), None, 0
        with open(log, errors="replace") as fh:  # translated blocks (IN:), then one Trace line per run
            for line in fh:
                if line.startswith("IN:"):
                    start, n = None, 0
                elif (m := re.match(r"0x([0-9a-f]+):\s", line)):
                    start = start if start is not None else int(m.group(1), 16)
                    n += 1
                    tb_len[start] = max(tb_len.get(start, 0), n)  # a block may be translated again
                elif (m := re.match(r"Trace \d+: \S+ \[[0-9a-f]+/([0-9a-f]+)/", line)):
                    runs[int(m.group(1), 16)] += 1
    count = collections.Counter()
    for pc, k in runs.items():
        for lo, hi, name in syms:
            if lo <= pc < hi:
                count[name] += k * tb_len.get(pc, 0)
    g = K // 32
    print(f"instructions per 32 weights (K = {K}; tile = {C} tokens, per token)")
    print("rows: the row kernel (ED_ROWS: 8 rows, one token), per row, where the type has one")
    print(f"{'type':6s} {'generic':>8s} {'neon':>7s} {'neon+dp':>8s} {'tile':>7s} {'tile+dp':>8s} {'rows':>7s} {'rows+dp':>8s}"
          f" {'r4+dp':>7s}")
    for t in TYPES:
        n = t.lower().replace("_k", "_K")
        v = [count[f"ed_dot_{n}"] / g, count[f"ed_neon_dot_{n}"] / g, count[f"ed_neondp_dot_{n}"] / g,
             count[f"ed_neon_tile_{n}"] / g / C, count[f"ed_neondp_tile_{n}"] / g / C,
             count[f"ed_neon_rows_{n}"] / g / 8, count[f"ed_neondp_rows_{n}"] / g / 8]
        rows = f" {v[5]:7.1f} {v[6]:8.1f}" if v[5] else f" {'-':>7s} {'-':>8s}"
        r4 = count[f"ed_neondp_rows_r4_{n}"] / g / 16
        rows += f" {r4:7.1f}" if r4 else f" {'-':>7s}"
        print(f"{t:6s} {v[0]:8.1f} {v[1]:7.1f} {v[2]:8.1f} {v[3]:7.1f} {v[4]:8.1f}" + rows)


if __name__ == "__main__":
    main()
