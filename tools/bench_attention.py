#!/usr/bin/env python3
"""Attention time alone (the compiled backend's profile counters): one prompt batch of -p
tokens, then the median and minimum over -n single tokens decoded after it.

  python tools/bench_attention.py -m model.gguf -p 256 -n 10 -t 1
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=256)
    ap.add_argument("-n", "--n-gen", type=int, default=10)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
