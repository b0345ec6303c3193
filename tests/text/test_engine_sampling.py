"""Sampler behaviour (compiled and NumPy twin) and stop-string matching."""
import numpy as np
import pytest

from edged.errors import RequestError
from edged.text.sampling import Sampler, SamplingParams, StopMatcher, keyed_uniform, sample_reference


def sampler(n, **params):
    return Sampler(n, SamplingParams(**params))


def logits_fixture(n=1000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


def test_greedy_is_argmax():
    x = logits_fixture()
    assert sampler(len(x)).sample(x) == int(np.argmax(x))


def test_same_seed_same_tokens_different_seed_differs():
    x = logits_fixture()
    a = sampler(len(x), temperature=1.5, seed=42)
    b = sampler(len(x), temperature=1.5, seed=42)
    c = sampler(len(x), temperature=1.5, seed=43)
    sa = [a.sample(x) for _ in range(50)]
    assert sa == [b.sample(x) for _ in range(50)]
    assert sa != [c.sample(x) for _ in range(50)]


def test_draw_is_keyed_by_seed_and_position_not_a_stream():
    """The token at position p depends on (seed, p) only: draws thrown away (a rejected
    speculative draft) or made out of order change nothing."""
    x = logits_fixture()
    a = sampler(len(x), temperature=1.5, seed=42)
    seq = [a.sample(x, p) for p in range(40)]
    b = sampler(len(x), temperature=1.5, seed=42)
    for p in range(40):
        b.sample(x * 0.5, p + 7)            # a draw at another position, thrown away
        assert b.sample(x, p) == seq[p]
    assert [sampler(len(x), temperature=1.5, seed=42).sample(x, p) for p in reversed(range(40))] == seq[::-1]
    assert len(set(seq)) > 5


def test_keyed_uniform_is_uniform_and_64_bit_keyed():
    u = np.array([keyed_uniform(7, p) for p in range(20000)])
    assert 0.0 <= u.min() and u.max() < 1.0
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist - 2000) < 200), hist             # ~4.5 sigma
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.03         # neighbours uncorrelated
    assert keyed_uniform(7, 3) == keyed_uniform(7 + (1 << 64), 3)   # the seed is taken mod 2**64
    assert keyed_uniform(7, 3) != keyed_uniform(7 + (1 << 32), 3)   # ... all 64 bits of it
    assert keyed_uniform(0, 0) != keyed_uniform(1, 0)


def test_top_k_restricts_candidates():
    x = logits_fixture()
    top3 = set(np.argsort(-x)[:3].tolist())
    s = sampler(len(x), temperature=2.0, top_k=3, top_p=1.0, seed=1)
    assert {s.sample(x) for _ in range(300)} <= top3
    assert len({s.sample(x) for _ in range(300)}) == 3


def test_top_p_keeps_smallest_nucleus():
    x = np.full(100, -10.0, np.float32)
    x[[5, 9, 20]] = [4.0, 3.0, 2.0]  # probabilities ~0.665, 0.245, 0.09
    s = sampler(len(x), temperature=1.0, top_p=0.8, seed=3)
    got = {s.sample(x) for _ in range(400)}
    assert got == {5, 9}


def test_min_p_drops_unlikely_tokens():
    x = np.full(50, 0.0, np.float32)
    x[7] = 5.0
    s = sampler(len(x), temperature=1.0, min_p=0.05, seed=0)
    assert {s.sample(x) for _ in range(200)} == {7}  # e^-5 < 0.05


def test_repetition_presence_frequency_penalties():
    x = np.zeros(10, np.float32)
    x[3], x[4] = 2.0, 1.9
    s = sampler(10, repeat_penalty=1.5)
    s.accept(3)
    assert s.sample(x) == 4          # 2.0 / 1.5 < 1.9
    s = sampler(10, presence_penalty=0.5)
    s.accept_many([3])
    assert s.sample(x) == 4
    s = sampler(10, frequency_penalty=0.06, penalty_last_n=2)
    s.accept_many([3, 3])
    assert s.sample(x) == 4          # 2.0 - 2 * 0.06 < 1.9 (one occurrence would not be enough)
    s.accept_many([5, 6])            # 3 falls out of the last-2 window
    assert s.sample(x) == 3


def test_logit_bias():
    x = logits_fixture()
    worst = int(np.argmin(x))
    assert sampler(len(x), logit_bias={worst: 100.0}).sample(x) == worst
    with pytest.raises(RequestError):
        sampler(len(x), logit_bias={len(x): 1.0})


def test_invalid_parameters_refused():
    for kw in ({"temperature": -1}, {"temperature": 2.5}, {"top_p": 1.5}, {"min_p": -0.1},
               {"top_k": -2}, {"top_k": 1.5}, {"temperature": float("nan")}, {"repeat_penalty": 0},
               {"penalty_last_n": -1}, {"logit_bias": {1: 101.0}}, {"seed": 1 << 64}):
        with pytest.raises(RequestError, match=next(iter(kw))):
            SamplingParams(**kw)


def test_tiny_temperature_is_greedy():
    """1/temperature would overflow float32: drawn as greedy, never inf or NaN."""
    assert SamplingParams(temperature=1e-39).temperature == 0.0
    assert SamplingParams(temperature=1e-30).temperature == 1e-30


def test_compiled_matches_reference():
    core = pytest.importorskip("edged._core")
    if not hasattr(core, "sample_logits"):
        pytest.skip("compiled sampler not built")
    rng = np.random.default_rng(5)
    for trial in range(200):
        x = (rng.standard_normal(2000) * 4).astype(np.float32)
        params = SamplingParams(repeat_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1,
                                temperature=float(rng.uniform(0.1, 2.0)), top_k=int(rng.integers(0, 50)),
                                top_p=float(rng.uniform(0.5, 1.0)), min_p=float(rng.uniform(0, 0.2)))
        args = (params, np.array([3, 17], np.int32), np.array([1.5, -2.0], np.float32),
                np.array([5, 9, 11], np.int32), np.array([1, 2, 3], np.int32), float(rng.random()))
        assert core.sample_logits(x, *args) == sample_reference(x, *args), trial


def test_compiled_sampler_is_fast_on_152k_vocab():
    core = pytest.importorskip("edged._core")
    if not hasattr(core, "sample_logits"):
        pytest.skip("compiled sampler not built")
    import time
    x = logits_fixture(151936)
    s = sampler(len(x), temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0,
                repeat_penalty=1.1)
    s.accept_many(list(range(64)))
    s.sample(x)
    t0 = time.process_time()  # CPU time: the test machine is shared
    for _ in range(50):
        s.sample(x)
    per = (time.process_time() - t0) / 50
    assert per < 0.002, f"{per * 1000:.2f} ms CPU per token"


@pytest.mark.parametrize("pieces,stop,want_text,hit", [
    (["Hel", "lo wor", "ld"], ["lo w"], "Hel", True),
    (["a", "b", "c", "d"], ["bc"], "a", True),
    (["abc", "def"], ["xyz"], "abcdef", False),
    (["ab", "c<", "/s", ">x"], ["</s>"], "abc", True),
    (["no stop"], [], "no stop", False),
])
def test_stop_matcher(pieces, stop, want_text, hit):
    m = StopMatcher(stop)
    out, got_hit = "", False
    for p in pieces:
        t, h = m.push(p)
        out += t
        if h:
            got_hit = True
            break
    if not got_hit:
        out += m.flush()
    assert out == want_text and got_hit == hit


def test_stop_matcher_holds_back_partial_match():
    m = StopMatcher(["STOP"])
    assert m.push("abcST") == ("abc", False)   # "ST" may start "STOP"
    assert m.push("x") == ("STx", False)


# --- the compiled sampler (no full sort) against the NumPy twin, token for token ------------

def _logits(kind, n, rng):
    """Logit vectors that stress different parts of the fast path."""
    if kind == "flat":        # the mass spread over tens of thousands of tokens
        return (rng.standard_normal(n) * 3).astype(np.float32)
    if kind == "peaked":      # LLM-like: a bulk far below a few leading tokens
        x = rng.standard_normal(n).astype(np.float32) * 2
        top = rng.choice(n, size=min(n, 20), replace=False)
        x[top] += rng.uniform(6, 14, len(top)).astype(np.float32)
        return x
    if kind == "ties":        # many equal logits: order among them is by id
        return np.round(rng.standard_normal(n) * 2).astype(np.float32)
    if kind == "masked":      # most of the vocabulary at -inf (a grammar or a logit bias)
        x = np.full(n, -np.inf, np.float32)
        keep = rng.choice(n, size=max(1, n // 50), replace=False)
        x[keep] = rng.standard_normal(len(keep)) * 2
        return x
    raise ValueError(kind)


CONFIGS = [  # temperature, top_k, top_p, min_p, penalties (repeat, presence, frequency, last_n)
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=2.0),
    dict(temperature=0.8, top_k=40),
    dict(temperature=1.0, top_k=1),
    dict(temperature=1.3, top_k=5000),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=0.6, top_p=0.5),
    dict(temperature=1.0, top_p=0.999),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=1.5, min_p=0.001),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=0.8, top_k=40, min_p=0.1),
    dict(temperature=1.1, top_p=0.95, min_p=0.02),
    dict(temperature=0.9, top_k=200, top_p=0.8),
    dict(temperature=0.8, top_p=0.95, repeat_penalty=1.3, presence_penalty=0.4,
         frequency_penalty=0.2, penalty_last_n=16),
    dict(temperature=1.0, logit_bias={0: 5.0, 3: -100.0, 7: 2.5}),
]


def _run(config, kind, n, seed, n_tokens, compiled):
    import edged.text.sampling as sampling
    rng = np.random.default_rng(seed)
    s = sampler(n, seed=seed, **config)
    saved = sampling._compiled_sample
    if not compiled:
        sampling._compiled_sample = None   # the Sampler falls back to sample_reference
    try:
        out = []
        for _ in range(n_tokens):
            t = s.sample(_logits(kind, n, rng))
            s.accept(t)
            out.append(t)
        return out
    finally:
        sampling._compiled_sample = saved


@pytest.fixture(params=["generic", "avx2", "avx512", "neon"])
def sampler_path(request):
    core = pytest.importorskip("edged._core")
    if request.param not in core.available_paths():
        pytest.skip(f"{request.param} not supported here")
    old = core.kernel_path()
    core.set_path(request.param)
    yield request.param
    core.set_path(old)


@pytest.mark.parametrize("kind", ["flat", "peaked", "ties", "masked"])
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_compiled_token_sequences_equal_reference(ci, kind):
    pytest.importorskip("edged._core")
    config = CONFIGS[ci]
    for seed, n in ((ci, 2003), (100 + ci, 32000)):
        want = _run(config, kind, n, seed, 12, compiled=False)
        got = _run(config, kind, n, seed, 12, compiled=True)
        assert got == want, (config, kind, n, seed)


def test_compiled_token_sequences_equal_reference_every_path(sampler_path):
    for ci, config in enumerate(CONFIGS):
        for kind in ("flat", "peaked", "masked"):
            want = _run(config, kind, 4099, ci, 6, compiled=False)
            assert _run(config, kind, 4099, ci, 6, compiled=True) == want, (config, kind)


@pytest.mark.parametrize("ci", [1, 2, 4, 7, 10, 12, 14])
def test_compiled_token_sequences_equal_reference_152k(ci):
    pytest.importorskip("edged._core")
    for kind in ("flat", "peaked"):
        want = _run(CONFIGS[ci], kind, 151936, 7 + ci, 4, compiled=False)
        assert _run(CONFIGS[ci], kind, 151936, 7 + ci, 4, compiled=True) == want


def test_compiled_tiny_and_degenerate_vocabularies():
    core = pytest.importorskip("edged._core")
    e32, ef = np.zeros(0, np.int32), np.zeros(0, np.float32)
    rng = np.random.default_rng(11)
    cases = [np.array([1.5], np.float32), np.array([0.0, 0.0], np.float32),
             np.zeros(5000, np.float32),                          # all tied
             np.array([np.nan, 1.0, 2.0, np.nan], np.float32),     # NaN never wins
             np.array([-np.inf, 3.0, -np.inf], np.float32),
             np.array([1e30, -1e30, 1e30], np.float32)]            # huge spread
    for x in cases:
        for args in ((1.0, 0, 1.0, 0.0), (0.7, 2, 0.9, 0.0), (1.0, 0, 0.5, 0.1)):
            p = _params(*args)
            for u in (0.0, 0.3, 0.999999):
                a = core.sample_logits(x, p, e32, ef, e32, e32, u)
                assert a == sample_reference(x, p, e32, ef, e32, e32, u)
                assert 0 <= a < len(x) and not np.isnan(x[a])
    x = (rng.standard_normal(3000) * 3).astype(np.float32)
    for u in np.linspace(0, 1, 41, endpoint=False):   # every part of the distribution
        for args in ((1.0, 0, 1.0, 0.0), (2.0, 0, 0.97, 0.0), (0.5, 300, 1.0, 0.0)):
            p = _params(*args)
            assert (core.sample_logits(x, p, e32, ef, e32, e32, float(u))
                    == sample_reference(x, p, e32, ef, e32, e32, float(u)))


def _params(temperature, top_k, top_p, min_p):
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


class _OnlyEnd:
    """A grammar that is complete: its mask allows only token 40 (an end token)."""

    def mask(self):
        m = np.zeros(2, np.uint32)
        m[40 >> 5] = np.uint32(1) << np.uint32(40 & 31)
        return m

    def consume(self, token):
        pass


@pytest.mark.parametrize("compiled", [True, False])
def test_min_tokens_holds_back_the_end_tokens_unless_the_grammar_allows_nothing_else(compiled, monkeypatch):
    from edged.text import sampling
    if compiled:
        pytest.importorskip("edged._core")
    else:
        monkeypatch.setattr(sampling, "_compiled_sample", None)
    ends = (3, 40)
    x = np.zeros(64, np.float32)
    x[list(ends)] = 10.0                 # the end tokens are the most likely
    s = Sampler(len(x), SamplingParams(min_tokens=3), end_ids=ends)
    drawn = [s.sample(x) for _ in range(4)]
    assert all(t not in ends for t in drawn[:3]) and drawn[3] in ends
    assert Sampler(len(x), SamplingParams(), end_ids=ends).sample(x) in ends
    s = Sampler(len(x), SamplingParams(min_tokens=3), constraint=_OnlyEnd(), end_ids=ends)
    assert s.sample(x) == 40
