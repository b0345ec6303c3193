"""llama.cpp's recorded logits (../shared/testdata/golden) beside edged's, fed the way generation
runs: the prompt as one batch, then one token at a time."""
import numpy as np

from conftest import testdata
from edged import Model


def teacher_forced(name, backend):
    """(edged's logits, llama.cpp's) for a golden file, fed the way generation runs."""
    z = np.load(testdata("golden", name + ".golden.npz"))
    toks, n_prompt, ref = z["tokens"].tolist(), int(z["n_prompt"]), z["logits"]
    m = Model.load(testdata("models", name + ".gguf"), backend=backend, n_threads=2)
    try:
        s = m.session(n_ctx=512)
        rows = [s.eval(toks[:n_prompt], logits="all")]  # the prompt as one batch
        for t in toks[n_prompt:]:                         # then one token at a time
            rows.append(s.eval([t]))
        got = np.concatenate(rows)
    finally:
        m.close()
    assert got.shape == ref.shape
    return got, ref
