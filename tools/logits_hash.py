#!/usr/bin/env python3
"""Hashes of a model's logits, to check that a kernel change keeps every bit (run it before and
after, on each kernel path or emulated CPU: docs/development.md, "How to check a kernel change").

    A  5 prompt tokens, then 2 greedy tokens (the one-token row kernels)
    B  a 13-token prompt (packed panels: tiles of 4 tokens and a remainder), 2 greedy tokens,
       then a decode batch of 3 sessions
    C  every row's logits of a 16-token and of a 23-token prompt

Each line is blake2b-64 of the float32 logits in order. One thread; the tokens are fixed ids.

    python tools/logits_hash.py MODEL.gguf
"""
import argparse
import hashlib

import numpy as np

from edged import Model


def digest(parts):
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(np.ascontiguousarray(p, dtype=np.float32).tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="GGUF file")
    a = ap.parse_args()
    m = Model.load(a.model, n_threads=1)
    # fixed ids (taken modulo the vocabulary: the same ids wherever it has more than 1010 tokens)
    toks = [((i * 7919) % 1000 + 10) % m.n_vocab for i in range(32)]

    def prompt_then_greedy(n):
        s = m.session(n_ctx=256)
        parts = [s.eval(toks[:n])]
        for _ in range(2):
            parts.append(s.eval([int(np.argmax(parts[-1][-1]))]))
        return s, parts

    _, parts = prompt_then_greedy(5)
    print("A", digest(parts))
    s, parts = prompt_then_greedy(13)
    others = [m.session(n_ctx=256) for _ in range(2)]
    for i, o in enumerate(others):
        parts.append(o.eval(toks[20 + i:24 + i]))
    parts.append(m.decode_batch([s] + others, [11, 12, 13]))
    print("B", digest(parts))
    print("C", digest([m.session(n_ctx=256).eval(toks[:n], logits="all") for n in (16, 23)]))


if __name__ == "__main__":
    main()
