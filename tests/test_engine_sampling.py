"""Sampler behaviour (compiled and NumPy twin) and stop-string matching."""
import numpy as np
import pytest

from edged.errors import RequestError
from edged.sampling import Sampler, StopMatcher, sample_reference


def logits_fixture(n=1000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


def test_greedy_is_argmax():
    x = logits_fixture()
    assert Sampler(len(x)).sample(x) == int(np.argmax(x))


def test_same_seed_same_tokens_different_seed_differs():
    x = logits_fixture()
    draw = lambda seed: [Sampler(len(x), temperature=1.5, seed=seed).sample(x) for _ in range(1)]  # noqa
    a = Sampler(len(x), temperature=1.5, seed=42)
    b = Sampler(len(x), temperature=1.5, seed=42)
    c = Sampler(len(x), temperature=1.5, seed=43)
    sa = [a.sample(x) for _ in range(50)]
    assert sa == [b.sample(x) for _ in range(50)]
    assert sa != [c.sample(x) for _ in range(50)]


def test_top_k_restricts_candidates():
    x = logits_fixture()
    top3 = set(np.argsort(-x)[:3].tolist())
    s = Sampler(len(x), temperature=5.0, top_k=3, top_p=1.0, seed=1)
    assert {s.sample(x) for _ in range(300)} <= top3
    assert len({s.sample(x) for _ in range(300)}) == 3


def test_top_p_keeps_smallest_nucleus():
    x = np.full(100, -10.0, np.float32)
    x[[5, 9, 20]] = [4.0, 3.0, 2.0]  # probabilities ~0.665, 0.245, 0.09
    s = Sampler(len(x), temperature=1.0, top_p=0.8, seed=3)
    got = {s.sample(x) for _ in range(400)}
    assert got == {5, 9}


def test_min_p_drops_unlikely_tokens():
    x = np.full(50, 0.0, np.float32)
    x[7] = 5.0
    s = Sampler(len(x), temperature=1.0, min_p=0.05, seed=0)
    assert {s.sample(x) for _ in range(200)} == {7}  # e^-5 < 0.05


def test_repetition_presence_frequency_penalties():
    x = np.zeros(10, np.float32)
    x[3], x[4] = 2.0, 1.9
    s = Sampler(10, repeat_penalty=1.5)
    s.accept(3)
    assert s.sample(x) == 4          # 2.0 / 1.5 < 1.9
    s = Sampler(10, presence_penalty=0.5)
    s.accept_many([3])
    assert s.sample(x) == 4
    s = Sampler(10, frequency_penalty=0.06, penalty_last_n=2)
    s.accept_many([3, 3])
    assert s.sample(x) == 4          # 2.0 - 2 * 0.06 < 1.9 (one occurrence would not be enough)
    s.accept_many([5, 6])            # 3 falls out of the last-2 window
    assert s.sample(x) == 3


def test_logit_bias():
    x = logits_fixture()
    worst = int(np.argmin(x))
    assert Sampler(len(x), logit_bias={worst: 100.0}).sample(x) == worst
    with pytest.raises(RequestError):
        Sampler(len(x), logit_bias={len(x): 1.0})


def test_invalid_parameters_refused():
    for kw in ({"temperature": -1}, {"top_p": 1.5}, {"min_p": -0.1}, {"top_k": -2}):
        with pytest.raises(RequestError):
            Sampler(10, **kw)


def test_compiled_matches_reference():
    core = pytest.importorskip("edged._core")
    if not hasattr(core, "sample_logits"):
        pytest.skip("compiled sampler not built")
    rng = np.random.default_rng(5)
    for trial in range(200):
        x = (rng.standard_normal(2000) * 4).astype(np.float32)
        args = (np.array([3, 17], np.int32), np.array([1.5, -2.0], np.float32),
                np.array([5, 9, 11], np.int32), np.array([1, 2, 3], np.int32),
                1.1, 0.2, 0.1, float(rng.uniform(0.1, 2.0)), int(rng.integers(0, 50)),
                float(rng.uniform(0.5, 1.0)), float(rng.uniform(0, 0.2)), float(rng.random()))
        assert core.sample_logits(x, *args) == sample_reference(x, *args), trial


def test_compiled_sampler_is_fast_on_152k_vocab():
    core = pytest.importorskip("edged._core")
    if not hasattr(core, "sample_logits"):
        pytest.skip("compiled sampler not built")
    import time
    x = logits_fixture(151936)
    s = Sampler(len(x), temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0,
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
