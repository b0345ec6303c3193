#!/usr/bin/env python3
"""Attention time alone, two ways.

With a model: the compiled backend's profile counters over one prompt batch of -p tokens,
then the median and minimum over -n single tokens decoded after it.

  python tools/bench_attention.py -m model.gguf -p 256 -n 10 -t 1

With a shape (--shape N_HEAD,N_HEAD_KV,HEAD_DIM): the kernel alone (edged._core.attention, one
thread), -n tokens at positions --pos.., the caches of --layers layers cycled so that K/V come
from memory as in a real pass rather than from a warm L2; the best of 15 rounds, microseconds
per layer and nanoseconds per key and query row. Run two checkouts interleaved
(PYTHONPATH=CHECKOUT) to compare kernels; OPENBLAS_NUM_THREADS=1 keeps numpy's idle threads off
the other core.

  python tools/bench_attention.py --shape 9,3,64 --pos 1900 -n 1 --path avx512 --layers 30
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def model_attention(args):
    from edged import Model
    m = Model.load(args.model, n_threads=args.threads, backend="cpu")
    be, P = m.backend, args.n_prompt
    buf = be.alloc(P + args.n_gen + 8, P)
    toks = np.random.default_rng(0).integers(0, m.spec.hp.n_vocab, P).tolist()
    be.copy_in(buf, toks, 0)
    be.forward(buf, P, 0, False)  # warm-up
    buf.state.set_profile(True)
    be.copy_in(buf, toks, 0)
    be.forward(buf, P, 0, False)
    prompt = buf.state.profile()["attention"]
    buf.state.set_profile(False)
    one = []
    for r in range(args.n_gen):
        buf.state.set_profile(True)
        be.copy_in(buf, [toks[r % P]], P + r)
        be.forward(buf, 1, P + r, False)
        one.append(buf.state.profile()["attention"])
        buf.state.set_profile(False)
    print(f"attention: prompt of {P} {prompt:.1f} ms; one token at {P}: median "
          f"{statistics.median(one):.3f} ms, min {min(one):.3f} ms")
    m.close()


def kernel_attention(args):
    import edged._core as core
    n_head, n_kv, hd = (int(x) for x in args.shape.split(","))
    if args.path:
        core.set_path(args.path)
    rng = np.random.default_rng(0)
    n_ctx = args.pos + args.n_gen
    ks = [rng.standard_normal((n_ctx, n_kv * hd)).astype(np.float16).view(np.uint16) for _ in range(args.layers)]
    vs = [rng.standard_normal((n_ctx, n_kv * hd)).astype(np.float16).view(np.uint16) for _ in range(args.layers)]
    q = (3 * rng.standard_normal((args.n_gen, n_head * hd))).astype(np.float32)
    out = np.empty_like(q)
    best = float("inf")
    for _ in range(15):
        t = time.perf_counter()
        for k, v in zip(ks, vs):
            core.attention(out, q, k, v, args.pos, n_head, n_kv, 1 / np.sqrt(hd), 0)
        best = min(best, (time.perf_counter() - t) / args.layers)
    print(f"{core.kernel_path()} {args.shape} at {args.pos}, {args.n_gen} token(s), {args.layers} layers: "
          f"{best * 1e6:.0f} us per layer, {best * 1e9 / (args.n_gen * n_head * n_ctx):.2f} ns per key and row")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model")
    ap.add_argument("-p", "--n-prompt", type=int, default=256)
    ap.add_argument("-n", "--n-gen", type=int, default=10)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--shape", help="N_HEAD,N_HEAD_KV,HEAD_DIM: the kernel alone, no model")
    ap.add_argument("--pos", type=int, default=1900)
    ap.add_argument("--path", help="kernel path (EDGED_KERNELS names), default: this CPU's best")
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    if (args.model is None) == (args.shape is None):
        ap.error("give either -m MODEL or --shape N_HEAD,N_HEAD_KV,HEAD_DIM")
    (model_attention if args.model else kernel_attention)(args)


if __name__ == "__main__":
    main()
