"""LFM2 (`lfm2`): gated short convolutions beside a few attention layers, against llama.cpp.

tests/data/goldens/synthetic-lfm2 is a scaled-down LFM2 (n_embd 64, layers 0, 1, 3, 4 short
convolutions of 3 taps, layers 2 and 5 attention with q/k norms; tools/make_goldens.py lfm2)
with llama.cpp's teacher-forced logits: a 40-token prompt, then its greedy continuation of 24.
A convolution layer keeps its input B * x per position (the convolution cache, beside the K/V
rows), so every way a session is rewound, forked or batched must give what a cold start gives.
"""
import os

import numpy as np
import pytest

from edged import Model
from edged.engine.speculative import Speculation
from edged.errors import StateFileError

from family_goldens import GOLDENS, alone_batched_forked, check_every_kernel_path, greedy

LFM2 = os.path.join(GOLDENS, "synthetic-lfm2.gguf")
GOLDEN = np.load(os.path.join(GOLDENS, "synthetic-lfm2.golden.npz"))
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])


@pytest.fixture
def core():
    return pytest.importorskip("edged._core")


def test_golden_every_kernel_path(core):
    """Teacher-forced logits within the F16 tolerances on generic, avx2 and avx512 (every
    path this CPU has)."""
    check_every_kernel_path(core, "synthetic-lfm2")


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_greedy_16_tokens_as_llama_cpp(backend):
    """Greedy generation from the prompt gives llama.cpp's 16 next tokens."""
    if backend == "cpu":
        pytest.importorskip("edged._core")
    assert greedy(LFM2, backend, TOKENS[:N_PROMPT], 16) == TOKENS[N_PROMPT:N_PROMPT + 16]


def _last(s, ids):
    return s.eval(ids)[0]


def test_batch_chunks_and_single_tokens_agree(core):
    """The prompt in one batch, in chunks that split a convolution window, and one token at a
    time: the same bits (a window reaches into the previous chunk's cache rows)."""
    p = TOKENS[:N_PROMPT]
    with Model.load(LFM2, n_threads=2) as m:
        whole = _last(m.session(n_ctx=128), p)
        s = m.session(n_ctx=128, n_batch=7)
        chunks = _last(s, p)
        s = m.session(n_ctx=128)
        for t in p:
            one = _last(s, [t])
    assert np.array_equal(whole, chunks) and np.array_equal(whole, one)


def test_rewind_gives_a_cold_start(core):
    """A session rewound into its history (prefix reuse, a rejected draft) and fed other tokens
    gives what a fresh session gives for the same ids: the convolution windows before the
    rewind point are those of the kept tokens."""
    a, b = TOKENS[:30], TOKENS[:20] + [7, 8, 9, 10, 11]
    with Model.load(LFM2, n_threads=2) as m:
        s = m.session(n_ctx=128)
        s.eval(a)
        s.truncate(s.common_prefix(b))
        warm = _last(s, b[s.n_past:])
        cold = _last(m.session(n_ctx=128), b)
        # and back to a, through a rewind of one token (inside a convolution window)
        s.truncate(len(b) - 1)
        s.eval([99])
        s.truncate(20)
        again = _last(s, a[20:])
        first = _last(m.session(n_ctx=128), a)
    assert np.array_equal(warm, cold)
    assert np.array_equal(again, first)


def test_fork_and_decode_batch_of_sessions(core):
    """A fork carries the convolution cache; several sessions' decode step in one pass reads
    each session's own cache."""
    prompts = [TOKENS[:12], TOKENS[5:9], [1, 300, 301, 302, 303, 304, 305]]
    with Model.load(LFM2, n_threads=2) as m:
        alone, batched, forked, _ = alone_batched_forked(m, prompts)
    assert np.abs(np.array(alone) - batched).max() < 1e-4
    assert np.array_equal(forked, alone[0])


def test_prompt_cache_files_are_refused_clearly(core, tmp_path):
    """The prompt-cache format holds K/V rows only: saving or restoring an lfm2 session is
    refused naming why, instead of restoring a state without its convolution cache."""
    with Model.load(LFM2, n_threads=2) as m:
        s = m.session(n_ctx=64)
        s.eval(TOKENS[:8])
        with pytest.raises(StateFileError, match="convolution"):
            s.save(tmp_path / "x.edkv", key=b"k" * 32)


def test_memory_plan_counts_the_convolution_cache(core):
    """The KV cache of the memory plan (`edged info`) holds n_conv_layers * n_ctx * n_embd
    floats of convolution cache beside the F16 K/V rows, and the arena holds that view."""
    with Model.load(LFM2, n_threads=2) as m:
        hp = m.hp
        s = m.session(n_ctx=64)
        c = m.backend.conv_cache(s._buf)
        assert c.shape == (hp.n_conv_layers, 64, 4 * hp.n_embd)
        kv = hp.n_layer * 64 * 2 * (2 * hp.n_head_kv * hp.head_dim)
        assert m.backend.plan(64, 8).kv_cache == kv + c.nbytes
        assert type(m.backend).plan_for(m.spec, 64, 8).kv_cache == kv + c.nbytes


def test_lookup_speculation_gives_the_same_tokens(core):
    """n-gram drafts (1-grams: many, mostly rejected) rewind the session inside convolution
    windows: the tokens are those of plain greedy decoding."""
    plain = greedy(LFM2, "cpu", TOKENS, 32)
    stats = {}
    spec = greedy(LFM2, "cpu", TOKENS, 32, Speculation("lookup", ngram_min=1), stats)
    assert spec == plain and len(plain) == 32
    assert stats["n_drafted"] > stats["n_accepted"]   # rejected drafts: rewinds


def test_info_names_the_convolution_layers(capsys):
    from edged.cli import main
    main(["info", "-m", LFM2, "-c", "512"])
    assert "short convolutions (3 taps) on layers [0, 1, 3, 4]" in capsys.readouterr().out
