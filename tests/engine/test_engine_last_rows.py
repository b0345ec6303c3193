"""The last layer runs only for the rows whose logits are wanted (docs/engine.md, "The last
layer for the wanted rows"): after attention has stored every row's K/V, the output
projection, the FFN and the output norm of the last layer run for a prompt's last row alone
(llama.cpp does the same). The wanted logits keep their bits: the last row of a prompt equals
that row of logits="all", every row of logits="all" is still there, a prompt chunk whose
logits nobody wants still fills the cache, and hidden states (embeddings) keep every row."""
import os

import numpy as np
import pytest

from conftest import ROOT, testdata

pytest.importorskip("edged._core")

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# post norms and soft-capping (gemma2), experts (qwen3moe, qwen2moe's shared expert), gpt-oss's
# sinks, biases and MXFP4 experts, granite's residual and logit scales, a Q4_0 file (repacked)
FILES = [testdata("models", SMOL), testdata("models", "synthetic-llama-Q4_0.gguf"),
         testdata("models", "synthetic-gemma3-Q4_K_M.gguf")]
FAMILIES = ["synthetic-gemma2.gguf", "synthetic-qwen3moe.gguf", "synthetic-qwen2moe.gguf",
            "synthetic-gpt-oss-mxfp4.gguf", "synthetic-granite.gguf"]


def _path(name):
    return os.path.join(ROOT, "tests", "data", "goldens", name)


def _prompt(m, n, seed=3):
    return np.random.default_rng(seed).integers(0, m.n_vocab, n).tolist()


@pytest.mark.parametrize("path", FILES + [_path(f) for f in FAMILIES])
def test_last_row_equals_its_row_of_all_logits(path, kernel_path):
    from edged import Model
    m = Model.load(path, n_threads=2)
    try:
        toks = _prompt(m, 29)
        last = m.session(n_ctx=64).eval(toks)
        every = m.session(n_ctx=64).eval(toks, logits="all")
        assert last.shape == (1, m.n_vocab) and every.shape == (29, m.n_vocab)
        np.testing.assert_array_equal(last, every[-1:])
        # every row of logits="all" is that token's own logits (token by token)
        one = m.session(n_ctx=64)
        alone = np.concatenate([one.eval([t]) for t in toks])
        np.testing.assert_array_equal(every, alone)
        # the next token after a prompt whose last layer ran for one row: the cache is whole
        s, t = m.session(n_ctx=64), m.session(n_ctx=64)
        s.eval(toks)
        t.eval(toks, logits="all")
        np.testing.assert_array_equal(s.eval([5]), t.eval([5]))
    finally:
        m.close()


def test_only_the_wanted_rows_run_the_last_layer():
    """The state's rows after a prompt: the last row's final residual has moved to row 0 (the
    others were not computed past attention); with all_rows every row keeps its own, and the
    last row's is the same bits either way."""
    from edged import Model
    m = Model.load(testdata("models", SMOL), n_threads=2)
    try:
        be = m.backend
        toks = _prompt(m, 12)
        bufs = [be.alloc(32, 16) for _ in range(2)]
        for buf, all_rows in zip(bufs, (False, True)):
            be.copy_in(buf, toks, 0)
            be.forward(buf, len(toks), 0, False, all_rows=all_rows)
        one, every = (np.array(b.state.input_rows()[:len(toks)]) for b in bufs)
        np.testing.assert_array_equal(one[0], every[-1])
        assert not np.array_equal(every[0], every[-1])
        np.testing.assert_array_equal(be.copy_out(bufs[0], 1), be.copy_out(bufs[1], 1))
    finally:
        m.close()


def test_hidden_states_keep_every_row():
    """Mean-pooled embeddings read every row's final hidden state: row i of a prompt's hidden
    states is row i of that prompt cut after token i (a causal model)."""
    from edged import Model
    m = Model.load(testdata("models", SMOL), n_threads=1)
    try:
        toks = _prompt(m, 10)
        full = m.embed([toks], pooling="none", normalize=False, add_special=False)[0]
        assert full.shape[0] == 10
        for i in (0, 4, 9):
            cut = m.embed([toks[:i + 1]], pooling="none", normalize=False, add_special=False)[0]
            np.testing.assert_array_equal(full[i], cut[i])
    finally:
        m.close()


def test_a_chunk_without_logits_still_fills_the_cache():
    """A step where no row wants logits (a prompt chunk riding alone) skips the last layer's
    rows entirely; the cache it wrote gives the same next logits as a prompt in one piece."""
    from edged import BatchEntry, Model
    m = Model.load(testdata("models", SMOL), n_threads=2)
    try:
        toks = _prompt(m, 30)
        a, b = m.session(n_ctx=64), m.session(n_ctx=64)
        out = m.decode([BatchEntry(a, toks[:20], logits=None), BatchEntry(b, toks[:9], logits=None)])
        assert out == [None, None]
        want = m.session(n_ctx=64)
        np.testing.assert_array_equal(a.eval(toks[20:]), want.eval(toks))
        np.testing.assert_array_equal(b.eval(toks[9:]), m.session(n_ctx=64).eval(toks))
    finally:
        m.close()
