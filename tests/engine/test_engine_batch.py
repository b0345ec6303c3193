"""Model.decode_batch: one forward pass for the next token of several sessions (continuous
batching in the daemon). Each row must equal that session's own single-step logits."""
import numpy as np
import pytest

from conftest import testdata

# A decode batch runs every row through kernels that sum in the one-token dot's canonical order
# (forward.h, ed_rows; ed_types.h), so a row equals the session's own single step exactly: a
# request's output does not depend on which others share its batch. Tolerance 0, on every
# kernel path.
TOL = 0.0

# every weight type: F32 (stories260K), Q4_K + Q6_K (the Q4_K_M files), Q2_K + Q3_K, Q3_K + Q4_K
# + Q5_K (Q3_K_M), one file per remaining type
MODELS = ["stories260K.gguf", "synthetic-qwen2-Q4_K_M.gguf", "synthetic-llama-Q4_K_M.gguf",
          "synthetic-gemma3-Q4_K_M.gguf", "synthetic-phi3-Q4_K_M.gguf",
          "synthetic-llama-Q5_0.gguf", "synthetic-qwen3-Q8_0.gguf", "synthetic-llama-Q4_0.gguf",
          "synthetic-llama-Q4_1.gguf", "synthetic-llama-Q5_1.gguf", "synthetic-llama-Q2_K.gguf",
          "synthetic-llama-Q3_K_M.gguf", "synthetic-llama-Q5_K_M.gguf", "synthetic-llama-Q6_K.gguf",
          "synthetic-llama-F16.gguf", "synthetic-llama-BF16.gguf"]


@pytest.fixture(params=["auto", "generic", "avx2", "avx2-vnni"])  # avx2-vnni: plain AVX2 anywhere
def kernels(request):
    from edged import _core
    from edged.errors import ConfigError
    before = _core.kernel_path()
    try:
        _core.select_kernels(request.param)
    except ConfigError:
        pytest.skip(f"kernel path {request.param} not supported on this CPU")
    yield request.param
    _core.select_kernels(before)


def _pairs(m, rng, n, n_batch=512):
    """n batched sessions and n twins with the same prompts, of different lengths/contexts."""
    batch = [m.session(n_ctx=48 + 16 * i, n_batch=n_batch) for i in range(n)]
    twins = [m.session(n_ctx=48 + 16 * i, n_batch=n_batch) for i in range(n)]
    for i, (s, t) in enumerate(zip(batch, twins)):
        p = rng.integers(0, m.n_vocab, 2 + 9 * i).tolist()
        s.eval(p)
        t.eval(p)
    return batch, twins


@pytest.mark.parametrize("name", MODELS)
def test_batch_rows_equal_single_steps(name, kernels):
    from edged import Model
    m = Model.load(testdata("models", name), n_threads=2)
    rng = np.random.default_rng(7)
    batch, twins = _pairs(m, rng, 4)
    for step in range(6):
        toks = rng.integers(0, m.n_vocab, 4).tolist()
        got = m.decode_batch(batch, toks)
        want = np.concatenate([t.eval([k]) for t, k in zip(twins, toks)])
        assert got.shape == (4, m.n_vocab) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=f"step {step}")
        assert [s.n_past for s in batch] == [t.n_past for t in twins]
        assert [s.tokens for s in batch] == [t.tokens for t in twins]
    # a session leaves, one of another length joins: the rest are undisturbed
    batch, twins = batch[1:3], twins[1:3]
    toks = [5, 9]
    np.testing.assert_allclose(m.decode_batch(batch, toks),
                               np.concatenate([t.eval([k]) for t, k in zip(twins, toks)]),
                               rtol=0, atol=TOL)
    m.close()


def test_reference_backend_does_the_same_row_by_row():
    from edged import Model
    m = Model.load(testdata("models", "synthetic-qwen2-Q4_K_M.gguf"), backend="reference")
    rng = np.random.default_rng(3)
    batch, twins = _pairs(m, rng, 3)
    toks = [1, 2, 3]
    np.testing.assert_array_equal(m.decode_batch(batch, toks),
                                  np.concatenate([t.eval([k]) for t, k in zip(twins, toks)]))
    m.close()


def test_small_scratch_falls_back_and_refusals():
    """A batch wider than every session's scratch runs row by row (same numbers); bad calls
    are refused before anything runs."""
    from edged import Model
    from edged.errors import RequestError
    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=2)
    rng = np.random.default_rng(5)
    batch, twins = _pairs(m, rng, 3, n_batch=2)
    toks = [7, 8, 9]
    np.testing.assert_allclose(m.decode_batch(batch, toks),
                               np.concatenate([t.eval([k]) for t, k in zip(twins, toks)]),
                               rtol=0, atol=TOL)
    with pytest.raises(RequestError, match="twice"):
        m.decode_batch([batch[0], batch[0]], [1, 2])
    with pytest.raises(RequestError, match="out of range"):
        m.decode_batch(batch[:1], [m.n_vocab])
    full = m.session(n_ctx=4)
    full.eval([1, 2, 3, 4])
    with pytest.raises(RequestError, match="do not fit"):
        m.decode_batch([batch[0], full], [1, 2])
    assert batch[0].n_past == twins[0].n_past      # nothing appended by a refused call
    m.close()


def test_generations_stepped_together_equal_one_at_a_time():
    """Three generations driven the way the daemon's scheduler drives them (one Model.decode
    per step holding every generation's entry: prompts and decode tokens mixed, the single
    tokens in one pass) give the text each gives alone."""
    from edged import Model
    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=2)
    prompts = ["Once upon a time", "The cat", "Lily went to the park and"]
    want = ["".join(o.text for o in m.session(128).generate(p, max_tokens=20)) for p in prompts]
    gens = [m.session(128).start(p, max_tokens=20) for p in prompts]
    texts = [[] for _ in prompts]
    live = list(range(len(prompts)))
    batched = 0
    while live:
        entries = [gens[i].entry() for i in live]
        batched += sum(len(e.tokens) == 1 for e in entries) > 1
        for i, logits in zip(list(live), m.decode(entries)):
            out = gens[i].accept(logits)
            texts[i].append(out.text)
            if out.finish_reason:
                live.remove(i)
    assert batched > 10
    assert ["".join(t) for t in texts] == want
