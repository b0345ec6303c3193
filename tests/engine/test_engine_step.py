"""The step API: Model.decode(entries) evaluates prompt chunks and decode tokens of several
sessions in one call (as llama_decode(batch)); Session.start/Generation is what generate() and
the daemon's scheduler drive; Session.fork copies a KV cache."""
import numpy as np
import pytest

from conftest import testdata
from edged.text.sampling import SamplingParams


@pytest.fixture(scope="module", params=["cpu", "reference"])
def m(request):
    from edged import Model
    model = Model.load(testdata("models", "stories260K.gguf"), backend=request.param, n_threads=2)
    yield model
    model.close()


def _prompt(m, n, seed):
    return np.random.default_rng(seed).integers(0, m.n_vocab, n).tolist()


def test_mixed_batch_equals_each_entry_alone(m):
    """One call with a prompt chunk (no logits), a last prompt chunk ("all"), and single
    decode tokens of two sessions: every result is bit for bit what the entry gives alone."""
    from edged.engine.batch import BatchEntry
    pre = [_prompt(m, 5 + 3 * i, i) for i in range(4)]
    batch = [m.session(64) for _ in range(4)]
    alone = [m.session(64) for _ in range(4)]
    for s, t, p in zip(batch, alone, pre):
        s.eval(p)
        t.eval(p)
    chunk_a, chunk_b = _prompt(m, 9, 10), _prompt(m, 4, 11)
    got = m.decode([BatchEntry(batch[0], chunk_a, logits=None),
                    BatchEntry(batch[1], [7]),
                    BatchEntry(batch[2], chunk_b, logits="all"),
                    BatchEntry(batch[3], [9])])
    assert got[0] is None
    assert got[1].shape == (1, m.n_vocab) and got[2].shape == (4, m.n_vocab)
    alone[0].eval(chunk_a)
    np.testing.assert_array_equal(got[1], alone[1].eval([7]))
    np.testing.assert_array_equal(got[2], alone[2].eval(chunk_b, logits="all"))
    np.testing.assert_array_equal(got[3], alone[3].eval([9]))
    assert [s.tokens for s in batch] == [t.tokens for t in alone]
    # the chunk really is in the cache: the next token's logits agree
    np.testing.assert_array_equal(batch[0].eval([3]), alone[0].eval([3]))


def test_position_rewinds_and_refusals_change_nothing(m):
    from edged.engine.batch import BatchEntry
    from edged.errors import RequestError
    p = _prompt(m, 12, 3)
    s, t = m.session(32), m.session(32)
    s.eval(p)
    t.eval(p[:6])
    # pos 6 < n_past 12: the cache from 6 on is forgotten, the new tokens go there
    got = m.decode([BatchEntry(s, [5, 6], pos=6)])[0]
    np.testing.assert_array_equal(got, t.eval([5, 6]))
    assert s.tokens == p[:6] + [5, 6]
    before = list(s.tokens)
    for entries, needle in [
        ([BatchEntry(s, [1], pos=9)], "position 9 outside"),
        ([BatchEntry(s, [1]), BatchEntry(s, [2])], "twice"),
        ([BatchEntry(s, [1]), BatchEntry(t, [m.n_vocab])], "out of range"),
        ([BatchEntry(s, [1] * 30)], "do not fit the context"),
        ([BatchEntry(s, [])], "without tokens"),
        ([BatchEntry(s, [1], logits="first")], "logits='first'"),
        ([], "empty batch"),
    ]:
        with pytest.raises(RequestError, match=needle):
            m.decode(entries)
        assert s.tokens == before       # checked before anything ran or was forgotten


def test_generate_is_a_loop_over_decode_and_chunking_keeps_the_text(m):
    """start() + entry(budget) + accept() with a small prompt budget (the scheduler's chunks)
    gives generate()'s tokens; the prefix found in the cache is not evaluated again."""
    p = _prompt(m, 40, 5)
    want = [o.token for o in m.session(128).generate(p, max_tokens=12)]
    s = m.session(128)
    g = s.start(p, max_tokens=12)
    assert (g.n_cached, g.n_pending) == (0, 40)
    toks, steps = [], 0
    while True:
        steps += 1
        out = g.accept(m.decode([g.entry(7)])[0])
        if out is not None:
            toks.append(out.token)
            if out.finish_reason:
                break
    assert toks == want and out.finish_reason == "length"
    assert steps == 6 + 11              # ceil(40 / 7) prompt steps (the last samples token 1)
    g2 = s.start(p + want[:4], max_tokens=3)
    assert g2.n_cached == 43 and g2.n_pending == 1


def test_fork_copies_the_cache(m):
    """A fork holds the same KV cache and tokens (its next step equals the original's bit for
    bit), and the two are independent afterwards."""
    p = _prompt(m, 20, 8)
    s = m.session(64)
    s.eval(p)
    f = s.fork()
    assert f.tokens == s.tokens and f is not s and (f.n_ctx, f.n_batch) == (s.n_ctx, s.n_batch)
    twin = m.session(64)
    twin.eval(p)
    np.testing.assert_array_equal(f.eval([11]), twin.eval([11]))
    # the original was not touched by the fork's step: it diverges on its own
    other = m.session(64)
    other.eval(p)
    np.testing.assert_array_equal(s.eval([12]), other.eval([12]))
    # n > 1: forks of one prefill sampled with different seeds evaluate one prompt token each
    gens = [s.fork().start(p + [12], SamplingParams(temperature=1.0, seed=k), max_tokens=4) for k in range(3)]
    assert [g.n_pending for g in gens] == [1, 1, 1]
