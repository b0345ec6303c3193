"""Generation through the Python API: stories260K's 60 greedy tokens, prefix reuse, context
limit, stop strings, seeds."""
import numpy as np
import pytest

from conftest import testdata
from edged.text.sampling import SamplingParams


@pytest.fixture(scope="module", params=["cpu", "reference"])
def stories(request):
    from edged import Model
    m = Model.load(testdata("models", "stories260K.gguf"), backend=request.param, n_threads=2)
    yield m
    m.close()


def golden_stories():
    z = np.load(testdata("golden", "stories260K.golden.npz"))
    toks = z["tokens"].tolist()
    return toks[:int(z["n_prompt"])], toks[int(z["n_prompt"]):]


def test_stories_60_greedy_tokens(stories):
    prompt, want = golden_stories()
    s = stories.session(n_ctx=256)
    outs = list(s.generate(prompt, max_tokens=60))
    assert [o.token for o in outs] == want
    assert outs[-1].finish_reason == "length"
    assert all(o.finish_reason is None for o in outs[:-1])


def test_stories_text_prompt(stories):
    prompt, want = golden_stories()
    assert stories.tokenizer.encode("Once upon a time") == prompt
    text = "".join(o.text for o in stories.session(256).generate("Once upon a time", max_tokens=60))
    assert text == stories.tokenizer.decode(want)
    assert text.startswith(", there was a little girl named Lily.")


def test_prefix_reuse_evaluates_only_the_suffix(stories):
    prompt, want = golden_stories()
    s = stories.session(n_ctx=256)
    st = {}
    first = [o.token for o in s.generate(prompt, max_tokens=10, stats=st)]
    assert st["n_prompt_eval"] == len(prompt)
    # the cache now holds prompt + 9 evaluated tokens; continue from prompt + first 5
    st2 = {}
    again = [o.token for o in s.generate(prompt + first[:5], max_tokens=5, stats=st2)]
    assert st2["n_prompt_eval"] == 1  # everything but the last prompt token was reused
    assert again == want[5:10]
    # a different prompt drops the diverging part
    st3 = {}
    list(s.generate([1, 403], max_tokens=1, stats=st3))
    assert st3["n_prompt_eval"] == 1 and s.tokens[:2] == [1, 403]


def test_eval_logits_shapes_and_reset(stories):
    s = stories.session(n_ctx=32)
    a = s.eval([1, 403, 407], logits="all")
    assert a.shape == (3, stories.n_vocab) and a.dtype == np.float32
    b = s.eval([261])
    assert b.shape == (1, stories.n_vocab)
    assert s.n_past == 4
    s.reset()
    c = s.eval([1, 403, 407, 261], logits="all")
    np.testing.assert_allclose(c[-1], b[0], atol=1e-4)


def test_context_limit_finishes_with_length(stories):
    prompt, _ = golden_stories()
    s = stories.session(n_ctx=8)
    outs = list(s.generate(prompt, max_tokens=100))
    assert outs[-1].finish_reason == "length"
    assert len(outs) == 8 - len(prompt) + 1  # fills the context, then one more sampled token


def test_prompt_longer_than_context_refused(stories):
    from edged.errors import RequestError
    s = stories.session(n_ctx=4)
    with pytest.raises(RequestError, match="longer than the context"):
        list(s.generate([1, 403, 407, 261, 378], max_tokens=1))
    with pytest.raises(RequestError, match="do not fit the context"):
        s.eval([1, 2, 3, 4, 5])


def test_stop_string_spanning_tokens(stories):
    prompt, want = golden_stories()
    full = stories.tokenizer.decode(want)
    stop = "girl named"  # spans several tokens of ", there was a little girl named Lily."
    outs = list(stories.session(256).generate(prompt, max_tokens=60, stop=[stop]))
    text = "".join(o.text for o in outs)
    assert outs[-1].finish_reason == "stop"
    assert text == full[:full.index(stop)]


def test_seeded_sampling_is_reproducible(stories):
    prompt, _ = golden_stories()
    run = lambda seed: [o.token for o in stories.session(128).generate(  # noqa: E731
        prompt, SamplingParams(temperature=1.0, seed=seed), max_tokens=30)]
    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c


def test_eog_stops_generation(stories):
    prompt, _ = golden_stories()
    eos = stories.tokenizer.eos_id
    outs = list(stories.session(128).generate(prompt, SamplingParams(logit_bias={eos: 100.0}), max_tokens=50))
    assert len(outs) == 1 and outs[0].finish_reason == "stop" and outs[0].text == ""


def test_sessions_in_threads_share_one_model():
    """The Model is immutable and shared; sessions in parallel threads give the same tokens
    as one after the other."""
    import threading
    from edged import Model
    prompt, want = golden_stories()
    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=2)
    results = [None] * 4

    def work(i):
        results[i] = [o.token for o in m.session(128).generate(prompt, max_tokens=30)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m.close()
    assert all(r == want[:30] for r in results)
