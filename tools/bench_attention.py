#!/usr/bin/env python3
"""Attention over an F16 cache alone (edged._core.attention: the forward pass's kernel), per
key and query row, with the caches of L layers cycled so that K/V come from memory as in a
real pass rather than from a warm L2.

    tools/bench_attention.py N_HEAD N_HEAD_KV HEAD_DIM POS N_TOKENS PATH LAYERS
    tools/bench_attention.py 9 3 64 1900 1 avx512 30     # SmolLM2's decode at position 1900

Prints the best of 15 rounds: microseconds per layer and nanoseconds per key and query row.
Run two checkouts interleaved (PYTHONPATH=CHECKOUT) to compare kernels; OPENBLAS_NUM_THREADS=1
keeps numpy's idle threads off the other core.
"""
import sys
import time

import numpy as np

import edged._core as core
n_head, n_kv, hd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
pos, n, path, L = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
core.set_path(path)
rng = np.random.default_rng(0)
n_ctx = pos + n
ks = [rng.standard_normal((n_ctx, n_kv * hd)).astype(np.float16).view(np.uint16) for _ in range(L)]
vs = [rng.standard_normal((n_ctx, n_kv * hd)).astype(np.float16).view(np.uint16) for _ in range(L)]
q = (3 * rng.standard_normal((n, n_head * hd))).astype(np.float32)
out = np.empty_like(q)
best = 1e9
for r in range(15):
    t = time.perf_counter()
    for k, v in zip(ks, vs): core.attention(out, q, k, v, pos, n_head, n_kv, 0.125, 0)
    best = min(best, (time.perf_counter() - t) / L)
print(f"{path} L{L} n{n}: {best*1e6:.0f} us per layer, {best*1e9/(n*n_head*(pos+n)):.2f} ns/key-row")
