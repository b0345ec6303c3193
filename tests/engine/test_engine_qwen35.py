"""Qwen3.5 (`qwen35`): Gated DeltaNet layers beside gated attention, against llama.cpp.

tests/data/goldens/synthetic-qwen35 is a scaled-down Qwen3.5 (n_embd 64; layers 0-2 DeltaNet
with heads of 16, 2 key and 4 value heads, a 4-tap convolution; layer 3 gated attention with
q/k norms and interleaved M-RoPE sections; tools/make_goldens.py qwen35) with llama.cpp's
teacher-forced logits: a 40-token prompt, then its greedy continuation of 24. A DeltaNet layer
folds every token into one state per sequence (engine/recurrent.py): a rewind restores a
checkpoint and replays, a fork copies it, and every way a session is rewound, forked, chunked
or batched must give the bits a cold start gives.
"""
import os

import numpy as np
import pytest

from edged import Model
from edged.engine import recurrent
from edged.engine.speculative import Speculation
from edged.errors import MetadataValueError, StateFileError, UnsupportedModelError
from edged.format.gguf import Key

from family_goldens import (GOLDENS, alone_batched_forked, assert_batch_chunks_single_agree,
                            check_every_kernel_path, greedy, synth_small)
from gguf_clone import clone

QWEN35 = os.path.join(GOLDENS, "synthetic-qwen35.gguf")
# the same shape with 8 routed experts (2 per token) and a gated shared expert in every layer
QWEN35MOE = os.path.join(GOLDENS, "synthetic-qwen35moe.gguf")
GOLDEN = np.load(os.path.join(GOLDENS, "synthetic-qwen35.golden.npz"))
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])


@pytest.fixture
def core():
    return pytest.importorskip("edged._core")


def _last(s, ids):
    return s.eval(ids)[0]


@pytest.mark.parametrize("name", ["synthetic-qwen35", "synthetic-qwen35moe"])
def test_golden_every_kernel_path(core, name):
    """Teacher-forced logits within the F16 tolerances on generic, avx2 and avx512 (every
    path this CPU has)."""
    check_every_kernel_path(core, name)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_greedy_16_tokens_as_llama_cpp(backend):
    """Greedy generation from the prompt gives llama.cpp's 16 next tokens."""
    if backend == "cpu":
        pytest.importorskip("edged._core")
    assert greedy(QWEN35, backend, TOKENS[:N_PROMPT], 16) == TOKENS[N_PROMPT:N_PROMPT + 16]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_batch_chunks_and_single_tokens_agree(backend):
    """The prompt in one batch, in chunks of 7 and one token at a time: the same bits (the
    recurrence runs token by token whatever the batch)."""
    if backend == "cpu":
        pytest.importorskip("edged._core")
    p = TOKENS[:N_PROMPT]
    with Model.load(QWEN35MOE, backend=backend, n_threads=2) as m:
        assert_batch_chunks_single_agree(m, p)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_rewind_restores_a_checkpoint_and_gives_a_cold_start(backend):
    """A session rewound into its history (prefix reuse, truncate, the last prompt token again)
    restores the newest checkpoint at or before the point, replays, and then gives what a fresh
    session gives for the same ids."""
    if backend == "cpu":
        pytest.importorskip("edged._core")
    a, b = TOKENS[:30], TOKENS[:20] + [7, 8, 9, 10, 11]
    with Model.load(QWEN35, backend=backend, n_threads=2) as m:
        s = m.session(n_ctx=128, n_batch=8)
        s.eval(a)
        rs = m.backend.recurrent(s._buf)
        # chunks of 8 and the last token alone: checkpoints at 8, 16, 24, 29 and 30, the newest 4 kept
        assert [c[0] for c in rs.checkpoints] == [16, 24, 29, 30]
        s.truncate(s.common_prefix(b))
        warm = _last(s, b[s.n_past:])
        cold = _last(m.session(n_ctx=128), b)
        s.truncate(len(b) - 1)            # the last token again (Session.start's prefix reuse)
        again_last = _last(s, b[-1:])
        s.truncate(3)                     # before every checkpoint: from the empty state
        again = _last(s, a[3:])
        first = _last(m.session(n_ctx=128), a)
    assert np.array_equal(warm, cold) and np.array_equal(again_last, cold)
    assert np.array_equal(again, first)


def test_fork_and_decode_batch_of_sessions(core):
    """A fork carries the recurrent state; several sessions' decode step in one pass updates
    each session's own state."""
    prompts = [TOKENS[:12], TOKENS[5:9], [1, 300, 301, 302, 303, 304, 305]]
    with Model.load(QWEN35, n_threads=2) as m:
        alone, batched, forked, ss = alone_batched_forked(m, prompts)
        again = m.decode_batch(ss, [5, 6, 7])   # a second step from the states the first left
        s = m.session(n_ctx=64)
        s.eval(prompts[0])
        second = _last(s, [5])
    assert np.array_equal(np.array(alone), batched)
    assert np.array_equal(forked, alone[0]) and np.array_equal(again[0], second)


def test_lookup_speculation_gives_the_same_tokens(core):
    """n-gram drafts (many, mostly rejected) rewind the recurrent state to checkpoints: the
    tokens are those of plain greedy decoding."""
    plain = greedy(QWEN35, "cpu", TOKENS, 24)
    stats = {}
    spec = greedy(QWEN35, "cpu", TOKENS, 24, Speculation("lookup", ngram_min=1), stats)
    assert spec == plain and len(plain) == 24
    assert stats["n_drafted"] > stats["n_accepted"]   # rejected drafts: rewinds


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_memory_plan_counts_the_state_once_per_sequence(backend):
    """The memory plan's cache (`edged info`) holds the K/V rows per position of the one
    attention layer (not of the three DeltaNet layers) plus the recurrent state and its
    checkpoints, constant per sequence; the arena holds the live one."""
    if backend == "cpu":
        pytest.importorskip("edged._core")
    with Model.load(QWEN35, backend=backend, n_threads=2) as m:
        hp = m.hp
        per_seq = (1 + recurrent.N_CHECKPOINTS) * 4 * hp.recurrent_state_floats()
        # 3 DeltaNet layers: conv (3, 16 * 8) and 4 heads of 16 x 16
        assert hp.recurrent_state_floats() == 3 * (3 * 128 + 4 * 256)
        assert hp.kv_slots == (None, None, None, 0)
        rows = 1 * 2 * (2 * hp.n_head_kv * hp.head_dim)   # F16 K and V per position
        for n_ctx in (64, 256):
            assert m.backend.plan(n_ctx, 8).kv_cache == n_ctx * rows + per_seq
            assert type(m.backend).plan_for(m.spec, n_ctx, 8).kv_cache == n_ctx * rows + per_seq
        s = m.session(n_ctx=64)
        assert m.backend.recurrent(s._buf).live.size == hp.recurrent_state_floats()
        k, v = m.backend.kv_cache(s._buf)
        assert k.shape[:2] == v.shape[:2] == (1, 64)
        assert s.memory_plan.kv_cache == m.backend.plan(64, s.n_batch).kv_cache


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_prompt_cache_file_holds_the_recurrent_state(backend, tmp_path):
    """A prompt-cache file carries the live recurrent state and its checkpoints: a session
    restored from it continues with the bits of the session that wrote it (nothing replayed);
    restored to fewer tokens it takes the newest checkpoint before them, replays the rest and
    gives a cold start's bits; a file whose state was altered fails its MAC."""
    from edged.engine import statefile
    if backend == "cpu":
        pytest.importorskip("edged._core")
    key = b"k" * 32
    path = tmp_path / "x.edkv"
    with Model.load(QWEN35, backend=backend, n_threads=2) as m:
        s = m.session(n_ctx=64, n_batch=8)
        s.eval(TOKENS[:20])           # checkpoints at 8, 16, 19 and 20
        s.save(path, key=key)
        h, _, size = statefile.read_header(path)
        assert h["n_states"] == 4 and h["state_floats"] == m.hp.recurrent_state_floats()
        want = _last(s, TOKENS[20:22])
        r = type(s).load(m, path, key=key)
        rs = m.backend.recurrent(r._buf)
        assert r.n_past == 20 and rs.pos == 20 and [c[0] for c in rs.checkpoints] == [8, 16, 19, 20]
        assert np.array_equal(_last(r, TOKENS[20:22]), want)
        cold = _last(m.session(n_ctx=64), TOKENS[:14] + [7, 8])
        p = m.session(n_ctx=64)
        assert statefile.restore(p, path, key, n_tokens=14) == 14
        assert np.array_equal(_last(p, [7, 8]), cold)     # from the checkpoint at 8
        raw = bytearray(path.read_bytes())
        raw[-40] ^= 1                 # inside the live state, the file's last part
        path.write_bytes(bytes(raw))
        with pytest.raises(StateFileError, match="HMAC"):
            type(s).load(m, path, key=key)


def test_prompt_cache_files_of_the_previous_version_are_refused(core, tmp_path):
    """Version 2 files (K/V rows of every layer, no recurrent state) and version 3 files (one
    K/V row size for every layer) are refused naming the versions (the daemon deletes them and
    recomputes)."""
    with Model.load(QWEN35, n_threads=2) as m:
        s = m.session(n_ctx=64)
        s.eval(TOKENS[:8])
        path = tmp_path / "x.edkv"
        s.save(path, key=b"k" * 32)
        good = path.read_bytes()
        for old in (2, 3):
            raw = bytearray(good)
            raw[8:12] = old.to_bytes(4, "little")
            path.write_bytes(bytes(raw))
            with pytest.raises(StateFileError, match=f"format version {old} .*reads version 4"):
                type(s).load(m, path, key=b"k" * 32)


def _meta(name):
    return Key.arch(name, "qwen35")


@pytest.mark.parametrize("meta,drop,err,match", [
    ({}, [Key.SSM_STATE_SIZE], UnsupportedModelError, r"missing required key 'qwen35\.ssm\.state_size'"),
    ({Key.SSM_INNER_SIZE: (48, 4)}, [], UnsupportedModelError, r"qwen35\.ssm\.inner_size = 48"),
    ({Key.SSM_TIME_STEP_RANK: (3, 4), Key.SSM_INNER_SIZE: (48, 4)}, [], UnsupportedModelError,
     r"time_step_rank = 3 is not a multiple"),
    ({}, [Key.ROPE_DIMENSION_SECTIONS], UnsupportedModelError,
     r"missing required key 'qwen35\.rope\.dimension_sections'"),
    ({Key.ROPE_DIMENSION_SECTIONS: ([2, 2, 2, 2], 9, 5)}, [Key.ROPE_DIMENSION_SECTIONS],
     UnsupportedModelError, r"rope pair 6 takes the e section"),
    ({Key.ROPE_DIMENSION_SECTIONS: ([3, 3, 2], 9, 5)}, [Key.ROPE_DIMENSION_SECTIONS],
     MetadataValueError, r"dimension_sections must be an array of 4"),
    ({Key.ATTENTION_RECURRENT_LAYERS: ([1, 1], 9, 7)}, [], MetadataValueError,
     r"recurrent_layers must be an array of 4"),
])
def test_malformed_keys_are_refused_naming_the_key(tmp_path, meta, drop, err, match):
    """A key llama.cpp requires missing, or values no Qwen3.5 has, fail the load naming it
    (gguf types: 4 uint32, 5 int32, 7 bool, 9 array)."""
    import gguf
    T = gguf.GGUFValueType
    kv = {_meta(k): (v[0], *(T(x) for x in v[1:])) for k, v in meta.items()}
    path = clone(QWEN35, tmp_path / "x.gguf", meta=kv, drop_meta=[_meta(k) for k in drop + list(meta)])
    with pytest.raises(err, match=match):
        Model.load(str(path), backend="reference")


def test_recurrent_layers_key_overrides_the_interval(tmp_path):
    """attention.recurrent_layers (per layer) wins over full_attention_interval, as llama.cpp
    reads them: a file marking layer 3 recurrent has no attention layer, and then lacks the
    DeltaNet tensors of layer 3 (refused naming the tensor)."""
    import gguf
    T = gguf.GGUFValueType
    kv = {_meta(Key.ATTENTION_RECURRENT_LAYERS): ([True] * 4, T.ARRAY, T.BOOL)}
    path = clone(QWEN35, tmp_path / "x.gguf", meta=kv)
    with pytest.raises(UnsupportedModelError, match=r"missing tensor 'blk\.3\.attn_qkv\.weight'"):
        Model.load(str(path), backend="reference")


def test_info_names_the_recurrent_layers(capsys):
    from edged.cli import main
    main(["info", "-m", QWEN35, "-c", "512"])
    out = capsys.readouterr().out
    assert "Gated DeltaNet on layers [0, 1, 2]" in out and "per sequence" in out


def test_synth_shape_writes_qwen35_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape qwen3.5-0.8b`'s layout at a small size: the ssm.* keys, interleaved
    M-RoPE sections, full_attention_interval 4, DeltaNet tensors of llama.cpp's shapes (F32
    taps), q | gate in attn_q, the FFN norm as post_attention_norm, tied embeddings; read back
    by the PyPI gguf reader, and the compiled forward agrees with the NumPy reference on it.
    (The full-size file loads in llama.cpp 0.3.36, whose teacher-forced logits edged's match:
    docs/models.md.)"""
    import gguf
    from edged.format import synth
    small = dict(synth.SHAPES["qwen3.5-0.8b"], n_embd=64, n_head=4, n_head_kv=2, head_dim=32,
                 n_ff=128, n_layer=8, n_vocab=512, n_rot=16, sections=(3, 3, 2, 0),
                 attn_layers=(3, 7), ssm=dict(d_conv=4, d_state=16, n_group=2, dt_rank=4))
    monkeypatch.setitem(synth.SHAPES, "test-qwen35", small)
    path = str(tmp_path / "qwen35.gguf")
    synth.synth("test-qwen35", "Q8_0", path)
    r = gguf.GGUFReader(path)
    assert r.fields["qwen35.ssm.inner_size"].contents() == 64
    assert r.fields["qwen35.full_attention_interval"].contents() == 4
    assert list(r.fields["qwen35.rope.dimension_sections"].contents()) == [3, 3, 2, 0]
    names = {t.name: t for t in r.tensors}
    assert list(names["blk.0.ssm_conv1d.weight"].shape) == [4, 16 * 8]
    assert names["blk.0.ssm_conv1d.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert list(names["blk.3.attn_q.weight"].shape) == [64, 2 * 4 * 32]
    assert "blk.3.post_attention_norm.weight" in names and "output.weight" not in names
    assert "blk.3.attn_qkv.weight" not in names and "blk.4.attn_qkv.weight" in names
    ids = [1, 40, 41, 42, 43, 44, 45, 46]
    with Model.load(path, n_threads=2) as m, Model.load(path, backend="reference") as ref:
        assert m.hp.recr_layers == (True, True, True, False) * 2 and m.hp.n_kv_layers == 2
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        want = np.asarray(ref.session(n_ctx=32).eval(ids, logits="all"))
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


# `--shape qwen3.5-35b-a3b`'s layout at a small size: 3 DeltaNet layers then attention, 8 experts
MOE_SMALL = dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=32, n_layer=4, n_vocab=512,
                 n_rot=16, sections=(3, 3, 2, 0), attn_layers=(3,),
                 ssm=dict(d_conv=4, d_state=16, n_group=2, dt_rank=4), n_expert=8, n_expert_used=2,
                 n_ff_exp=32, n_ff_shexp=64)
def test_synth_shape_writes_qwen35moe_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape qwen3.5-35b-a3b`'s layout at a small size: experts and a gated
    shared expert in every layer (DeltaNet and attention), their keys, the router and the shared
    expert's gate F32, its own output matrix; the compiled forward agrees with the NumPy
    reference on it."""
    import gguf
    path, r = synth_small(tmp_path, monkeypatch, "qwen3.5-35b-a3b", "Q8_0", **MOE_SMALL)
    assert [r.fields["qwen35moe." + k].contents() for k in (
        "expert_count", "expert_used_count", "expert_feed_forward_length",
        "expert_shared_feed_forward_length")] == [8, 2, 32, 64]
    names = {t.name: t for t in r.tensors}
    F32 = gguf.GGMLQuantizationType.F32
    for il in range(4):
        assert list(names[f"blk.{il}.ffn_gate_exps.weight"].shape) == [64, 32, 8]
        assert list(names[f"blk.{il}.ffn_up_shexp.weight"].shape) == [64, 64]
        assert list(names[f"blk.{il}.ffn_gate_inp_shexp.weight"].shape) == [64]
        assert names[f"blk.{il}.ffn_gate_inp.weight"].tensor_type == F32
        assert f"blk.{il}.ffn_gate.weight" not in names
    assert "output.weight" in names and "blk.0.attn_qkv.weight" in names
    ids = [1, 40, 41, 42, 43, 44, 45, 46]
    with Model.load(path, n_threads=2) as m, Model.load(path, backend="reference") as ref:
        assert m.hp.recr_layers == (True, True, True, False) and m.hp.n_ff_shexp == 64
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        want = np.asarray(ref.session(n_ctx=32).eval(ids, logits="all"))
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_shared_expert_gate_of_zero_is_one_half(core, tmp_path, monkeypatch):
    """A shared-expert gate logit of exactly 0 (here: a zero ffn_gate_inp_shexp) weighs the
    shared expert by sigmoid(0) = 0.5, as llama.cpp's qwen35moe does; silu(g) / g would be
    0 / 0 and turn every logit into NaN."""
    path, r = synth_small(tmp_path, monkeypatch, "qwen3.5-35b-a3b", "Q8_0", **MOE_SMALL)
    del r
    import gguf
    w = gguf.GGUFReader(path, "r+")
    for t in w.tensors:
        if t.name.endswith("ffn_gate_inp_shexp.weight"):
            t.data[...] = 0.0
    w.data.flush()
    del w
    ids = [1, 40, 41, 42, 43, 44, 45, 46]
    with Model.load(path, n_threads=2) as m, Model.load(path, backend="reference") as ref:
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        want = np.asarray(ref.session(n_ctx=32).eval(ids, logits="all"))
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
