#!/usr/bin/env python3
"""Quantized KV caches on a real model: edged against llama.cpp run with the same cache types,
and each cache type against the F16 cache (KL divergence, top-1 agreement, perplexity).

Teacher-forced over a passage (the first --batch tokens as one prompt batch, then one token at
a time, as generation runs); llama.cpp through llama-cpp-python with type_k/type_v (flash
attention on when V is quantized: llama.cpp requires it, and off otherwise).

  .venv/bin/python tools/kvcache_parity.py --llama-python /path/to/venv/bin/python

The interpreter with llama_cpp comes from --llama-python or $EDGED_LLAMA_PYTHON (without it,
only the comparisons against the F16 cache); set LLAMA_CPP_LIB_PATH for the library build it
should load.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
DATA = os.path.join(ROOT, "..", "shared", "testdata", "models")
MODEL = os.path.join(DATA, "SmolLM2-135M-Instruct.Q4_1.gguf")
GGML_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 8}
CASES = [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "f16"), ("q4_0", "q4_0")]

LLAMA = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
path, out, toks, n_batch, tk, tv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
llm = Llama(model_path=path, n_ctx=1024, n_batch=512, n_threads=2, logits_all=True,
            flash_attn=tv != 1, type_k=tk, type_v=tv, verbose=False, seed=0)
llm.reset()
llm.eval(toks[:n_batch])
for t in toks[n_batch:]:
    llm.eval([t])
np.save(out, np.array(llm.scores[:len(toks)], dtype=np.float32))
"""


def edged_logits(path, toks, n_batch, ck, cv):
    from edged import Model
    with Model.load(path, n_threads=2, cache_type_k=ck, cache_type_v=cv) as m:
        s = m.session(n_ctx=1024)
        rows = [s.eval(toks[:n_batch], logits="all")] + [s.eval([t]) for t in toks[n_batch:]]
        return np.concatenate(rows)


def llama_logits(py, path, toks, n_batch, ck, cv):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.npy")
        subprocess.run([py, "-c", LLAMA, path, out, json.dumps(toks), str(n_batch),
                        str(GGML_TYPE[ck]), str(GGML_TYPE[cv])], check=True)
        return np.load(out)


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def kl(p_logits, q_logits):
    """mean over positions of KL(p || q)"""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())


def ppl(logits, toks):
    lp = log_softmax(logits[:-1])
    return float(np.exp(-lp[np.arange(len(toks) - 1), toks[1:]].mean()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--repeat", type=int, default=3, help="passage repeats (82 tokens each)")
    ap.add_argument("--batch", type=int, default=64, help="tokens of the first (prompt) batch")
    a = ap.parse_args()
    ref = json.load(open(os.path.join(DATA, "SmolLM2-135M-Instruct.Q4_1.reference.json")))
    toks = ref["passage_ids"] * a.repeat
    got, want = {}, {}
    for ck, cv in CASES:
        got[ck, cv] = edged_logits(a.model, toks, a.batch, ck, cv)
        if a.llama_python:
            want[ck, cv] = llama_logits(a.llama_python, a.model, toks, a.batch, ck, cv)
    print(f"{os.path.basename(a.model)}, {len(toks)} tokens ({a.batch} as one batch, then one at "
          "a time)\n")
    print("| K/V cache | edged vs llama.cpp (same types): max / mean abs, top-1 misses where decided "
          "| edged vs its f16 cache: KL, top-1 agree | llama.cpp vs its f16: KL, top-1 agree "
          "| perplexity edged / llama.cpp |")
    print("|---|---|---|---|---|")
    base, lbase = got["f16", "f16"], want.get(("f16", "f16"))
    for ck, cv in CASES:
        g = got[ck, cv]
        row = [f"{ck}/{cv}"]
        if a.llama_python:
            w = want[ck, cv]
            d = np.abs(g - w)
            top = np.sort(w, 1)
            decided = top[:, -1] - top[:, -2] > 0.6
            miss = int((decided & (g.argmax(1) != w.argmax(1))).sum())
            row.append(f"{d.max():.3f} / {d.mean():.4f}, {miss} of {int(decided.sum())}")
        else:
            row.append("-")
        row.append(f"{kl(base, g):.5f}, {np.mean(base.argmax(1) == g.argmax(1)):.3f}")
        if a.llama_python:
            w = want[ck, cv]
            row.append(f"{kl(lbase, w):.5f}, {np.mean(lbase.argmax(1) == w.argmax(1)):.3f}")
            row.append(f"{ppl(g, toks):.3f} / {ppl(w, toks):.3f}")
        else:
            row += ["-", f"{ppl(g, toks):.3f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
