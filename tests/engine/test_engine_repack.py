"""Weights repacked at load (edged/engine/repack.py, ed_repack.h's R4 layout): the matrices a
path's kernels read 4 (Arm) or 8 (x86) rows side by side. NEON with dotprod repacks Q4_0 and
Q8_0, the x86 paths also Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4 and the K-quants (their R4 row kernels are checked bit for bit, natively
and under qemu:
tests/kernels/c/kernels_check.c, "repack" lines);
EDGED_REPACK=r4 takes the layout on any path (the generic twin of the kernel), so here the
whole engine runs over repacked weights: every logit must equal the mapped layout's bit for bit
(one-token rows, decode batches of several sessions, prompt panels, the tied output matrix),
with the mapping's pages of the repacked tensors released, or in place without a mapping."""
import platform

import numpy as np
import pytest

from conftest import testdata

core = pytest.importorskip("edged._core")

from edged import Model  # noqa: E402
from edged.errors import ConfigError  # noqa: E402
from edged.format.gguf import GGMLType  # noqa: E402

ARM_R4 = (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0)  # the layout on every target (groups of 4 on Arm)
X86_R4 = ARM_R4 + (GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q4_K, GGMLType.Q5_K,
                  GGMLType.Q6_K, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_XS)


def test_r4_pack_round_trip():
    rng = np.random.default_rng(0)
    for qtype, K in ((GGMLType.Q4_0, 96), (GGMLType.Q5_0, 96), (GGMLType.Q8_0, 96), (GGMLType.Q4_1, 96),
                     (GGMLType.Q5_1, 96), (GGMLType.IQ4_NL, 96), (GGMLType.MXFP4, 96), (GGMLType.Q4_K, 512),
                     (GGMLType.Q5_K, 512), (GGMLType.Q6_K, 512),
                     (GGMLType.Q2_K, 512), (GGMLType.Q3_K, 512), (GGMLType.IQ4_XS, 512)):
        R = 24  # 3 groups of 8 rows (x86) or 6 of 4 (Arm)
        if qtype not in ARM_R4 and core.R4_ROWS != 8:
            assert not core.r4_ok(int(qtype), K, R)  # x86 layouts only (groups of 8)
            continue
        w = core.quantize_rows(rng.standard_normal((R, K)).astype(np.float32), int(qtype)).reshape(-1)
        packed = core.r4_pack(np.empty_like(w), w, int(qtype), K, R)
        assert packed.nbytes == w.nbytes and not np.array_equal(packed, w)
        assert np.array_equal(core.r4_unpack(np.empty_like(w), packed, int(qtype), K, R), w)
        inplace = w.copy()
        core.r4_pack(inplace, inplace, int(qtype), K, R)
        assert np.array_equal(inplace, packed)
    assert core.r4_ok(int(GGMLType.Q4_0), 64, 8) and not core.r4_ok(int(GGMLType.Q4_0), 64, 6)
    assert not core.r4_ok(int(GGMLType.F16), 256, 8)
    with pytest.raises(ValueError, match="no R4 layout"):
        core.r4_pack(np.empty(36, np.uint8), np.zeros(36, np.uint8), int(GGMLType.Q4_0), 64, 1)


def test_which_paths_repack():
    """NEON with dotprod reads Q4_0 and Q8_0 in R4 (groups of 4 rows), every x86 path Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4 and the K-quants Q2_K..Q6_K (groups of 8: their row kernels take 8 rows as lanes); the generic path and NEON
    without dotprod keep the mapping."""
    if core.kernel_variant() in ("generic", "neon"):
        assert core.r4_types() == []
    elif core.kernel_path() == "neon":
        assert set(core.r4_types()) == {int(GGMLType.Q4_0), int(GGMLType.Q8_0)}
    else:
        assert set(core.r4_types()) == {int(t) for t in X86_R4}
    assert core.R4_ROWS == (8 if platform.machine() in ("x86_64", "i686") else 4)


def _logits(m):
    """A prompt batch of 20 tokens (packed panels where the path has them), two tokens one at
    a time, a chunk of 6, then one step of three sessions at once (a decode batch)."""
    out = []
    s = m.session(n_ctx=64)
    out.append(s.eval([(7 * i + 3) % m.n_vocab for i in range(20)]))
    for t in (11, 12):
        out.append(s.eval([t]))
    out.append(s.eval([21, 22, 23, 24, 25, 26]))  # a short chunk: the row tiles, 4 + 2 tokens
    others = [m.session(n_ctx=64) for _ in range(2)]
    for i, o in enumerate(others):
        o.eval([5 + i, 9 + i])
    out.append(m.decode_batch([s] + others, [13, 14, 15]))
    return np.concatenate([np.asarray(x, np.float32).reshape(-1) for x in out])


@pytest.mark.parametrize("name", ["synthetic-llama-Q4_0.gguf", "synthetic-llama-Q5_0.gguf",
                                  "synthetic-llama-Q8_0.gguf", "synthetic-phi3-Q8_0.gguf",
                                  "synthetic-llama-Q4_K_M.gguf", "synthetic-phi3-Q4_K_M.gguf",
                                  "synthetic-llama-Q5_K_M.gguf", "synthetic-llama-Q4_1.gguf",
                                  "synthetic-llama-Q5_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                  "synthetic-llama-Q2_K.gguf", "synthetic-llama-Q3_K_M.gguf",
                                  "synthetic-llama-Q6_K.gguf"])
@pytest.mark.parametrize("mmap", [True, False])
def test_repacked_weights_give_the_same_bits(monkeypatch, name, mmap):
    path = testdata("models", name)
    monkeypatch.setenv("EDGED_REPACK", "off")
    plain = Model.load(path, n_threads=2, mmap=mmap)
    assert plain.backend.repacked.tensors == []
    want = _logits(plain)
    monkeypatch.setenv("EDGED_REPACK", "r4")
    m = Model.load(path, n_threads=2, mmap=mmap)
    rp = m.backend.repacked
    assert rp.tensors, "nothing repacked"
    if mmap:
        assert rp.nbytes >= sum(m.spec.tensors[n].nbytes for n in rp.tensors)
    else:  # private copies: repacked in place, the token embedding (a tied output) left alone
        assert rp.nbytes == 0 and m.spec.token_embd not in rp.tensors
    got = _logits(m)
    assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_repack_mode_is_checked(monkeypatch):
    monkeypatch.setenv("EDGED_REPACK", "r8")
    with pytest.raises(ConfigError, match="EDGED_REPACK='r8'"):
        Model.load(testdata("models", "synthetic-llama-Q4_0.gguf"), n_threads=1)


@pytest.mark.parametrize("n", [1, 3, 20])
def test_matmul_over_the_r4_layout_gives_the_mapped_bits(n):
    """core.matmul(..., r4=True) (tools/bench_kernels.py measures what the engine reads with it):
    one token, a decode batch and a prompt batch over a repacked matrix, split over 2 threads."""
    rng = np.random.default_rng(1)
    K, R = 256, 56
    pool = core.Pool(2)
    for qtype in X86_R4:
        if not core.r4_ok(int(qtype), K, R):
            assert qtype not in ARM_R4 and core.R4_ROWS != 8
            continue
        w = core.quantize_rows(rng.standard_normal((R, K)).astype(np.float32), int(qtype)).reshape(-1)
        packed = core.r4_pack(np.empty_like(w), w, int(qtype), K, R)
        x = rng.standard_normal((n, K)).astype(np.float32)
        want, got = np.empty((n, R), np.float32), np.empty((n, R), np.float32)
        core.matmul(want, w, int(qtype), x, pool)
        core.matmul(got, packed, int(qtype), x, pool, True)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="no R4 layout"):
        core.matmul(np.empty((1, 6), np.float32), np.zeros(6 * 144, np.uint8), int(GGMLType.Q4_0),
                    np.zeros((1, 256), np.float32), pool, True)


# small MoE shapes: every expert's rows whole groups (n_ff_exp and n_embd multiples of 8, and
# of 256 so the K-quant mixes keep their K-quants)
MOE_SHAPES = {
    "qwen3moe": dict(arch="qwen3moe", n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_layer=2,
                     n_vocab=512, rope_freq_base=1e6, rms_eps=1e-6, n_ctx_train=4096, tied=False,
                     qkv_bias=False, qk_norm=True, n_expert=8, n_expert_used=2, n_ff_exp=256),
    "gpt-oss": dict(arch="gpt-oss", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                    n_layer=2, n_vocab=512, rope_freq_base=150000.0, rms_eps=1e-5,
                    n_ctx_train=4096, tied=False, qkv_bias=True, n_expert=8, n_expert_used=2,
                    n_ff_exp=256, gpt_oss=True, n_swa=8, yarn=(32.0, 4096)),
}


def _moe(tmp_path, monkeypatch, arch, ftype):
    from edged.format import synth
    monkeypatch.setitem(synth.SHAPES, f"test-{arch}", MOE_SHAPES[arch])
    path = str(tmp_path / f"{arch}-{ftype}.gguf")
    synth.synth(f"test-{arch}", ftype, path, seed=5)
    return path


def _experts(m):
    return [n for n in m.backend.repacked.tensors if "_exps." in n]


def _skip_unless_layout_takes(ftype):
    """the K-quant and MXFP4 layouts are x86's (groups of 8); Arm's groups of 4 take Q8_0 only here"""
    if core.R4_ROWS != 8 and ftype != "Q8_0":
        pytest.skip(f"no R4 layout for {ftype}'s experts on this machine")


def _prompt_logits(m, n=96):
    """a prompt long enough that every routed expert gets several tokens (its packed panels)"""
    s = m.session(n_ctx=n + 8)
    return np.asarray(s.eval([(5 * i + 1) % m.n_vocab for i in range(n)]), np.float32).reshape(-1)


@pytest.mark.parametrize("arch,ftype", [("qwen3moe", "Q4_K_M"), ("qwen3moe", "Q8_0"),
                                        ("qwen3moe", "MXFP4_MOE"), ("gpt-oss", "MXFP4_MOE")])
def test_moe_experts_repacked_give_the_same_bits(tmp_path, monkeypatch, arch, ftype):
    """The 3-D expert tensors repacked at load (a model that fits with every expert resident):
    one token per expert on the R4 row kernels, a prompt grouped by expert on the R4 panels,
    a decode batch; every logit equal to the mapped experts' bit for bit."""
    _skip_unless_layout_takes(ftype)
    path = _moe(tmp_path, monkeypatch, arch, ftype)
    monkeypatch.setenv("EDGED_REPACK", "off")
    plain = Model.load(path, n_threads=2)
    assert plain.backend.repacked.tensors == [] and plain.memory_plan.paged > 0
    want = np.concatenate([_logits(plain), _prompt_logits(plain)])
    monkeypatch.setenv("EDGED_REPACK", "r4")
    m = Model.load(path, n_threads=2)
    assert len(_experts(m)) == 3 * MOE_SHAPES[arch]["n_layer"], m.backend.repacked.tensors
    assert m.memory_plan.paged == 0  # resident now: nothing left to page
    got = np.concatenate([_logits(m), _prompt_logits(m)])
    assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_moe_experts_stay_mapped_where_resident_they_would_not_fit(tmp_path, monkeypatch):
    """Below the budget every expert resident needs, the experts stay mapped and page in as
    routed (the model still loads, with the same logits); private copies are repacked in place."""
    path = _moe(tmp_path, monkeypatch, "qwen3moe", "Q8_0")
    monkeypatch.setenv("EDGED_REPACK", "r4")
    roomy = Model.load(path, n_threads=1)
    assert _experts(roomy) and roomy.memory_plan.paged == 0
    lines = []
    tight = Model.load(path, n_threads=1, max_memory=roomy.memory_plan.total - 1, log=lines.append)
    assert _experts(tight) == [] and tight.backend.repacked.tensors  # the 2-D matrices still are
    assert tight.memory_plan.paged > 0
    assert any("experts: stay mapped" in ln for ln in lines), lines
    a, b = _logits(roomy), _logits(tight)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    private = Model.load(path, n_threads=1, mmap=False)
    assert _experts(private) and private.backend.repacked.nbytes == 0
    c = _logits(private)
    assert np.array_equal(a.view(np.uint32), c.view(np.uint32))


@pytest.mark.parametrize("arch,ftype", [("qwen3moe", "Q4_K_M"), ("gpt-oss", "MXFP4_MOE")])
def test_moe_one_token_equals_its_row_of_a_decode_batch(tmp_path, monkeypatch, arch, ftype):
    """Repacked experts, one token (one column per expert) against a decode batch (the tokens
    routed to an expert as the columns of one call): the same bits per row."""
    _skip_unless_layout_takes(ftype)
    path = _moe(tmp_path, monkeypatch, arch, ftype)
    monkeypatch.setenv("EDGED_REPACK", "r4")
    m = Model.load(path, n_threads=2)
    assert _experts(m)
    pairs = []
    for _ in range(2):
        a, b = m.session(n_ctx=32), m.session(n_ctx=32)
        a.eval([5, 6, 7])
        b.eval([9, 10])
        pairs.append((a, b))
    batch = np.asarray(m.decode_batch(list(pairs[0]), [11, 12]), np.float32).reshape(2, -1)
    single = np.stack([np.asarray(pairs[1][0].eval([11]), np.float32).reshape(-1),
                       np.asarray(pairs[1][1].eval([12]), np.float32).reshape(-1)])
    assert np.array_equal(batch.view(np.uint32), single.view(np.uint32))
