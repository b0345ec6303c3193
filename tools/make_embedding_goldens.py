#!/usr/bin/env python3
"""Make llama.cpp embedding goldens: tests/data/goldens/embed-NAME.{gguf,embeddings.npz}.

Encoders: small random-weight `bert` and `nomic-bert` files written by edged's synthesiser
(edged.format.synth.synth_encoder, F32, a 512-piece WordPiece vocabulary). Decoder: the
shared stories260K model. llama.cpp (llama-cpp-python, embedding=True) tokenizes each text,
runs it and returns the pooled, L2-normalised embedding; the golden holds, per pooling type,
the token ids llama.cpp used and its embeddings:

  tokens_<i> int32, emb_<pooling> float32 (n_texts, n_embd)

  .venv/bin/python tools/make_embedding_goldens.py --llama-python /path/to/venv/bin/python

The interpreter with llama_cpp installed comes from --llama-python or $EDGED_LLAMA_PYTHON;
LLAMA_CPP_LIB_PATH picks its native library as usual.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "data", "goldens")

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog.",
         "a", "embeddings: mean, cls and last pooling; 12345 tokens!"]

# name -> (synthetic encoder shape or a path under ../shared/testdata/models, poolings)
CASES = {
    "bert": ("bert-tiny", ("mean", "cls")),
    "nomic-bert": ("nomic-bert-tiny", ("mean", "cls")),
    "stories260K": ("stories260K.gguf", ("last", "mean")),
}

LLAMA_EMBED = r"""
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama
path, out, texts, poolings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
kinds = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
         "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
res = {}
for p in poolings:
    llm = Llama(model_path=path, embedding=True, pooling_type=kinds[p], n_ctx=128, n_batch=128,
                n_ubatch=128, n_threads=2, flash_attn=False, verbose=False)
    for i, t in enumerate(texts):
        res[f"tokens_{i}"] = np.array(llm.tokenize(t.encode(), add_bos=True, special=False), np.int32)
    res[f"emb_{p}"] = np.array([llm.embed(t, normalize=True) for t in texts], np.float32)
    del llm
np.savez_compressed(out, **res)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"),
                    help="python interpreter with llama_cpp installed")
    ap.add_argument("cases", nargs="*", help=f"some of {', '.join(CASES)} (default: all)")
    a = ap.parse_args()
    if not a.llama_python:
        sys.exit("need --llama-python (or $EDGED_LLAMA_PYTHON)")
    sys.path.insert(0, ROOT)
    from edged.format.synth import synth_encoder
    os.makedirs(OUT, exist_ok=True)
    for name in a.cases or CASES:
        src, poolings = CASES[name]
        if src.endswith(".gguf"):
            path = os.path.join(ROOT, "..", "shared", "testdata", "models", src)
        else:
            path = os.path.join(OUT, f"embed-{name}.gguf")
            synth_encoder(src, "F32", path, seed=7)
        out = os.path.join(OUT, f"embed-{name}.embeddings.npz")
        subprocess.run([a.llama_python, "-c", LLAMA_EMBED, path, out, json.dumps(TEXTS),
                        json.dumps(list(poolings))], check=True)
        print(f"{name}: {out}")


if __name__ == "__main__":
    main()
