#!/usr/bin/env python3
"""Sampler speed per configuration on a 151936-entry (Qwen2.5) float32 logits vector.

    python tools/bench_sampling.py [-n 151936] [-r 200] [--path generic|avx2|avx512|neon]
                                   [--reference] [--json]

Each figure is the median, over -r draws, of one `Sampler.sample(logits)` call (the whole
per-token path: penalties from the history, the RNG draw, the compiled chain) in microseconds
of wall time, with the thread's CPU time beside it (the machine may be shared). Two logit
vectors (seeded, the same every run):

  peaked  LLM-like: a normal bulk (sd 2) with 20 tokens 10-20 above it (the bulk holds ~0.1%
          of the probability), so the nucleus is small;
  flat    normal with sd 3 and nothing above it: top-p 0.95 keeps ~13k tokens and a plain
          temperature draw lands anywhere in the top ~30k, the hard case for a partial sort.

--reference times the NumPy twin (a full sort) as well, on fewer draws.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edged.text import sampling  # noqa: E402

CONFIGS = [
    ("greedy", dict(temperature=0.0)),
    ("temp 0.8", dict(temperature=0.8)),
    ("temp 1.0", dict(temperature=1.0)),
    ("top-k 40", dict(temperature=0.8, top_k=40)),
    ("top-p 0.95", dict(temperature=0.8, top_p=0.95)),
    ("min-p 0.05", dict(temperature=0.8, min_p=0.05)),
    ("top-p 0.95 + min-p 0.05", dict(temperature=0.8, top_p=0.95, min_p=0.05)),
    ("top-k 40 + top-p 0.95 + min-p 0.05", dict(temperature=0.8, top_k=40, top_p=0.95,
                                                min_p=0.05)),
    ("top-k 1000 + top-p 0.9", dict(temperature=1.0, top_k=1000, top_p=0.9)),
    ("penalties (last 64) + top-p 0.95", dict(temperature=0.8, top_p=0.95, repeat_penalty=1.1,
                                              presence_penalty=0.3, frequency_penalty=0.2,
                                              penalty_last_n=64)),
    ("logit bias (8 ids) + temp 0.8", dict(temperature=0.8, logit_bias={i * 997: 2.0 - i
                                                                        for i in range(8)})),
]


def logits(kind, n):
    rng = np.random.default_rng(20261130)
    if kind == "flat":
        return (rng.standard_normal(n) * 3).astype(np.float32)
    x = (rng.standard_normal(n) * 2).astype(np.float32)
    top = rng.choice(n, size=20, replace=False)
    x[top] += rng.uniform(10, 20, 20).astype(np.float32)
    return x


def timed(config, x, reps):
    s = sampling.Sampler(len(x), sampling.SamplingParams(seed=1, **config))
    s.accept_many(list(range(0, 64 * 2311, 2311)))
    s.sample(x)
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        s.sample(x)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=151936, help="vocabulary size")
    ap.add_argument("-r", "--repeat", type=int, default=200, help="draws per configuration")
    ap.add_argument("--path", help="kernel path (EDGED_KERNELS), default: the best supported")
    ap.add_argument("--reference", action="store_true", help="time the NumPy twin too")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if sampling._compiled_sample is None:
        sys.exit("the compiled core is not built: python setup.py build_ext --inplace")
    from edged import _core
    if args.path:
        _core.set_path(args.path)
    rows = []
    for kind in ("peaked", "flat"):
        x = logits(kind, args.n)
        for name, config in CONFIGS:
            wall, cpu = timed(config, x, args.repeat)
            row = {"logits": kind, "config": name, "us": round(wall, 1), "cpu_us": round(cpu, 1)}
            if args.reference:
                saved, sampling._compiled_sample = sampling._compiled_sample, None
                try:
                    row["reference_us"] = round(timed(config, x, max(3, args.repeat // 50))[0], 1)
                finally:
                    sampling._compiled_sample = saved
            rows.append(row)
    if args.json:
        print(json.dumps({"n_vocab": args.n, "path": _core.kernel_path(), "rows": rows}))
        return
    print(f"n_vocab {args.n}, kernel path {_core.kernel_path()}, median of {args.repeat} draws, "
          f"load average {os.getloadavg()[0]:.1f}")
    ref = " | NumPy twin us" if args.reference else ""
    print(f"| logits | configuration | us/token | CPU us/token{ref} |")
    print("| --- | --- | ---: | ---: |" + (" ---: |" if args.reference else ""))
    for r in rows:
        tail = f" | {r['reference_us']:.0f}" if args.reference else ""
        print(f"| {r['logits']} | {r['config']} | {r['us']:.0f} | {r['cpu_us']:.0f}{tail} |")


if __name__ == "__main__":
    main()
