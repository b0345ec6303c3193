#!/usr/bin/env python3
"""Structured output's cost: decode tokens/s under a JSON schema against unconstrained decoding,
same model, same sampler settings, runs alternated, medians and their ratio.

The model is a random-weight qwen2.5-0.5b-shaped file (`edged synth --shape qwen2.5-0.5b`; its
synthetic vocabulary has the real size but not the real pieces), so the grammar runs on the real
Qwen2 vocabulary (151,936 ids, llama.cpp's ggml-vocab-qwen2.gguf from ../shared/testdata/vocab):
the mask is computed over Qwen's actual token trie, which is what its cost depends on. The
schema never completes within the run (an array of at least 1000 records), so every step pays
for a mask; a random model's logits keep the parser inside strings, numbers and keys in turn.

  .venv/bin/python tools/bench_structured.py --model /tmp/qwen0.5b-q8_0.gguf [-n 64] [-r 5]
"""
import argparse
import os
import statistics
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from edged.engine.model import Model  # noqa: E402
from edged.text import grammar  # noqa: E402
from edged.text.sampling import Sampler, SamplingParams  # noqa: E402
from edged.text.tokenizer import Tokenizer  # noqa: E402

QWEN2_VOCAB = os.path.join(os.path.dirname(HERE), "..", "shared", "testdata", "vocab", "ggml-vocab-qwen2.gguf")
SCHEMA = {"type": "array", "minItems": 1000, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "email", "tags"],
    "properties": {"name": {"type": "string", "maxLength": 40},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "email": {"type": "string", "pattern": "^[a-z0-9.]{1,20}@[a-z]{1,12}\\.[a-z]{2,4}$"},
                   "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4}}}}


class _Timed:
    """A Constraint that adds up the time spent computing masks."""

    def __init__(self, c):
        self.c, self.seconds = c, 0.0

    def mask(self):
        t = time.perf_counter()
        m = self.c.mask()
        self.seconds += time.perf_counter() - t
        return m

    def consume(self, token):
        self.c.consume(token)


def run(model, tok, g, n, seed):
    """(decode tokens/s over steps 1..n-1, mean ms per mask) of one run; each step is one
    forward pass + (mask) + sample, as in the daemon."""
    s = model.session(n_ctx=n + 16)
    constraint = _Timed(grammar.Constraint(g, tok, model.n_vocab)) if g else None
    sampler = Sampler(model.n_vocab, SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=seed),
                      constraint=constraint)
    logits = s.eval([tok.bos_id or 0] + tok.encode("Data:", add_special=False))
    t0 = None
    for i in range(n):
        if i == 1:
            t0 = time.perf_counter()
        t = sampler.sample(logits[-1])
        if constraint is not None and t in tok.eog_ids:
            raise SystemExit("the grammar allowed an end token: the schema completed too early")
        sampler.accept(t)
        logits = s.eval([t])
    dt = time.perf_counter() - t0
    s.close()
    return (n - 1) / dt, (constraint.seconds / n * 1e3 if constraint is not None else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="qwen2.5-0.5b-shaped GGUF (edged synth --shape qwen2.5-0.5b)")
    ap.add_argument("--vocab", default=QWEN2_VOCAB, help="GGUF whose tokenizer the grammar uses")
    ap.add_argument("-n", type=int, default=64, help="decode steps per run")
    ap.add_argument("-r", type=int, default=5, help="runs of each kind (alternated)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    a = ap.parse_args()
    model = Model.load(a.model, n_threads=a.threads)
    tok = Tokenizer.from_gguf(a.vocab)
    if model.n_vocab != tok.n_vocab:
        raise SystemExit(f"model has {model.n_vocab} logits, vocabulary {tok.n_vocab} ids")
    t0 = time.perf_counter()
    g = grammar.check(grammar.from_json_schema(SCHEMA), tok, model.n_vocab)
    print(f"llguidance tokenizer + grammar: {time.perf_counter() - t0:.2f} s (once per model / request)")
    free, json_ = [], []
    masks = []
    for r in range(a.r):
        free.append(run(model, tok, None, a.n, r)[0])
        tps, mask_ms = run(model, tok, g, a.n, r)
        json_.append(tps)
        masks.append(mask_ms)
        print(f"run {r}: unconstrained {free[-1]:.2f} tok/s, json schema {json_[-1]:.2f} tok/s, "
              f"mask {mask_ms:.3f} ms/token")
    mf, mj = statistics.median(free), statistics.median(json_)
    print(f"median: unconstrained {mf:.2f} tok/s, json schema {mj:.2f} tok/s, ratio {mj / mf:.3f}, "
          f"mask {statistics.median(masks):.3f} ms/token ({model.backend_name} backend, "
          f"EDGED_KERNELS={os.environ.get('EDGED_KERNELS', 'auto')})")


if __name__ == "__main__":
    main()
