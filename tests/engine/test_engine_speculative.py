"""Speculative decoding never changes a token: with speculation on, every generation gives the
tokens it gives with speculation off (greedy and seeded sampling, penalties, a grammar, stop
strings, max_tokens and the context's end), alone and in a batch of 4 streams, on 1 and 2
threads, with prompt lookup, a draft model (the target itself: right under greedy), and
drafters that are always right or always wrong."""
import numpy as np
import pytest

from conftest import testdata
from edged.engine.speculative import DRAFT_GROW, DRAFT_START, Drafter, LookupDrafter, Speculation, check_vocab
from edged.errors import ConfigError, RequestError
from edged.text.sampling import Sampler, SamplingParams

MODELS = ["stories260K.gguf", "synthetic-llama-Q8_0.gguf", "synthetic-qwen3-Q4_K_M.gguf",
          "SmolLM2-135M-Instruct.Q4_1.gguf"]
PARAMS = [SamplingParams(),
          SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=11),
          SamplingParams(temperature=1.2, repeat_penalty=1.3, presence_penalty=0.5, penalty_last_n=16, seed=5)]
N_GEN = 20


@pytest.fixture(scope="module", params=[(name, t) for name in MODELS for t in (1, 2)],
                ids=lambda p: f"{p[0].split('.gguf')[0]}-t{p[1]}")
def m(request):
    from edged import Model
    name, threads = request.param
    if threads == 2 and not name.startswith(("stories", "SmolLM2")):
        pytest.skip("2 threads: the two real-vocabulary models are enough")
    model = Model.load(testdata("models", name), n_threads=threads)
    yield model
    model.close()


def prompts(m):
    """Prompts whose continuation copies from them (lookup finds drafts) and plain ones."""
    if m.tokenizer.n_vocab > 1000 and "SmolLM2" in m.path:
        texts = ["Copy the list: apples, pears, plums, cherries, figs.\nList: apples, pears,",
                 '{"name": "Ada", "age": 36, "city": "London"}\nSame JSON with age 37:\n{"name": "Ada",',
                 "Once upon a time there was a little robot who",
                 "The capital of France is Paris. The capital of France is"]
        return [m.tokenizer.encode(t) for t in texts]
    rng = np.random.default_rng(len(m.path))
    out = []
    for i in range(4):
        unit = rng.integers(3, m.n_vocab, 6 + i).tolist()
        out.append(unit * 3 if i % 2 == 0 else rng.integers(3, m.n_vocab, 10).tolist())
    return out


class Oracle(Drafter):
    """A drafter that knows the plain reply `ref` of a prompt: right (its next tokens) or wrong
    (each of them + 1) every time, or wrong at the reply's positions in `wrong_at`; the k of each
    step in `ks`."""

    def __init__(self, n_prompt, ref, n_vocab, wrong, draft_max=5, adapt=True, wrong_at=()):
        super().__init__(draft_max, adapt)
        self.n_prompt, self.ref, self.n_vocab, self.wrong = n_prompt, ref, n_vocab, wrong
        self.wrong_at, self.ks = set(wrong_at), []

    def drafter(self, session):
        return self

    def draft(self, context, k):
        self.ks.append(k)
        j = len(context) - self.n_prompt        # tokens generated so far
        return [(t + 1) % self.n_vocab if self.wrong or j + i in self.wrong_at else t
                for i, t in enumerate(self.ref[j:j + k])]


def plain(m, prompt, params, **kw):
    s = m.session(kw.pop("n_ctx", 128))
    try:
        return [(o.token, o.text, o.finish_reason) for o in s.generate(prompt, params, max_tokens=kw.pop("max_tokens", N_GEN), **kw)]
    finally:
        s.close()


def speculated(m, prompt, params, spec, **kw):
    s = m.session(kw.pop("n_ctx", 128))
    st = {}
    try:
        out = [(o.token, o.text, o.finish_reason) for o in
               s.generate(prompt, params, max_tokens=kw.pop("max_tokens", N_GEN), stats=st, speculative=spec, **kw)]
        return out, st
    finally:
        s.close()


@pytest.fixture(scope="module")
def other(m):
    """A different model of the same vocabulary, or None: stories260K and the synthetic llama
    files share theirs."""
    from edged import Model
    name = {"stories260K.gguf": "synthetic-llama-Q4_0.gguf",
            "synthetic-llama-Q8_0.gguf": "stories260K.gguf"}.get(m.path.rsplit("/", 1)[-1])
    if name is None:
        yield None
        return
    d = Model.load(testdata("models", name), n_threads=1)
    yield d
    d.close()


def specs(m, prompt, ref, other=None):
    toks = [t for t, _, _ in ref if t is not None]
    extra = {"draft-other": Speculation("draft", draft_model=other, draft_max=4)} if other else {}
    return {**extra, "lookup": Speculation("lookup", draft_max=6, ngram_min=1), "lookup-default": Speculation("lookup"),
            "lookup-fixed": Speculation("lookup", draft_max=8, adapt=False),
            "lookup-1": Speculation("lookup", draft_max=1, ngram_min=1, ngram_max=1),
            "draft-self": Speculation("draft", draft_model=m, draft_max=4),
            "right": Oracle(len(prompt), toks, m.n_vocab, wrong=False),
            "wrong": Oracle(len(prompt), toks, m.n_vocab, wrong=True)}


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded", "penalties"])
def test_alone_same_tokens_as_plain(m, other, params):
    real = "SmolLM2" in m.path
    if real and params.repeat_penalty != 1.0 and m.n_threads == 2:
        pytest.skip("the real model on 2 threads: greedy and seeded are enough")
    drafted = {}
    for prompt in prompts(m)[:3] if real else prompts(m):
        ref = plain(m, prompt, params)
        for name, spec in specs(m, prompt, ref, other).items():
            got, st = speculated(m, prompt, params, spec)
            assert got == ref, name
            drafted[name] = drafted.get(name, 0) + st["n_drafted"]
            if name == "right":
                assert st["n_accepted"] == st["n_drafted"] > 0
            elif name == "wrong":
                assert st["n_accepted"] == 0 and st["n_drafted"] > 0
            elif name == "draft-self" and params.greedy:
                assert st["n_accepted"] == st["n_drafted"] > 0
            elif name == "draft-other":
                assert st["n_drafted"] > 0
    assert drafted["lookup"] > 0


def test_batch_of_four_streams_same_tokens_as_plain(m):
    """4 generations (each with its own drafter, one without) stepped together through one
    Model.decode per step, as the daemon's scheduler does: each gives its plain tokens."""
    ps = prompts(m)
    params = [PARAMS[i % len(PARAMS)] for i in range(4)]
    refs = [plain(m, p, q) for p, q in zip(ps, params)]
    chosen = [Speculation("lookup", draft_max=4), specs(m, ps[1], refs[1])["right"], None,
              Speculation("draft", draft_model=m, draft_max=3)]
    sessions = [m.session(128) for _ in ps]
    gens = [s.start(p, q, max_tokens=N_GEN, speculative=sp) for s, p, q, sp in zip(sessions, ps, params, chosen)]
    got = [[] for _ in ps]
    live = list(range(4))
    while live:
        entries = [gens[i].entry(5) for i in live]     # prompts in chunks of 5 beside the streams
        for i, logits in zip(list(live), m.decode(entries)):
            for o in gens[i].accept_all(logits):
                got[i].append((o.token, o.text, o.finish_reason))
                if o.finish_reason:
                    live.remove(i)
    for s in sessions:
        s.close()
    assert got == refs
    assert gens[1].n_accepted > 0


def test_stop_strings_max_tokens_and_context_end(m):
    prompt = prompts(m)[0]
    for params in PARAMS[:1 if "SmolLM2" in m.path else 2]:
        ref = plain(m, prompt, params, max_tokens=40)
        text = "".join(t for _, t, _ in ref)
        stop = text[len(text) // 2:len(text) // 2 + 3] if len(text) > 8 else None
        cases = [dict(max_tokens=1), dict(max_tokens=7), dict(n_ctx=len(prompt) + 5, max_tokens=40),
                 dict(stop=[stop] if stop and stop.strip() else [], max_tokens=40)]
        for kw in cases:
            want = plain(m, prompt, params, **dict(kw))
            toks = [t for t, _, _ in plain(m, prompt, params, n_ctx=kw.get("n_ctx", 128), max_tokens=40) if t is not None]
            for spec in (Speculation("lookup", draft_max=8), Oracle(len(prompt), toks, m.n_vocab, False)):
                got, _ = speculated(m, prompt, params, spec, **dict(kw))
                assert got == want, kw


def test_grammar_constrained_same_tokens(m):
    """A grammar advances over accepted tokens only: a draft it would refuse is never consumed."""
    if "SmolLM2" not in m.path:
        pytest.skip("a JSON grammar needs a real vocabulary")
    from edged.text import grammar
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
              "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": False}
    g = grammar.check(grammar.from_json_schema(schema), m.tokenizer)
    prompt = m.tokenizer.encode('{"name": "Bob", "age": 41}\n{"name": "Bob", "age": 41}\n')
    for params in PARAMS[:2]:
        def run(spec):
            s = m.session(128)
            smp = Sampler(m.n_vocab, params, constraint=grammar.Constraint(g, m.tokenizer))
            try:
                return [o.token for o in s.generate(prompt, params, max_tokens=20, sampler=smp, speculative=spec)]
            finally:
                s.close()
        ref = run(None)
        assert run(Speculation("lookup")) == ref
        assert run(Oracle(len(prompt), [t for t in ref if t is not None], m.n_vocab, True)) == ref


def test_lookup_drafts_the_continuation_of_the_longest_recent_ngram():
    d = LookupDrafter(draft_max=4, ngram_min=1, ngram_max=3)
    ctx = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    assert d.draft(ctx, 4) == [4, 5, 9, 2]          # [1, 2, 3] at the start, not [2, 3] -> 7
    assert d.draft(ctx + [4], 3) == [5, 9, 2]       # [2, 3, 4]
    assert d.draft(ctx + [4, 5, 9, 2, 3], 2) == [7, 8]   # the latest [9, 2, 3]... is the only one
    assert LookupDrafter(ngram_min=2, ngram_max=2).draft([1, 2, 9, 5, 2], 3) == []   # no 1-grams
    assert d.draft([5, 6], 3) == [] and LookupDrafter().draft([], 3) == []


def test_draft_length_grows_on_accepted_drafts_and_falls_on_a_rejection(m):
    """With adapt a step drafts DRAFT_START tokens, DRAFT_GROW times more after a step whose
    drafts were all accepted (up to draft_max), 1 after a rejection; the tokens stay plain's."""
    prompt = prompts(m)[0]
    ref = plain(m, prompt, PARAMS[0], max_tokens=40)
    toks = [t for t, _, _ in ref if t is not None]
    if len(toks) < 40:
        pytest.skip("the reply ends before 40 tokens")
    right = Oracle(len(prompt), toks, m.n_vocab, False, draft_max=10)
    assert speculated(m, prompt, PARAMS[0], right, max_tokens=40)[0] == ref
    grown = min(10, DRAFT_START * DRAFT_GROW)
    assert right.ks[:3] == [DRAFT_START, grown, min(10, grown * DRAFT_GROW)]
    # wrong at reply positions 3 and 6: drafts 1..4 (2 accepted: k 1), 4 (right: k 3), 6..8
    # (none: k 1), 7 (right: k 3)
    mixed = Oracle(len(prompt), toks, m.n_vocab, False, draft_max=10, wrong_at=(3, 6))
    assert speculated(m, prompt, PARAMS[0], mixed, max_tokens=40)[0] == ref
    assert mixed.ks[:5] == [DRAFT_START, 1, DRAFT_GROW, 1, DRAFT_GROW]
    fixed = Oracle(len(prompt), toks, m.n_vocab, True, draft_max=7, adapt=False)
    assert speculated(m, prompt, PARAMS[0], fixed, max_tokens=40)[0] == ref
    assert set(fixed.ks[:-6]) == {7}                                # the last ones: max_tokens
    lookup = Speculation("lookup", draft_max=6).drafter(None)
    assert lookup.k == min(DRAFT_START, 6) and Speculation("lookup", adapt=False).drafter(None).k == 10


def test_accept_without_accept_all_and_bad_settings_are_refused(m):
    s = m.session(64)
    g = s.start(prompts(m)[0], speculative="lookup")
    with pytest.raises(RequestError, match="accept_all"):
        g.accept(m.decode([g.entry()])[0])
    s.close()
    for kw, msg in ((dict(mode="fast"), "speculative='fast'"), (dict(draft_max=0), "draft_max=0"),
                    (dict(mode="draft"), "needs a draft model"), (dict(ngram_min=3, ngram_max=2), "ngram")):
        with pytest.raises(ConfigError, match=msg):
            Speculation(**kw)


def test_draft_model_of_another_vocabulary_is_refused(m):
    from edged import Model
    if "SmolLM2" not in m.path:
        pytest.skip("SmolLM2 against stories260K is the pair")
    d = Model.load(testdata("models", "stories260K.gguf"), n_threads=1)
    try:
        with pytest.raises(ConfigError, match="vocabulary differs"):
            check_vocab(m, d)
        s = m.session(64)
        with pytest.raises(ConfigError, match="vocabulary differs"):
            s.start([1, 2, 3], speculative=Speculation("draft", draft_model=d))
        s.close()
    finally:
        d.close()
