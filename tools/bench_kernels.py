#!/usr/bin/env python3
"""Kernel benchmark: per weight type, matrix-vector GB/s of weights streamed (weights larger
than the caches) and matrix-matrix GOPS (a prompt batch), for 1..N threads, next to the
machine's measured read bandwidth. Short runs (best of -r); the machine may be shared.

    python tools/bench_kernels.py [-t 2] [--mib 512] [-r 5] [--types Q4_0,Q4_K,Q6_K,Q8_0]
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
from edged.engine.threads import default_threads  # noqa: E402


def best(fn, reps):
    """(best wall seconds, CPU seconds of that run summed over the process's threads)"""
    fn()
    t = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        t.append((time.perf_counter() - t0, time.process_time() - c0))
    return min(t)


def weights(qtype, rows, k, rng):
    """rows x k weights of qtype: a pool of 64 really quantized rows, repeated."""
    pool = quants.quantize(rng.standard_normal((64, k)).astype(np.float32) * 0.02, qtype)
    idx = rng.integers(0, 64, rows)
    return np.ascontiguousarray(pool[idx]).reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=int, default=default_threads())
    ap.add_argument("--mib", type=int, default=512, help="weight bytes for matrix-vector (default 512 MiB)")
    ap.add_argument("-k", type=int, default=4096, help="row length")
    ap.add_argument("--tokens", type=int, default=64, help="batch for matrix-matrix")
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--types", default="Q4_0,Q4_K,Q6_K,Q8_0")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    k = args.k
    pools = {n: _core.Pool(n) for n in range(1, args.threads + 1)}
    print(f"kernel path {_core.kernel_path()} ({_core.kernel_variant()}), features {' '.join(_core.cpu_features())}, "
          f"load average {os.getloadavg()[0]:.1f}")
    buf = np.frombuffer(rng.bytes(args.mib << 20), np.uint8)
    bw, bw_cpu = {}, {}
    for n, p in pools.items():
        wall, cpu = best(lambda: _core.read_bandwidth_pass(buf, p), args.reps)
        bw[n], bw_cpu[n] = buf.nbytes / wall / 1e9, buf.nbytes / max(cpu, 1e-9) / 1e9
    del buf
    # wall-clock figures, and per CPU-second (bytes / CPU time summed over the threads): on a
    # shared machine the second pair shows the kernels' efficiency however little CPU we got
    print("| type | threads | read GB/s | matvec GB/s | % of read | read GB/cpu-s | matvec GB/cpu-s "
          "| % | matmul GOPS | matmul GOP/cpu-s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.types.split(","):
        t = GGMLType[name]
        info = TYPE_INFO[t]
        rb = k // info.block_size * info.type_size
        rows = (args.mib << 20) // rb
        w = weights(t, rows, k, rng)
        x1 = rng.standard_normal((1, k)).astype(np.float32)
        o1 = np.empty((1, rows), np.float32)
        mm_rows = 2048
        wm = w[:mm_rows * rb]
        xm = rng.standard_normal((args.tokens, k)).astype(np.float32)
        om = np.empty((args.tokens, mm_rows), np.float32)
        for n, p in pools.items():
            tv, cv = best(lambda: _core.matmul(o1, w, int(t), x1, p), args.reps)
            tm, cm = best(lambda: _core.matmul(om, wm, int(t), xm, p), max(1, args.reps // 2))
            gbs, gbc = w.nbytes / tv / 1e9, w.nbytes / max(cv, 1e-9) / 1e9
            ops = 2.0 * mm_rows * k * args.tokens
            print(f"| {name} | {n} | {bw[n]:.1f} | {gbs:.1f} | {100 * gbs / bw[n]:.0f}% | "
                  f"{bw_cpu[n]:.1f} | {gbc:.1f} | {100 * gbc / bw_cpu[n]:.0f}% | {ops / tm / 1e9:.1f} | "
                  f"{ops / max(cm, 1e-9) / 1e9:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
