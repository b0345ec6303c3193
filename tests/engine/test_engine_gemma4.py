"""Gemma 4 (`gemma4`, text): hyperparameters as llama.cpp reads them, refusals naming the key or
tensor, the NumPy reference forward pass (edged/engine/gemma4.py) and the compiled pass against
llama.cpp.

tests/data/goldens/synthetic-gemma4 is a scaled-down Gemma 4 E2B (n_embd 64; sliding layers
0, 1, 3 with head size 16, full layers 2 and 4 with head size 32 and proportional RoPE; KV heads
per layer; layers 3 and 4 reuse the KV of layers 1 and 2; layer 2 without attn_v; per-layer
embeddings 8 wide; a scalar per layer; logits soft-capped at 30) with llama.cpp's
teacher-forced logits (a 40-token prompt past the window of 8, then 24 greedy tokens), made by
`tools/make_goldens.py --llama-teacher BIN gemma4`. synthetic-gemma4-moe is a scaled-down
26B-A4B (the same attention layers without shared KV or per-layer embeddings, full layers
without attn_v; every layer a dense FFN 32 wide beside 8 routed experts 16 wide, 3 per token;
layer 0 with separate gate and up experts, the others fused; each expert's output scaled),
made by `... gemma4-moe`. test_engine_families runs both on the compiled backend like the
other goldens; the reference backend does not run gemma4 (the NumPy forward below is its slow
twin).
"""
import os

import numpy as np
import pytest

from edged import Model
from edged.engine import gemma4
from edged.engine.arch import validate
from edged.errors import MetadataValueError, UnsupportedModelError
from edged.format.gguf import GGUFFile
from family_goldens import (GOLDENS, MAX_ABS, MEAN_ABS, alone_batched_forked,
                            assert_batch_chunks_single_agree, check_every_kernel_path, greedy)

BASE = os.path.join(GOLDENS, "synthetic-gemma4")
MOE = os.path.join(GOLDENS, "synthetic-gemma4-moe")
GOLDEN = np.load(BASE + ".golden.npz")
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])
BOTH = pytest.mark.parametrize("base", [BASE, MOE], ids=["dense", "moe"])


def golden(base):
    """(tokens, n_prompt, logits) of a golden"""
    z = np.load(base + ".golden.npz")
    return z["tokens"].tolist(), int(z["n_prompt"]), z["logits"]


@pytest.fixture(scope="module")
def gguf():
    with GGUFFile.open(BASE + ".gguf") as f:
        yield f


@pytest.fixture(scope="module")
def moe():
    with GGUFFile.open(MOE + ".gguf") as f:
        yield f


def test_hparams_as_llama_cpp_reads_them(gguf):
    hp = gemma4.hparams(gguf.metadata, 512)
    assert hp.swa_layers == (True, True, False, True, False)
    assert (hp.head_dim, hp.head_dim_swa, hp.n_rot, hp.n_rot_swa) == (32, 16, 32, 16)
    assert hp.n_head_kv == (2, 2, 1, 2, 1) and hp.n_ff == (32, 32, 32, 64, 64)
    assert [hp.kv_layer(il) for il in range(5)] == [0, 1, 2, 1, 2]
    assert (hp.n_embd_per_layer, hp.final_logit_softcap, hp.n_swa) == (8, 30.0, 8)
    assert hp.n_expert == 0


def test_moe_hparams_as_llama_cpp_reads_them(moe):
    hp = gemma4.hparams(moe.metadata, 512)
    h = validate(moe.metadata, moe.tensors, 512).hp
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff, hp.n_kv_shared) == \
        (h.n_expert, h.n_expert_used, h.n_ff_exp, h.n_ff_layers, 0) == (8, 3, 16, (32,) * 5, 0)
    assert h.expert_weights_norm and hp.n_embd_per_layer == 0


@BOTH
def test_reference_forward_matches_llama_cpp(base):
    tokens, _, ref = golden(base)
    with GGUFFile.open(base + ".gguf") as f:
        got = gemma4.forward(gemma4.Weights(f, gemma4.hparams(f.metadata, 512)), tokens)
    d = np.abs(got - ref)
    top = np.sort(ref, 1)
    decided = top[:, -1] - top[:, -2] > 0.6
    misses = int((decided & (got.argmax(1) != ref.argmax(1))).sum())
    assert d.max() <= MAX_ABS and d.mean() <= MEAN_ABS and misses == 0, \
        f"max {d.max():.4f} mean {d.mean():.5f} top-1 misses {misses}"


@pytest.mark.parametrize("change, message", [
    ({"gemma4.attention.key_length_swa": None}, "missing required key 'gemma4.attention.key_length_swa'"),
    ({"gemma4.embedding_length_per_layer_input": None}, "embedding_length_per_layer_input"),
    ({"gemma4.attention.sliding_window_pattern": None}, "sliding_window_pattern"),
    ({"gemma4.attention.head_count_kv": [2, 2, 1]}, "head_count_kv has 3 entries for 5 layers"),
    ({"gemma4.attention.head_count_kv": [3, 2, 1, 2, 1]}, "not a multiple of head_count_kv 3"),
    ({"gemma4.attention.value_length_swa": 8}, "must be equal"),
    ({"gemma4.rope.dimension_count_swa": 18}, "rope.dimension_count_swa 18 invalid"),
    ({"gemma4.attention.shared_kv_layers": 4}, "shared_kv_layers = 4"),
    ({"gemma4.expert_count": 8}, "missing required key 'gemma4.expert_used_count'"),
])
def test_bad_metadata_is_refused_naming_the_key(gguf, change, message):
    md = dict(gguf.metadata)
    for k, v in change.items():
        if v is None:
            del md[k]
        else:
            md[k] = v
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(").replace("[", r"\[")):
        gemma4.hparams(md, 512)


def test_bad_value_type_is_refused(gguf):
    md = dict(gguf.metadata, **{"gemma4.attention.sliding_window_pattern": [1, 1, 0, 1, 0]})
    with pytest.raises(MetadataValueError, match="sliding_window_pattern"):
        gemma4.hparams(md, 512)


def test_missing_or_misshapen_tensor_is_refused(gguf):
    hp = gemma4.hparams(gguf.metadata, 512)
    tensors = dict(gguf.tensors)

    class Fake:
        pass
    f = Fake()
    f.tensors = dict(tensors)
    del f.tensors["blk.1.attn_k_norm.weight"]
    with pytest.raises(UnsupportedModelError, match="missing tensor 'blk.1.attn_k_norm.weight'"):
        gemma4.Weights(f, hp)
    f.tensors = dict(tensors)
    f.tensors["blk.2.attn_q.weight"] = tensors["blk.1.attn_q.weight"]    # a sliding layer's size
    with pytest.raises(UnsupportedModelError, match=r"'blk.2.attn_q.weight' has shape \(64, 64\)"):
        gemma4.Weights(f, hp)


def test_validate_gives_each_layer_its_sizes(gguf):
    """arch.validate (Model.load) carries the per-layer tables the compiled pass reads."""
    hp = validate(gguf.metadata, gguf.tensors, 512).hp
    assert [hp.layer_dims(il) for il in range(5)] == [
        (16, 2, 16, 32), (16, 2, 16, 32), (32, 1, 32, 32), (16, 2, 16, 64), (32, 1, 32, 64)]
    assert hp.kv_layers == (0, 1, 2, 1, 2) and hp.kv_dims() == (32, 32, 32, 0, 0)
    assert (hp.attn_scale, hp.n_embd_per_layer, hp.v_norm) == (1.0, 8, True)


@pytest.fixture
def core():
    return pytest.importorskip("edged._core")


@BOTH
def test_golden_every_kernel_path(core, base):
    """Teacher-forced logits within the F16 tolerances on generic, avx2 and avx512 (every
    path this CPU has)."""
    check_every_kernel_path(core, os.path.basename(base))


@BOTH
def test_greedy_16_tokens_as_llama_cpp(core, base):
    tokens, n, _ = golden(base)
    assert greedy(base + ".gguf", "cpu", tokens[:n], 16) == tokens[n:n + 16]


@BOTH
def test_batch_chunks_and_single_tokens_agree(core, base):
    """The prompt in one batch, in chunks of 7 (past the window of 8, across the shared KV
    layers; a MoE layer's tokens grouped by expert), and one token at a time: the same bits."""
    tokens, n, _ = golden(base)
    with Model.load(base + ".gguf", n_threads=2) as m:
        assert_batch_chunks_single_agree(m, tokens[:n])


@BOTH
def test_fork_and_decode_batch_of_sessions(core, base):
    """A fork copies every layer's rows at their sizes; a decode batch of several sessions
    reads each session's own cache (and per-layer inputs of its own token)."""
    tokens, _, _ = golden(base)
    prompts = [tokens[:12], tokens[5:9], [1, 300, 301, 302, 303, 304, 305]]
    with Model.load(base + ".gguf", n_threads=2) as m:
        alone, batched, forked, _ = alone_batched_forked(m, prompts)
    assert np.abs(np.array(alone) - batched).max() < 1e-4
    assert np.array_equal(forked, alone[0])


def test_memory_plan_counts_each_layers_rows(core):
    """The K/V cache of the memory plan (`edged info`) holds each layer's rows at its own size
    (16 x 2 heads on the sliding layers, 32 x 1 on the full one) and none for the two layers
    that read an earlier layer's cache; the arena's views are those rows."""
    with Model.load(BASE + ".gguf", n_threads=2) as m:
        s = m.session(n_ctx=64)
        views = s._buf.state.kv_layers()
        assert [k.shape for k, _ in views] == [(64, 64), (64, 64), (64, 64)]   # F16 bytes
        kv = 64 * 2 * 2 * (32 + 32 + 32)
        assert m.backend.plan(64, 8).kv_cache == kv
        assert type(m.backend).plan_for(m.spec, 64, 8).kv_cache == kv


def test_prompt_cache_file_round_trip_gives_the_same_bits(core, tmp_path):
    """Session.save holds each layer's K/V rows at its own size (16 x 2 heads on the sliding
    layers, 32 x 1 on the full one; none for the shared-KV layers 3 and 4); a new model's
    Session.load gives the next logits of recomputation bit for bit, also for a prefix of the
    file (past the window of 8) with the rest evaluated again."""
    from edged.engine import statefile
    from edged.engine.model import Session
    key, path, nxt = b"k" * 32, tmp_path / "g.edkv", TOKENS[N_PROMPT:N_PROMPT + 3]
    prompt = TOKENS[:N_PROMPT]
    with Model.load(BASE + ".gguf", n_threads=2) as m:
        s = m.session(n_ctx=64)
        s.eval(prompt)
        size = s.save(path, key)
        fresh = m.session(n_ctx=64)
        fresh.eval(prompt)
        want = np.asarray(fresh.eval(nxt, logits="all"))
    rows = 2 * 2 * (32 + 32 + 32)          # f16 K and V rows of layers 0, 1 and 2
    assert size == os.path.getsize(path) == (statefile.HEADER.size + 4 * N_PROMPT
                                             + N_PROMPT * rows + statefile.MAC_BYTES)
    with Model.load(BASE + ".gguf", n_threads=2) as m:
        with Session.load(m, path, key) as s2:
            assert s2.tokens == prompt
            assert np.array_equal(s2.eval(nxt, logits="all"), want)
        with m.session(n_ctx=64) as s3:
            assert statefile.restore(s3, path, key, n_tokens=21) == 21
            s3.eval(prompt[21:])
            assert np.array_equal(s3.eval(nxt, logits="all"), want)


def test_prompt_cache_file_of_another_model_is_refused_whole(core, tmp_path):
    """A gemma4 file restored into a model of another layout (and the reverse) is refused
    naming the model, and the session holds nothing of it."""
    from edged.engine import statefile
    from edged.errors import StateFileError
    other = os.path.join(GOLDENS, "synthetic-kv-q8_0.gguf")
    key = b"k" * 32
    for src, dst in ((BASE + ".gguf", other), (other, BASE + ".gguf")):
        path = tmp_path / "x.edkv"
        with Model.load(src, n_threads=2) as m, m.session(n_ctx=64) as s:
            s.eval(TOKENS[:12])
            s.save(path, key)
        with Model.load(dst, n_threads=2) as m, m.session(n_ctx=64) as s:
            s.eval([4, 4, 4])
            with pytest.raises(StateFileError, match="model_sha256"):
                statefile.restore(s, path, key)
            assert s.n_past == 0


def test_reference_backend_refuses_by_name():
    with pytest.raises(UnsupportedModelError, match="gemma4: the reference backend"):
        Model.load(BASE + ".gguf", backend="reference")


def test_info_shows_each_layers_sizes(capsys):
    from edged.cli import main
    main(["info", "-m", BASE + ".gguf", "-c", "4096"])
    out = capsys.readouterr().out
    assert "head_dim [16, 16, 32, 16, 32], kv heads [2, 2, 1, 2, 1]" in out
    assert "none for layers [3, 4] (they attend to layers [1, 2]'s)" in out
    assert "KV cache (f16/f16) 1.5 MiB" in out     # 4096 x (32 + 32 + 32) x 2 x 2 bytes


# the 26B-A4B layout at a size whose rows take q8_0 / q4_0 blocks and R4 groups
MOE_Q8 = dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=32, head_dim_full=64, n_ff=64,
              n_layer=6, n_vocab=512, n_swa=4, n_expert=8, n_expert_used=2, n_ff_exp=32)


def _synth_small(tmp_path, monkeypatch, shape, **sizes):
    """`edged synth --shape SHAPE`'s layout at the given sizes, in F16: (path, the PyPI gguf
    reader's view of it)."""
    gguf_py = pytest.importorskip("gguf")
    from edged.format import synth
    monkeypatch.setitem(synth.SHAPES, "test-gemma4", dict(synth.SHAPES[shape], **sizes))
    path = str(tmp_path / "gemma4.gguf")
    synth.synth("test-gemma4", "F16", path)
    return path, gguf_py.GGUFReader(path)


def _compiled_agrees_with_reference(path):
    """The compiled pass's logits of 21 tokens against the NumPy reference's; the hparams."""
    ids = [1] + list(range(40, 60))
    with Model.load(path, n_threads=2) as m:
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        hp = m.hp
    with GGUFFile.open(path) as f:
        want = gemma4.forward(gemma4.Weights(f, gemma4.hparams(f.metadata, 512)), ids)
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
    return hp


def _assert_qk_norms_scale_attention(r, head_dim, head_dim_full):
    """gemma4 scales q.k by 1: synth's q and k norm weights carry head_dim ** -0.25 each (so
    q.k carries 1 / sqrt(head_dim), as a trained model's norms do); at 1 the random file's
    attention over heads of 256 and 512 is nearly one-hot and amplifies every rounding."""
    names = {t.name: t for t in r.tensors}
    swa = r.fields["gemma4.attention.sliding_window_pattern"].contents()
    for il, sliding in enumerate(swa):
        hd = head_dim if sliding else head_dim_full
        for n in ("attn_q_norm", "attn_k_norm"):
            if f"blk.{il}.{n}.weight" in names:
                assert np.allclose(names[f"blk.{il}.{n}.weight"].data, hd ** -0.25), (il, n)


def test_synth_shape_writes_gemma4_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape gemma4-e2b`'s layout at a small size: per-layer KV heads and FFN
    widths (double-wide on the shared KV layers), the sliding pattern as booleans, rope_freqs of
    1 then 1e30; read back by the PyPI gguf reader, and the compiled pass agrees with the NumPy
    reference on it. (The full-size file loads in llama.cpp 0.3.36, whose teacher-forced logits
    edged's match.)"""
    path, r = _synth_small(tmp_path, monkeypatch, "gemma4-e2b", n_embd=64, n_head=4, head_dim=32,
                           head_dim_full=64, n_ff=96, n_layer=10, n_vocab=512, n_swa=4,
                           n_kv_shared=5, n_embd_per_layer=32)
    assert list(r.fields["gemma4.feed_forward_length"].contents()) == [96] * 5 + [192] * 5
    assert list(r.fields["gemma4.attention.sliding_window_pattern"].contents()) == [
        True, True, True, True, False] * 2
    names = {t.name: t for t in r.tensors}
    assert list(names["rope_freqs.weight"].data[:9]) == [1.0] * 8 + [1e30]
    assert "blk.4.attn_k.weight" in names and "blk.5.attn_k.weight" not in names
    _assert_qk_norms_scale_attention(r, 32, 64)
    hp = _compiled_agrees_with_reference(path)
    assert hp.kv_layers == tuple(range(5)) + (3, 3, 3, 3, 4)


def test_synth_shape_writes_gemma4_moe_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape gemma4-26b-a4b`'s layout at a small size: every sixth layer full
    with its own KV head count and no attn_v, expert keys, in every layer the router (F32), its
    scale, the fused gate|up and down experts, their scales and the three extra norms, no
    per-layer inputs; the compiled pass agrees with the NumPy reference on it."""
    path, r = _synth_small(tmp_path, monkeypatch, "gemma4-26b-a4b", n_embd=64, n_head=4,
                           n_head_kv=2, n_head_kv_full=1, head_dim=16, head_dim_full=32, n_ff=32,
                           n_layer=6, n_vocab=512, n_swa=4, n_expert=8, n_expert_used=2,
                           n_ff_exp=16)
    assert list(r.fields["gemma4.attention.head_count_kv"].contents()) == [2] * 5 + [1]
    assert [r.fields["gemma4." + k].contents() for k in (
        "expert_count", "expert_used_count", "expert_feed_forward_length",
        "embedding_length_per_layer_input", "attention.shared_kv_layers")] == [8, 2, 16, 0, 0]
    names = {t.name: t for t in r.tensors}
    assert "blk.4.attn_v.weight" in names and "blk.5.attn_v.weight" not in names
    assert list(names["blk.5.ffn_gate_up_exps.weight"].shape) == [64, 32, 8]
    assert names["blk.0.ffn_gate_inp.weight"].tensor_type == 0          # F32
    assert "blk.0.ffn_down_exps.scale" in names and "per_layer_token_embd.weight" not in names
    _assert_qk_norms_scale_attention(r, 16, 32)
    # the router's logits spread wide, so the top k of 128 random experts are not near ties
    assert all(list(names[f"blk.{il}.ffn_gate_inp.scale"].data) == [10.0] * 64 for il in range(6))
    hp = _compiled_agrees_with_reference(path)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 2, 16)


# --- mixture of experts (26B-A4B layout) ----------------------------------------------------

def test_moe_both_expert_layouts_are_read(moe):
    """Layer 0 holds ffn_gate_exps and ffn_up_exps, the others ffn_gate_up_exps (what the
    converter writes now); every layer its router scale, expert scales and three norms."""
    layers = validate(moe.metadata, moe.tensors, 512).layers
    assert layers[0].ffn_gate_exps and layers[0].ffn_up_exps and not layers[0].ffn_gate_up_exps
    assert all(L.ffn_gate_up_exps and not L.ffn_gate_exps for L in layers[1:])
    assert all(L.ffn_gate_inp_scale and L.ffn_down_exps_scale and L.pre_ffw_norm_2
               and L.post_ffw_norm_1 and L.post_ffw_norm_2 and L.ffn_gate for L in layers)


@pytest.mark.parametrize("change, message", [
    ({"gemma4.expert_feed_forward_length": None},
     "missing required key 'gemma4.expert_feed_forward_length'"),
    ({"gemma4.expert_used_count": 9}, "expert_used_count 9 / expert_count 8 invalid"),
    ({"gemma4.expert_count": 513}, "at most 512 experts"),
])
def test_moe_bad_metadata_is_refused_naming_the_key(moe, change, message):
    md = {k: v for k, v in moe.metadata.items() if change.get(k, 0) is not None}
    md.update({k: v for k, v in change.items() if v is not None})
    with pytest.raises(UnsupportedModelError, match=message):
        gemma4.hparams(md, 512)


@pytest.mark.parametrize("drop, message", [
    ("blk.1.ffn_gate_up_exps.weight", "missing tensor 'blk.1.ffn_gate_exps.weight'"),
    ("blk.2.ffn_gate_inp.scale", "missing tensor 'blk.2.ffn_gate_inp.scale'"),
    ("blk.3.post_ffw_norm_2.weight", "missing tensor 'blk.3.post_ffw_norm_2.weight'"),
])
def test_moe_missing_tensor_is_refused_by_both_readers(moe, drop, message):
    tensors = {k: v for k, v in moe.tensors.items() if k != drop}

    class Fake:
        pass
    f = Fake()
    f.tensors = tensors
    with pytest.raises(UnsupportedModelError, match=message):
        gemma4.Weights(f, gemma4.hparams(moe.metadata, 512))
    with pytest.raises(UnsupportedModelError, match=message):
        validate(moe.metadata, tensors, 512)


def test_moe_misshapen_expert_tensor_is_refused(moe):
    tensors = dict(moe.tensors)
    tensors["blk.2.ffn_down_exps.weight"] = tensors["blk.1.ffn_gate_up_exps.weight"]
    with pytest.raises(UnsupportedModelError, match="blk.2.ffn_down_exps.weight"):
        validate(moe.metadata, tensors, 512)


def test_moe_expert_output_scale_takes_part(core, tmp_path):
    """ffn_down_exps.scale multiplies each expert's output: a file without it (llama.cpp: the
    tensor is optional) gives other logits, and the NumPy reference agrees on both."""
    pytest.importorskip("gguf")
    from gguf_clone import clone
    path = str(tmp_path / "noscale.gguf")
    clone(MOE + ".gguf", path, drop={f"blk.{il}.ffn_down_exps.scale" for il in range(5)})
    tokens, _, ref = golden(MOE)
    with Model.load(path, n_threads=2) as m:
        got = np.asarray(m.session(n_ctx=64).eval(tokens[:20], logits="all"))
    with GGUFFile.open(path) as f:
        want = gemma4.forward(gemma4.Weights(f, gemma4.hparams(f.metadata, 512)), tokens[:20])
    assert np.abs(got - want).max() < MAX_ABS
    assert np.abs(got - ref[:20]).max() > 0.1


def test_moe_fused_experts_repacked_give_the_same_bits(core, tmp_path, monkeypatch):
    """Q8_0 experts with gate|up fused, repacked at load (every expert resident): one token, a
    prompt grouped by expert and a decode batch give the mapped layout's bits."""
    path, _ = _synth_small(tmp_path, monkeypatch, "gemma4-26b-a4b", **MOE_Q8, n_head_kv_full=1)
    from edged.format import synth
    synth.synth("test-gemma4", "Q8_0", path)

    def logits(m):
        s, a, b = m.session(n_ctx=64), m.session(n_ctx=16), m.session(n_ctx=16)
        prompt = np.asarray(s.eval([(5 * i + 1) % 512 for i in range(40)], logits="all"))
        a.eval([5, 6])
        b.eval([9])
        batch = np.asarray(m.decode_batch([a, b], [11, 12]), np.float32).reshape(-1)
        return np.concatenate([prompt.reshape(-1), np.asarray(s.eval([7])).reshape(-1), batch])
    monkeypatch.setenv("EDGED_REPACK", "off")
    with Model.load(path, n_threads=2) as m:
        want = logits(m)
    monkeypatch.setenv("EDGED_REPACK", "r4")
    with Model.load(path, n_threads=2) as m:
        assert sum("ffn_gate_up_exps" in n for n in m.backend.repacked.tensors) == 6
        got = logits(m)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_prompt_cache_file_of_quantized_rows_round_trip(core, tmp_path, monkeypatch):
    """q8_0 K and q4_0 V rows of each layer's own size (2 KV heads of 32 on the sliding layers,
    2 of 64 on the full one, rotated as llama.cpp does) saved and loaded: the next logits of
    recomputation, bit for bit."""
    from edged.engine import statefile
    from edged.engine.model import Session
    path, _ = _synth_small(tmp_path, monkeypatch, "gemma4-26b-a4b", **MOE_Q8, n_head_kv_full=2)
    key, f, prompt = b"k" * 32, tmp_path / "q.edkv", [(7 * i + 3) % 512 for i in range(30)]
    with Model.load(path, n_threads=2, cache_type_k="q8_0", cache_type_v="q4_0") as m:
        s = m.session(n_ctx=64)
        s.eval(prompt)
        size = s.save(f, key)
        want = np.asarray(s.eval([5, 6], logits="all"))
        with Session.load(m, f, key) as s2:
            assert np.array_equal(s2.eval([5, 6], logits="all"), want)
    rows = 5 * (64 // 32 * 34 + 64 // 32 * 18) + (128 // 32 * 34 + 128 // 32 * 18)  # q8_0 K, q4_0 V
    assert size == statefile.HEADER.size + 4 * 30 + 30 * rows + statefile.MAC_BYTES


def test_moe_quantize_picks_llama_cpps_ffn_down_types(tmp_path, monkeypatch):
    """`edged quantize` Q4_K_M on a layout with two ffn_down tensors per layer (the dense FFN's
    and the experts'): like llama-quantize (its layer_info reads the layer from the name when
    there are experts), both get Q6_K on use_more_bits layers (2 and 5 of 6), Q4_K elsewhere."""
    from edged.format.quantize import FileType, choose_types
    path, _ = _synth_small(tmp_path, monkeypatch, "gemma4-26b-a4b", **dict(
        MOE_Q8, n_embd=256, n_ff=256, n_ff_exp=256, n_head_kv_full=1))
    with GGUFFile.open(path) as f:
        types = choose_types(f, FileType.MOSTLY_Q4_K_M)
    for il in range(6):
        want = "Q6_K" if il in (2, 5) else "Q4_K"
        assert [types[f"blk.{il}.{n}.weight"].name for n in ("ffn_down", "ffn_down_exps")] == \
            [want, want], il


@pytest.mark.parametrize("shape, sizes", [
    ("gemma4-26b-a4b", dict(MOE_Q8, n_embd=256, n_ff=256, n_ff_exp=256, n_head_kv_full=1,
                            n_expert=16)),   # 8 experts would make every attn_v Q8_0
    ("gemma4-e2b", dict(n_embd=256, n_head=4, head_dim=32, head_dim_full=64, n_ff=256,
                        n_layer=10, n_vocab=512, n_swa=4, n_kv_shared=5, n_embd_per_layer=32))])
def test_synth_q4_k_m_gives_llama_quantizes_types(tmp_path, monkeypatch, shape, sizes):
    """synth's Q4_K_M file gives each tensor the type `edged quantize` (llama-quantize's mix)
    picks from its F16 twin. llama-quantize's use_more_bits for attn_v counts the attn_v
    tensors, not the layers (26B-A4B's full layers, V = K, and E2B's shared-KV layers have
    none): on the 26B-A4B layout Q6_K on the 3rd and 5th of 5 (layers 2 and 4), not on layers 2
    and 5 of 6; and it never quantizes per_layer_model_proj (E2B)."""
    from edged.format import synth
    from edged.format.quantize import FileType, choose_types
    path, _ = _synth_small(tmp_path, monkeypatch, shape, **sizes)
    q4 = str(tmp_path / "q4.gguf")
    synth.synth("test-gemma4", "Q4_K_M", q4)
    with GGUFFile.open(path) as f:
        want = {n: t.name for n, t in choose_types(f, FileType.MOSTLY_Q4_K_M).items()}
    with GGUFFile.open(q4) as f:
        got = {n: t.type.name for n, t in f.tensors.items() if n in want}
    assert got == want
    if shape == "gemma4-26b-a4b":
        assert [n for n, t in got.items() if n.endswith("attn_v.weight") and t == "Q6_K"] == [
            "blk.2.attn_v.weight", "blk.4.attn_v.weight"]


def test_synth_without_full_layers_writes_no_rope_freqs(core, tmp_path, monkeypatch):
    """`edged synth --shape gemma4-26b-a4b --layers 3` keeps only sliding layers: no layer reads
    rope_freqs, and llama.cpp refuses a file with a tensor it does not read ("wrong number of
    tensors"), so synth leaves it out; edged loads the file and agrees with its reference."""
    path, r = _synth_small(tmp_path, monkeypatch, "gemma4-26b-a4b",
                           **dict(MOE_Q8, n_layer=3, n_head_kv_full=1))
    assert "rope_freqs.weight" not in {t.name for t in r.tensors}
    _compiled_agrees_with_reference(path)
