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

from family_goldens import GOLDENS, alone_batched_forked, check_every_kernel_path, greedy, mapped_and_repacked

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


def test_prompt_cache_file_holds_the_convolution_cache(core, tmp_path):
    """A prompt-cache file carries the convolution rows after the K/V rows: a session restored
    from it continues with the bits of the session that wrote it, and a file whose convolution
    rows were altered fails its MAC."""
    key = b"k" * 32
    with Model.load(LFM2, n_threads=2) as m:
        s = m.session(n_ctx=64)
        s.eval(TOKENS[:12])
        path = tmp_path / "x.edkv"
        s.save(path, key=key)
        want = _last(s, TOKENS[12:14])
        r = type(s).load(m, path, key=key)
        assert r.n_past == 12 and np.array_equal(_last(r, TOKENS[12:14]), want)
        conv = m.backend.conv_cache(s._buf)
        assert os.path.getsize(path) > 12 * conv.shape[0] * conv.shape[2]
        raw = bytearray(path.read_bytes())
        raw[-40] ^= 1                          # inside the last convolution row
        path.write_bytes(bytes(raw))
        with pytest.raises(StateFileError, match="HMAC"):
            type(s).load(m, path, key=key)


def test_memory_plan_counts_the_convolution_cache(core):
    """The KV cache of the memory plan (`edged info`) holds n_conv_layers * n_ctx * n_embd
    floats of convolution cache beside the F16 K/V rows, and the arena holds that view."""
    with Model.load(LFM2, n_threads=2) as m:
        hp = m.hp
        s = m.session(n_ctx=64)
        c = m.backend.conv_cache(s._buf)
        assert c.shape == (hp.n_conv_layers, 64, 4 * hp.n_embd)
        # K/V rows for the attention layers only
        assert hp.n_kv_layers == hp.n_layer - hp.n_conv_layers
        assert m.backend.kv_cache(s._buf)[0].shape[0] == hp.n_kv_layers
        kv = hp.n_kv_layers * 64 * 2 * (2 * hp.n_head_kv * hp.head_dim)
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


def test_synth_shape_writes_lfm2_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape lfm2-350m`'s layout at a small size: per-layer head_count_kv with 0
    on the convolution layers, shortconv.l_cache, F32 taps of llama.cpp's shape, the output norm
    as token_embd_norm, tied embeddings; read back by the PyPI gguf reader, and the compiled
    forward agrees with the NumPy reference on it. (The full-size Q4_K_M file loads in llama.cpp
    0.3.36, whose teacher-forced logits edged's match within the quantized tolerances.)"""
    import gguf
    from edged.format import synth
    small = dict(synth.SHAPES["lfm2-350m"], n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=6,
                 n_vocab=512, attn_layers=(2, 5))
    monkeypatch.setitem(synth.SHAPES, "test-lfm2", small)
    path = str(tmp_path / "lfm2.gguf")
    synth.synth("test-lfm2", "Q8_0", path)
    r = gguf.GGUFReader(path)
    assert list(r.fields["lfm2.attention.head_count_kv"].contents()) == [0, 0, 2, 0, 0, 2]
    assert r.fields["lfm2.shortconv.l_cache"].contents() == 3
    names = {t.name: t for t in r.tensors}
    assert list(names["blk.0.shortconv.conv.weight"].shape) == [3, 64]
    assert names["blk.0.shortconv.conv.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert "token_embd_norm.weight" in names and "output.weight" not in names
    assert "blk.0.attn_q.weight" not in names and "blk.2.attn_q_norm.weight" in names
    ids = [1, 40, 41, 42, 43, 44, 45, 46]
    with Model.load(path, n_threads=2) as m, Model.load(path, backend="reference") as ref:
        assert m.hp.n_conv_layers == 4
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        want = np.asarray(ref.session(n_ctx=32).eval(ids, logits="all"))
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_convolution_projections_repacked_give_the_same_bits(core, tmp_path, monkeypatch):
    """The convolution layers' shortconv in/out projections are repacked at load like the other
    projections (read by the path's fastest kernels, not row by row from the mapping): a prompt
    and single tokens give the mapped layout's bits."""
    from edged.format import synth
    monkeypatch.setitem(synth.SHAPES, "test-lfm2-r4", dict(
        synth.SHAPES["lfm2-350m"], n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_layer=3,
        n_vocab=512, attn_layers=(1,)))
    path = str(tmp_path / "lfm2.gguf")
    synth.synth("test-lfm2-r4", "Q4_K_M", path)

    want, got, repacked, kernel_path = mapped_and_repacked(path, monkeypatch)
    if kernel_path == "generic":
        pytest.skip("the generic path reads no matrix repacked")
    assert {"blk.0.shortconv.in_proj.weight", "blk.0.shortconv.out_proj.weight"} <= repacked
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
