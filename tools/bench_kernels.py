#!/usr/bin/env python3
"""Kernel benchmark: per weight type, matrix-vector GB/s of weights streamed (weights larger
than the caches) and matrix-matrix GOPS (a prompt batch), for 1..N threads, next to the read
bandwidth of the same buffer. Short runs (best of -r); the machine may be shared.

    python tools/bench_kernels.py [-t 2] [--mib 512 | --rows 4096] [-k 4096] [-r 5] [--types Q4_0,Q4_K,Q6_K,Q8_0]

--rows sets the matrix's rows instead of its bytes (the same shape for every type: as llama.cpp's
`test-backend-ops perf -o MUL_MAT` takes m = 4096, k = 14336, n = 1 with one thread on a 2-core
machine, for a side-by-side of the kernels; at that size, 20-60 MB, the weights may stay in a
large last-level cache, for both programs alike).

"read GB/s" is a real read-bandwidth measurement made to match each matrix-vector figure: one
pass over the same weight buffer (so the same size, --mib), with the same pool of threads, each
thread reading one contiguous slice as the product splits its rows, with the selected path's
widest loads (64-byte zmm on avx512, 32-byte ymm on avx2, 16-byte on neon, 8-byte on generic)
into 8 independent XOR accumulators (`_core.read_bandwidth_pass`, cython_kernels/kernels/
ed_readbw.h); every page is touched by an untimed first pass of each, and the read and product
runs alternate. It is what a loop that does nothing but load gets from memory at that thread
count, so "% of read" near 100 means the product is memory-bound there, and well below 100
that it is compute-bound (its integer work, not the weight traffic, sets the speed).
The GB/cpu-s columns divide by the CPU time the threads got instead of wall time. Where the
selected path reads a type repacked at load (`_core.r4_types()`: on x86 Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, IQ4_NL, IQ4_XS, MXFP4, Q2_K..Q6_K; Q4_0 / Q8_0 on NEON with dotprod), the matrix is repacked the same way and the row says "(R4)".
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edged import _core  # noqa: E402
from edged.format import quants  # noqa: E402
from edged.format.gguf import GGMLType, TYPE_INFO  # noqa: E402
from edged.system import default_threads  # noqa: E402


def best(fn, reps):
    """(best wall seconds, CPU seconds of that run summed over the process's threads)"""
    return best_pair(fn, None, reps)[0]


def best_pair(fa, fb, reps):
    """best() of fa and of fb (None: fa alone), their runs alternated; each run once untimed
    first (pages touched, caches and threads warm)"""
    fns = [f for f in (fa, fb) if f is not None]
    for f in fns:
        f()
    t = [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            t[i].append((time.perf_counter() - t0, time.process_time() - c0))
    return [min(x) for x in t]


def weights(qtype, rows, k, rng):
    """rows x k weights of qtype: a pool of 64 really quantized rows, repeated."""
    pool = quants.quantize(rng.standard_normal((64, k)).astype(np.float32) * 0.02, qtype)
    idx = rng.integers(0, 64, rows)
    return np.ascontiguousarray(pool[idx]).reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=default_threads())
    ap.add_argument("--mib", type=int, default=512, help="weight bytes for matrix-vector (default 512 MiB)")
    ap.add_argument("--rows", type=int, default=0, help="matrix rows (a multiple of 8), instead of --mib")
    ap.add_argument("-k", type=int, default=4096, help="row length")
    ap.add_argument("--tokens", type=int, default=64, help="batch for matrix-matrix")
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--types", default="Q4_0,Q4_K,Q6_K,Q8_0")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    k = args.k
    pools = {n: _core.Pool(n) for n in range(1, args.threads + 1)}
    print(f"kernel path {_core.kernel_path()} ({_core.kernel_variant()}), features {' '.join(_core.cpu_features())}, "
          f"load average {os.getloadavg()[0]:.1f}; read: the same buffer, {_core.read_pass_loads()}, "
          f"8 accumulators, the same threads")
    # wall-clock figures, and per CPU-second (bytes / CPU time summed over the threads): on a
    # shared machine the second pair shows the kernels' efficiency however little CPU we got
    print("| type | threads | MiB | read GB/s | matvec GB/s | % of read | read GB/cpu-s | matvec GB/cpu-s "
          "| % | matmul GOPS | matmul GOP/cpu-s | matvec us |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.types.split(","):
        t = GGMLType[name]
        info = TYPE_INFO[t]
        rb = k // info.block_size * info.type_size
        g = _core.R4_ROWS
        rows = (args.mib << 20) // rb // g * g  # whole groups of rows (the R4 layout)
        if args.rows:
            rows = args.rows // g * g
        w = weights(t, rows, k, rng)
        # the layout the engine reads: repacked at load where the path has R4 kernels for the type
        r4 = int(t) in _core.r4_types() and _core.r4_ok(int(t), k, rows)
        if r4:
            w = _core.r4_pack(np.empty_like(w), w, int(t), k, rows)
        x1 = rng.standard_normal((1, k)).astype(np.float32)
        o1 = np.empty((1, rows), np.float32)
        mm_rows = 2048
        wm = w[:mm_rows * rb]
        xm = rng.standard_normal((args.tokens, k)).astype(np.float32)
        om = np.empty((args.tokens, mm_rows), np.float32)
        for n, p in pools.items():
            (tr, cr), (tv, cv) = best_pair(lambda: _core.read_bandwidth_pass(w, p),
                                           lambda: _core.matmul(o1, w, int(t), x1, p, r4), args.reps)
            tm, cm = best(lambda: _core.matmul(om, wm, int(t), xm, p, r4), max(1, args.reps // 2))
            bw, bwc = w.nbytes / tr / 1e9, w.nbytes / max(cr, 1e-9) / 1e9
            gbs, gbc = w.nbytes / tv / 1e9, w.nbytes / max(cv, 1e-9) / 1e9
            ops = 2.0 * mm_rows * k * args.tokens
            print(f"| {name}{' (R4)' if r4 else ''} | {n} | {w.nbytes / 2**20:.0f} | {bw:.1f} | {gbs:.1f} | {100 * gbs / bw:.0f}% | "
                  f"{bwc:.1f} | {gbc:.1f} | {100 * gbc / bwc:.0f}% | {ops / tm / 1e9:.1f} | "
                  f"{ops / max(cm, 1e-9) / 1e9:.1f} | {tv * 1e6:.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
