#!/usr/bin/env python3
"""Per golden model, how far edged's logits are from llama.cpp's, per kernel path.

Teacher-forced like ../shared/checks/golden_check.py (prompt as one batch, then one token at a
time) on every file in ../shared/testdata/golden and tests/data/goldens (tools/make_goldens.py:
the architectures the shared data lacks); prints a Markdown table of the max and mean
absolute logit difference for each selected kernel path (and the reference backend with
--reference), plus the first position that differs by more than 1e-3.

  python tools/parity.py                          # best path and generic
  python tools/parity.py -k avx512,avx2,generic --reference
  python tools/parity.py -k generic qwen2         # only files whose name contains "qwen2"
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
DATA = os.path.join(ROOT, "..", "shared", "testdata")
# (directory of NAME.golden.npz, directory of NAME.gguf)
SOURCES = [(os.path.join(DATA, "golden"), os.path.join(DATA, "models")),
           (os.path.join(ROOT, "tests", "data", "goldens"),) * 2]


def paths(name):
    for gdir, mdir in SOURCES:
        if os.path.exists(os.path.join(gdir, name + ".golden.npz")):
            return os.path.join(gdir, name + ".golden.npz"), os.path.join(mdir, name + ".gguf")
    raise FileNotFoundError(name)


def diff(name, backend):
    from edged import Model
    golden, model = paths(name)
    z = np.load(golden)
    toks, n_prompt, ref = z["tokens"].tolist(), int(z["n_prompt"]), z["logits"]
    m = Model.load(model, backend=backend, n_threads=2)
    try:
        s = m.session(n_ctx=512)
        rows = [s.eval(toks[:n_prompt], logits="all")]
        for t in toks[n_prompt:]:
            rows.append(s.eval([t]))
        return np.abs(np.concatenate(rows) - ref)
    finally:
        m.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", "--kernels", default="best,generic",
                    help="comma-separated kernel paths (best = the fastest this CPU supports)")
    ap.add_argument("--reference", action="store_true", help="also the NumPy reference backend")
    ap.add_argument("names", nargs="*", help="substrings of the golden names to run")
    args = ap.parse_args()
    from edged import _core as core
    golden = sorted(f[:-len(".golden.npz")] for gdir, _ in SOURCES if os.path.isdir(gdir)
                    for f in os.listdir(gdir) if f.endswith(".golden.npz"))
    golden = [g for g in golden if not args.names or any(w in g for w in args.names)]
    cols = []
    for k in args.kernels.split(","):
        core.set_path(None if k == "best" else k)
        cols.append((f"cpu {core.kernel_path()}", "cpu", None if k == "best" else k))
    if args.reference:
        cols.append(("reference", "reference", None))
    print("| model | " + " | ".join(f"{c[0]} max / mean (first pos > 1e-3)" for c in cols) + " |")
    print("| --- |" + " ---: |" * len(cols))
    for g in golden:
        cells = []
        for _, backend, path in cols:
            if backend == "cpu":
                core.set_path(path)
            d = diff(g, backend)
            far = np.nonzero(d.max(1) > 1e-3)[0]
            cells.append(f"{d.max():.4f} / {d.mean():.5f} ({far[0] if len(far) else '-'})")
        print(f"| {g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
