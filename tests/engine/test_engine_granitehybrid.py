"""Granite 4 hybrid (`granitehybrid`: Mamba-2 layers + granite attention) against llama.cpp, and
its metadata as llama.cpp reads it.

tests/data/goldens/synthetic-granitehybrid.golden.npz holds llama.cpp's teacher-forced logits
for a scaled-down Granite 4.0-H (tools/make_goldens.py granitehybrid: n_embd 64, 5 layers with
attention on 1 and 4 and Mamba-2 on 0, 2, 3: d_inner 128, 8 SSM heads, state 16, 2 groups, 4
conv taps; granite's multipliers): a 40-token prompt, then its greedy continuation of 24. The
model is written again here and checked by its SHA-256.
"""
import dataclasses

import numpy as np
import pytest

from edged import Model
from edged.engine import arch
from edged.errors import MetadataValueError, UnsupportedModelError
from edged.format.gguf import Key

from edged.engine import recurrent
from family_goldens import (GOLDENS, alone_batched_forked, check, check_every_kernel_path, greedy,
                            mapped_and_repacked, regenerated_fixtures, synth_small, validate_changed)

GOLDEN = np.load(f"{GOLDENS}/synthetic-granitehybrid.golden.npz")
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])
MOE_TOKENS = np.load(f"{GOLDENS}/synthetic-granitehybrid-moe.golden.npz")["tokens"].tolist()
ARCH = "granitehybrid"


model_path, file_tables = regenerated_fixtures(ARCH)
# the MoE variant: the same shape with 8 experts of 32 (2 per token) and an ungated shared
# expert of 32 in every layer (llama.cpp's granite MoE FFN)
moe_path, moe_tables = regenerated_fixtures(ARCH + "-moe", ("moe_path", "moe_tables"))
BACKENDS = ["cpu", "reference"]


@pytest.fixture
def core():
    return pytest.importorskip("edged._core")


def test_golden_reference(model_path):
    """Teacher-forced logits within the F16 tolerances of ../shared/testdata/README.md."""
    check("synthetic-granitehybrid", "reference", path=model_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_16_tokens_as_llama_cpp(model_path, backend):
    assert greedy(model_path, backend, TOKENS[:N_PROMPT], 16) == TOKENS[N_PROMPT:N_PROMPT + 16]


def test_layers_and_ssm_params_as_llama_cpp_reads_them(file_tables):
    md, tensors = file_tables
    spec = arch.validate(md, tensors)
    hp, prm = spec.hp, spec.granitehybrid
    assert hp.ssm_layers == (True, False, True, True, False) == prm.ssm_layers
    assert (prm.d_conv, prm.d_inner, prm.d_state, prm.n_head, prm.n_group) == (4, 128, 16, 8, 2)
    assert (prm.head_dim, prm.n_conv_ch, prm.d_in_proj) == (16, 192, 328)
    assert hp.n_head_kv == 2 and hp.n_conv_layers == 0
    assert (hp.embd_scale, hp.residual_scale, hp.attn_scale, hp.logit_mul) == (2.0, 0.5, 0.125, 2.0)
    assert spec.layers[0].attn_q is None and spec.layers[1].attn_q is not None
    assert spec.layers[1].ssm_in is None and spec.layers[0].ssm_in == "blk.0.ssm_in.weight"
    # the recurrent state HParams plans: per Mamba-2 layer 3 conv inputs of 192 channels and
    # 8 heads of (16 x 16)
    assert (hp.n_recr_layers, hp.ssm_d_inner, hp.ssm_conv_dim) == (3, 128, 192)
    assert hp.recurrent_state_floats() == 3 * (3 * 192 + 128 * 16)


@pytest.mark.parametrize("key", [Key.SSM_CONV_KERNEL, Key.SSM_INNER_SIZE, Key.SSM_STATE_SIZE,
                                 Key.SSM_TIME_STEP_RANK, Key.SSM_GROUP_COUNT,
                                 Key.HEAD_COUNT_KV, Key.LOGIT_SCALE])
def test_required_key_missing_is_refused(file_tables, key):
    name = Key.arch(key, ARCH)
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate_changed(*file_tables, drop=[name])


@pytest.mark.parametrize("key,value", [
    (Key.SSM_INNER_SIZE, 96),            # llama.cpp: only d_inner = 2 * n_embd
    (Key.SSM_TIME_STEP_RANK, 6),         # 128 not a multiple of 6
    (Key.SSM_GROUP_COUNT, 3),            # 8 heads not a multiple of 3 groups
])
def test_unsupported_value_is_refused_naming_the_key(file_tables, key, value):
    name = Key.arch(key, ARCH)
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate_changed(*file_tables, set_={name: value})


@pytest.mark.parametrize("value", [-1, 2.5, "4"])
def test_malformed_ssm_key_is_refused(file_tables, value):
    name = Key.arch(Key.SSM_STATE_SIZE, ARCH)
    with pytest.raises((MetadataValueError, UnsupportedModelError), match=name.replace(".", r"\.")):
        validate_changed(*file_tables, set_={name: value})


@pytest.mark.parametrize("tensor", ["blk.0.ssm_in.weight", "blk.2.ssm_conv1d.weight",
                                    "blk.3.ssm_a", "blk.3.ssm_d", "blk.0.ssm_dt.bias",
                                    "blk.2.ssm_norm.weight", "blk.3.ssm_out.weight",
                                    "blk.4.attn_k.weight"])
def test_missing_tensor_is_refused_naming_it(file_tables, tensor):
    with pytest.raises(UnsupportedModelError, match=tensor.replace(".", r"\.")):
        validate_changed(*file_tables, drop_tensor=tensor)


def test_conv_bias_is_optional(file_tables):
    spec = validate_changed(*file_tables, drop_tensor="blk.0.ssm_conv1d.bias")
    assert spec.layers[0].ssm_conv1d_b is None


def test_wrong_shape_is_refused(file_tables):
    md, tensors = file_tables
    t = tensors["blk.0.ssm_norm.weight"]
    tensors = dict(tensors, **{t.name: dataclasses.replace(t, shape=(128, 1))})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ssm_norm\.weight"):
        arch.validate(md, tensors)


def test_golden_every_kernel_path(core, model_path):
    """Teacher-forced logits within the F16 tolerances on generic, avx2 and avx512 (every path
    this CPU has)."""
    check_every_kernel_path(core, "synthetic-granitehybrid", path=model_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_chunks_and_single_tokens_agree(model_path, backend):
    """The prompt in one batch, in chunks of 7 and token by token: the same bits (the
    recurrence runs token by token whatever the batch; each chunk starts from the SSM state
    and convolution inputs the previous one left)."""
    p = TOKENS[:N_PROMPT]
    with Model.load(model_path, backend=backend, n_threads=2) as m:
        whole = m.session(n_ctx=128).eval(p)[0]
        chunks = m.session(n_ctx=128, n_batch=7).eval(p)[0]
        s = m.session(n_ctx=128)
        for t in p:
            one = s.eval([t])[0]
    assert np.array_equal(whole, chunks) and np.array_equal(whole, one)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_carries_the_recurrent_state(model_path, backend):
    """A fork holds a copy of the SSM states and convolution inputs: the next token's logits
    are the same bits in the fork as in the parent, and evaluating in the fork leaves the
    parent's state alone."""
    p = TOKENS[:N_PROMPT]
    with Model.load(model_path, backend=backend, n_threads=2) as m:
        s = m.session(n_ctx=128)
        s.eval(p[:-1])
        f = s.fork()
        forked = f.eval(p[-1:])[0]
        f.eval(p[:3])
        parent = s.eval(p[-1:])[0]
    assert np.array_equal(forked, parent)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rewind_restores_a_checkpoint_and_gives_a_cold_start(model_path, backend):
    """A session rewound into its history (prefix reuse, truncate) restores the newest
    checkpoint at or before the point, replays, and gives what a fresh session gives."""
    a, b = TOKENS[:30], TOKENS[:20] + [7, 8, 9, 10, 11]
    with Model.load(model_path, backend=backend, n_threads=2) as m:
        s = m.session(n_ctx=128, n_batch=8)
        s.eval(a)
        assert [c[0] for c in m.backend.recurrent(s._buf).checkpoints] == [16, 24, 29, 30]
        s.truncate(s.common_prefix(b))
        warm = s.eval(b[s.n_past:])[0]
        cold = m.session(n_ctx=128).eval(b)[0]
        s.truncate(3)                     # before every checkpoint: from the empty state
        again = s.eval(a[3:])[0]
        first = m.session(n_ctx=128).eval(a)[0]
    assert np.array_equal(warm, cold) and np.array_equal(again, first)


def test_fork_and_decode_batch_of_sessions(core, model_path):
    """Several sessions' decode step in one compiled pass updates each session's own state:
    the bits of each session alone, and of a second step."""
    prompts = [TOKENS[:12], TOKENS[5:9], [1, 300, 301, 302, 303, 304, 305]]
    with Model.load(model_path, n_threads=2) as m:
        alone, batched, forked, ss = alone_batched_forked(m, prompts)
        again = m.decode_batch(ss, [5, 6, 7])
        s = m.session(n_ctx=64)
        s.eval(prompts[0])
        second = s.eval([5])[0]
    assert np.array_equal(np.array(alone), batched)
    assert np.array_equal(forked, alone[0]) and np.array_equal(again[0], second)


def test_memory_plan_counts_the_state_once_per_sequence(core, model_path):
    """The memory plan (`edged info`) holds the K/V rows of the 2 attention layers per position
    plus the Mamba-2 state and its checkpoints, constant per sequence."""
    with Model.load(model_path, n_threads=2) as m:
        hp = m.hp
        per_seq = (1 + recurrent.N_CHECKPOINTS) * 4 * hp.recurrent_state_floats()
        assert hp.kv_slots == (None, 0, None, None, 1)
        rows = 2 * 2 * (2 * hp.n_head_kv * hp.head_dim)      # F16 K and V of 2 layers
        for n_ctx in (64, 256):
            assert m.backend.plan(n_ctx, 8).kv_cache == n_ctx * rows + per_seq
        assert m.backend.recurrent(m.session(n_ctx=64)._buf).live.size == \
            hp.recurrent_state_floats()


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt_cache_file_holds_the_mamba2_state(model_path, backend, tmp_path):
    """A prompt-cache file carries the Mamba-2 state and its checkpoints: a session restored
    from it continues with the bits of the session that wrote it."""
    key, path = b"k" * 32, tmp_path / "p.edkv"
    with Model.load(model_path, backend=backend, n_threads=2) as m:
        s = m.session(n_ctx=64, n_batch=8)
        s.eval(TOKENS[:20])
        s.save(path, key=key)
        want = s.eval(TOKENS[20:22])[0]
        r = type(s).load(m, path, key=key)
        assert r.n_past == 20 and m.backend.recurrent(r._buf).pos == 20
        assert np.array_equal(r.eval(TOKENS[20:22])[0], want)


def test_info_names_the_mamba2_layers(model_path, capsys):
    from edged.cli import main
    main(["info", "-m", model_path, "-c", "512"])
    out = capsys.readouterr().out
    assert "Mamba-2 on layers [0, 2, 3] (8 heads of 16 x state 16, 2 groups, 4-tap" in out
    assert "per sequence" in out


def test_moe_experts_as_llama_cpp_reads_them(moe_tables):
    """Experts are feed_forward_length wide, the top k renormalised; the shared expert has no
    gate tensor."""
    spec = arch.validate(*moe_tables)
    hp, L = spec.hp, spec.layers[0]
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff_shexp) == (8, 2, 32, 32)
    assert hp.expert_weights_norm and L.ffn_up is None and L.ffn_gate_inp_shexp is None
    assert L.ffn_up_shexp == "blk.0.ffn_up_shexp.weight" and L.ssm_in is not None


def test_moe_expert_used_count_is_required(moe_tables):
    name = Key.arch(Key.EXPERT_USED_COUNT, ARCH)
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate_changed(*moe_tables, drop=[name])


def test_moe_golden_reference(moe_path):
    check("synthetic-granitehybrid-moe", "reference", path=moe_path)


def test_moe_golden_every_kernel_path(core, moe_path):
    check_every_kernel_path(core, "synthetic-granitehybrid-moe", path=moe_path)


def test_moe_batch_chunks_and_single_tokens_agree(core, moe_path):
    p = MOE_TOKENS[:N_PROMPT]
    with Model.load(moe_path, n_threads=2) as m:
        whole = m.session(n_ctx=128).eval(p)[0]
        chunks = m.session(n_ctx=128, n_batch=7).eval(p)[0]
        s = m.session(n_ctx=128)
        for t in p:
            one = s.eval([t])[0]
    assert np.array_equal(whole, chunks) and np.array_equal(whole, one)


def test_synth_shape_layout(core, tmp_path, monkeypatch):
    """`edged synth --shape granite-4.0-h-350m`'s layout at a small size: per-layer
    head_count_kv with 0 on the Mamba-2 layers, the ssm.* keys, granite's multipliers, RoPE
    off, F32 vectors in the converter's shapes (ssm_norm 2-D even for one group); read back by
    the PyPI gguf reader, and the compiled forward agrees with the NumPy reference on it. (The
    full-size Q4_K_M file loads in llama.cpp 0.3.36, whose teacher-forced logits edged's match
    within the quantized tolerances: docs/models.md.)"""
    import gguf
    from edged.format import synth
    small = dict(synth.SHAPES["granite-4.0-h-350m"], n_embd=64, n_head=4, n_head_kv=2,
                 n_ff=128, n_layer=4, n_vocab=512, attn_layers=(2,),
                 mamba2=dict(d_conv=4, d_state=16, n_head=8, n_group=1))
    monkeypatch.setitem(synth.SHAPES, "test-granite", small)
    path = str(tmp_path / "g.gguf")
    synth.synth("test-granite", "Q8_0", path)
    r = gguf.GGUFReader(path)
    assert list(r.fields["granitehybrid.attention.head_count_kv"].contents()) == [0, 0, 2, 0]
    assert r.fields["granitehybrid.ssm.inner_size"].contents() == 128
    assert r.fields["granitehybrid.rope.scaling.finetuned"].contents() is False
    names = {t.name: t for t in r.tensors}
    assert list(names["blk.0.ssm_norm.weight"].shape) == [128, 1]
    assert names["blk.0.ssm_in.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert names["blk.0.ssm_conv1d.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert "blk.0.attn_q.weight" not in names and "blk.2.ssm_in.weight" not in names
    ids = [1, 40, 41, 42, 43, 44, 45, 46]
    with Model.load(path, n_threads=2) as m, Model.load(path, backend="reference") as ref:
        assert m.hp.n_recr_layers == 3 and m.hp.embd_scale == 12.0
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        want = np.asarray(ref.session(n_ctx=32).eval(ids, logits="all"))
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_synth_shape_writes_granite_moe_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape granite-4.0-h-tiny`'s layout at a small size: experts in every layer
    (Mamba-2 and attention), feed_forward_length wide with no expert_feed_forward_length key,
    the shared expert's width and its ungated tensors, the router F32; the compiled forward
    agrees with the NumPy reference on it."""
    import gguf
    path, r = synth_small(tmp_path, monkeypatch, "granite-4.0-h-tiny", "Q8_0", n_embd=64,
                          n_head=4, n_head_kv=2, n_ff=32, n_layer=4, n_vocab=512,
                          attn_layers=(1,), mamba2=dict(d_conv=4, d_state=16, n_head=8, n_group=1),
                          n_expert=8, n_expert_used=3, n_ff_exp=32, n_ff_shexp=48)
    assert [r.fields["granitehybrid." + k].contents() for k in (
        "expert_count", "expert_used_count", "expert_shared_feed_forward_length",
        "feed_forward_length")] == [8, 3, 48, 32]
    assert "granitehybrid.expert_feed_forward_length" not in r.fields
    names = {t.name: t for t in r.tensors}
    for il in range(4):
        assert list(names[f"blk.{il}.ffn_up_exps.weight"].shape) == [64, 32, 8]
        assert list(names[f"blk.{il}.ffn_down_shexp.weight"].shape) == [48, 64]
        assert names[f"blk.{il}.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
        assert f"blk.{il}.ffn_gate_inp_shexp.weight" not in names
        assert f"blk.{il}.ffn_up.weight" not in names
    ids = [1, 40, 41, 42, 43, 44, 45, 46]
    with Model.load(path, n_threads=2) as m, Model.load(path, backend="reference") as ref:
        assert (m.hp.n_expert, m.hp.n_expert_used, m.hp.n_ff_exp, m.hp.n_ff_shexp) == (8, 3, 32, 48)
        got = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
        want = np.asarray(ref.session(n_ctx=32).eval(ids, logits="all"))
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("shape, arch_sizes", [
    ("granite-4.0-h-tiny", dict(n_head_kv=2, attn_layers=(1,), n_ff_shexp=64,
                                mamba2=dict(d_conv=4, d_state=16, n_head=8, n_group=1))),
    ("qwen3.5-35b-a3b", dict(n_head_kv=2, head_dim=32, n_rot=16, sections=(3, 3, 2, 0),
                             attn_layers=(3,), n_ff_shexp=64,
                             ssm=dict(d_conv=4, d_state=16, n_group=2, dt_rank=8))),
])
def test_recurrent_projections_repacked_give_the_same_bits(core, tmp_path, monkeypatch, shape,
                                                            arch_sizes):
    """The Mamba-2 layers' ssm_in / ssm_out and the DeltaNet layers' attn_gate, ssm_beta,
    ssm_alpha and ssm_out are repacked at load like the other projections (their rows read by
    the path's fastest kernels): a prompt and single tokens give the mapped layout's bits."""
    path, _ = synth_small(tmp_path, monkeypatch, shape, "Q4_K_M", n_embd=256, n_head=4, n_ff=64,
                          n_layer=4, n_vocab=512, n_expert=8, n_expert_used=2, n_ff_exp=64,
                          reader=False, **arch_sizes)

    want, got, repacked, kernel_path = mapped_and_repacked(path, monkeypatch)
    if kernel_path == "generic":
        pytest.skip("the generic path reads no matrix repacked")
    roles = ("ssm_in", "ssm_out") if "mamba2" in arch_sizes else (
        "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out")
    assert {f"blk.0.{r}.weight" for r in roles} <= repacked
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
