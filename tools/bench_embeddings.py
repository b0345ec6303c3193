#!/usr/bin/env python3
"""Embedding throughput: sentences/s for a batch of 32 short (~12 tokens) and 32 long
(~130 tokens) sentences, edged's Model.embed against llama.cpp (llama-cpp-python's
Llama.embed, which also sends the whole list as one batch) on the same file and thread count;
runs alternated, medians and their ratio. Both load the model once and time only embed().

  .venv/bin/edged synth --shape bert-base --type F16 /tmp/bert-base-f16.gguf
  .venv/bin/python tools/bench_embeddings.py --model /tmp/bert-base-f16.gguf -t 2 -r 5 \\
      --llama-python /path/to/venv/bin/python

The interpreter with llama_cpp comes from --llama-python or $EDGED_LLAMA_PYTHON (without one,
edged alone is measured); LLAMA_CPP_LIB_PATH picks its native build as usual.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from edged.engine.model import Model  # noqa: E402

WORDS = ("the quick brown fox jumps over lazy dog a an of in on to is was for with as by at "
         "from it this that sensor reading valve pressure alarm report device").split()

LLAMA = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, reps, sets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = Llama(model_path=path, embedding=True, n_ctx=8192, n_batch=8192, n_ubatch=8192,
            n_threads=threads, n_threads_batch=threads, verbose=False)
out = {}
for name, texts in sets.items():
    llm.embed(texts)                                  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        llm.embed(texts)
        ts.append(time.perf_counter() - t0)
    out[name] = ts
print(json.dumps(out))
"""


def sentences(n_words, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(n_words)) for _ in range(32)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="an encoder GGUF (edged synth --shape bert-base)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("-r", "--reps", type=int, default=5, help="timed runs per set (default 5)")
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"),
                    help="python with llama_cpp installed (default $EDGED_LLAMA_PYTHON)")
    ap.add_argument("--sets", default="short,long", help="which sets (default short,long)")
    a = ap.parse_args()
    sets = {"short": sentences(10, 1), "long": sentences(120, 2)}
    sets = {k: sets[k] for k in a.sets.split(",")}
    m = Model.load(a.model, n_threads=a.threads)
    ntok = {k: sum(len(ids) for ids in m.tokenize_inputs(v)) for k, v in sets.items()}
    ours = {}
    for name, texts in sets.items():
        m.embed(texts)                                # warm-up
        ours[name] = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            m.embed(texts)
            ours[name].append(time.perf_counter() - t0)
    theirs = {}
    if a.llama_python:
        r = subprocess.run([a.llama_python, "-c", LLAMA, a.model, str(a.threads), str(a.reps),
                            json.dumps(sets)], capture_output=True, text=True, check=True)
        theirs = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"model {os.path.basename(a.model)} ({m.arch}, n_embd {m.hp.n_embd}, {m.hp.n_layer} "
          f"layers), {a.threads} threads, {a.reps} runs, medians; backend {m.backend_name}")
    for name in sets:
        e = statistics.median(ours[name])
        line = (f"{name:>5}: 32 sentences, {ntok[name]} tokens: edged {32 / e:8.1f} sentences/s "
                f"({e * 1000:.0f} ms)")
        if name in theirs:
            ll = statistics.median(theirs[name])
            line += f", llama.cpp {32 / ll:8.1f} sentences/s ({ll * 1000:.0f} ms), ratio {ll / e:.2f}"
        print(line)


if __name__ == "__main__":
    main()
