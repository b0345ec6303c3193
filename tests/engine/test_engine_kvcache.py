"""Quantized KV caches (llama.cpp's -ctk/-ctv): the memory they take, the options that choose
them and their errors, and the session operations (fork, prefix reuse, truncation, decode
batches) on a cache of q8_0/q4_0 rows. Logits against llama.cpp run with the same cache types
are in test_engine_families.py (the synthetic-kv-* goldens); the kernel paths, NEON included,
in tests/kernels/test_kernels_cross.py."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, testdata
from edged import Model
from edged.errors import ConfigError
from edged.format import synth
from edged.format.gguf import GGUFFile
from edged.service import config

pytest.importorskip("edged._core")

KVQ = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-kv-q8_0.gguf")  # head_dim 32
GEMMA2 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-gemma2.gguf")  # head_dim 16
# bytes per 32 values: f16 64, q8_0 34 (a half scale + 32 int8), q4_0 18 (a half + 16 nibble bytes)
ROW32 = {"f16": 64, "q8_0": 34, "q4_0": 18}


def load(ck, cv, **kw):
    return Model.load(KVQ, n_threads=2, cache_type_k=ck, cache_type_v=cv, **kw)


@pytest.mark.parametrize("ck, cv", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"),
                                    ("f16", "q4_0")])
def test_memory_plan_and_arena_hold_the_smaller_cache(ck, cv):
    n_ctx = 4096
    with load("f16", "f16") as base, load(ck, cv) as m:
        hp = m.hp
        blocks = hp.n_layer * n_ctx * hp.n_head_kv * hp.head_dim // 32
        want = blocks * (ROW32[ck] + ROW32[cv])
        assert m.plan(n_ctx).kv_cache == want
        assert base.plan(n_ctx).kv_cache == blocks * 128
        if (ck, cv) == ("q8_0", "q8_0"):
            assert m.plan(n_ctx).kv_cache / base.plan(n_ctx).kv_cache == pytest.approx(0.53125)
        if (ck, cv) == ("q4_0", "q4_0"):
            assert m.plan(n_ctx).kv_cache / base.plan(n_ctx).kv_cache == pytest.approx(0.28125)
        assert f"KV cache ({ck}/{cv})" in m.plan(n_ctx).describe()
        # the session's arena is smaller by exactly the cache difference
        s, s0 = m.session(n_ctx=256), base.session(n_ctx=256)
        k, v = s._buf.state.kv_cache()
        assert k.shape == (hp.n_layer, 256, ROW32[ck] * hp.n_head_kv * hp.head_dim // 32)
        assert v.shape == (hp.n_layer, 256, ROW32[cv] * hp.n_head_kv * hp.head_dim // 32)
        assert s0._buf.state.nbytes - s._buf.state.nbytes == \
            base.plan(256).kv_cache - m.plan(256).kv_cache
        assert s.memory_plan.kv_cache == m.plan(256).kv_cache


def test_bad_cache_types_are_refused_naming_the_option():
    with pytest.raises(ConfigError, match=r"cache_type_k='q5_0'.*f16, q8_0, q4_0"):
        load("q5_0", "f16")
    with pytest.raises(ConfigError, match=r"cache_type_v='int8'.*f16, q8_0, q4_0"):
        load("f16", "int8")
    # a 16-wide head cannot hold a 32-value block: refused at load, before anything is allocated
    with pytest.raises(ConfigError, match=r"cache_type_v=q8_0: head_dim 16 .* multiple of .* 32"):
        Model.load(GEMMA2, n_threads=1, cache_type_v="q8_0")
    # Python names and upper case are accepted as llama.cpp's are
    with load("Q8_0", "f16") as m:
        assert m.cache.names == ("q8_0", "f16")


@pytest.mark.parametrize("ck, cv", [("q4_0", "q4_0"), ("q8_0", "f16")])
def test_fork_prefix_reuse_and_truncation_read_the_stored_rows(ck, cv):
    rng = np.random.default_rng(3)
    a, b, c = (rng.integers(3, 500, n).tolist() for n in (37, 9, 6))
    with load(ck, cv) as m:
        s = m.session(n_ctx=128)
        s.eval(a)
        f = s.fork()                      # copies the quantized rows of a
        k, v = s._buf.state.kv_cache()
        fk, fv = f._buf.state.kv_cache()
        assert np.array_equal(k[:, :len(a)], fk[:, :len(a)]) and k[:, :len(a)].any()
        assert np.array_equal(v[:, :len(a)], fv[:, :len(a)])
        want = np.concatenate([s.eval([t]) for t in c])
        got = np.concatenate([f.eval([t]) for t in c])
        assert np.array_equal(want, got)
        # truncation: a then b, forget b, then c one by one == a then c
        t = m.session(n_ctx=128)
        t.eval(a)
        t.eval(b)
        t.truncate(len(a))
        assert np.array_equal(np.concatenate([t.eval([x]) for x in c]), want)
        # prefix reuse: start() evaluates only what the cache lacks
        g = m.session(n_ctx=128)
        g.eval(a)
        assert g.common_prefix(a + c) == len(a)


def test_decode_batch_rows_equal_each_sessions_own_step():
    """Several sessions' next tokens in one pass read each row's own quantized cache, and a
    row equals that session's one-token step bit for bit (as with the F16 cache)."""
    rng = np.random.default_rng(5)
    with load("q8_0", "q8_0") as m:
        prompts = [rng.integers(3, 500, n).tolist() for n in (5, 17, 40)]
        nxt = [7, 11, 13]
        solo = []
        for p, t in zip(prompts, nxt):
            s = m.session(n_ctx=64)
            s.eval(p)
            solo.append(s.eval([t]))
        ss = [m.session(n_ctx=64) for _ in prompts]
        for s, p in zip(ss, prompts):
            s.eval(p)
        rows = m.decode_batch(ss, nxt)
        assert np.array_equal(rows, np.concatenate(solo))


def test_quantized_cache_changes_the_logits_and_q4_more_than_q8():
    """The option reaches the attention: q8_0 stays close to F16, q4_0 moves further."""
    ids = np.random.default_rng(9).integers(3, 500, 48).tolist()
    out = {}
    for ck in ("f16", "q8_0", "q4_0"):
        with load(ck, ck) as m:
            out[ck] = m.session(n_ctx=64).eval(ids, logits="all")
    d8, d4 = (np.abs(out[t] - out["f16"]).mean() for t in ("q8_0", "q4_0"))
    assert 0 < d8 < d4


def test_cli_options_and_info_report_the_cache():
    def edged(*args):
        return subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    r = edged("info", "-m", KVQ, "-c", "4096", "-ctk", "q8_0", "-ctv", "q4_0", "--json")
    assert r.returncode == 0, r.stderr
    mem = json.loads(r.stdout)["memory"][0]
    with load("q8_0", "q4_0") as m:
        assert mem["kv_cache"] == m.plan(4096).kv_cache
    assert (mem["cache_type_k"], mem["cache_type_v"]) == ("q8_0", "q4_0")
    r = edged("info", "-m", KVQ, "-c", "4096", "--cache-type-k", "q8_0")
    assert "KV cache (q8_0/f16)" in r.stdout
    r = edged("generate", "-m", KVQ, "-p", "ab", "-n", "4", "--temp", "0", "-ctk", "q8_0",
              "-ctv", "q8_0", "-t", "1")
    assert r.returncode == 0, r.stderr
    r = edged("generate", "-m", KVQ, "-p", "ab", "-n", "4", "-ctv", "q5_1")
    assert r.returncode != 0 and "cache_type_v='q5_1'" in r.stderr and "q4_0" in r.stderr


def test_bench_at_a_depth_with_a_quantized_cache():
    r = subprocess.run([sys.executable, "-m", "edged", "bench", "-m", KVQ, "-p", "8", "-n", "4",
                        "-d", "40", "-r", "1", "-t", "1", "-ctk", "q4_0", "-ctv", "q8_0", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["cache_type_k"], out["cache_type_v"]) == ("q4_0", "q8_0")
    assert sorted(x["test"] for x in out["results"]) == ["pp8@d40", "tg4@d40"]


def test_daemon_config_keys():
    c = config.load(None, {"cache_type_k": "q8_0", "cache_type_v": "q4_0"})
    assert (c.cache_type_k, c.cache_type_v) == ("q8_0", "q4_0")
    assert config.defaults().cache_type_k == "f16"
    with pytest.raises(ConfigError, match="'cache_type_v'"):
        config.load(None, {"cache_type_v": "q5_0"})


def test_smollm2_q8_0_cache_is_half_the_f16_one():
    path = testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with Model.load(path, n_threads=1) as f16, Model.load(path, n_threads=1, cache_type_k="q8_0",
                                                          cache_type_v="q8_0") as q8:
        # 30 layers x 3 KV heads x 64: 11.25 MiB of F16 at n_ctx 1024, 5.98 MiB of q8_0
        assert f16.plan(1024).kv_cache == 30 * 1024 * 192 * 2 * 2
        assert q8.plan(1024).kv_cache == 30 * 1024 * 192 // 32 * 34 * 2


def _log_softmax(x):
    x = x.astype(np.float64) - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def test_smollm2_q4_0_keys_are_rotated_like_llama_cpps():
    """A q4_0 K cache on the real SmolLM2 (head_dim 64), teacher-forced over the reference
    passage x3: KL to the F16 cache 0.029 with llama.cpp's Hadamard rotation of q/k/v (llama.cpp
    itself: 0.029, tools/kvcache_parity.py), 0.19 without it (one outlier channel sets each
    32-value block's scale)."""
    path = testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(testdata("models", "SmolLM2-135M-Instruct.Q4_1.reference.json")) as f:
        toks = json.load(f)["passage_ids"] * 3

    def logits(ck, cv):
        with Model.load(path, n_threads=2, cache_type_k=ck, cache_type_v=cv) as m:
            s = m.session(n_ctx=512)
            return np.concatenate([s.eval(toks[:64], logits="all")] + [s.eval([t]) for t in toks[64:]])

    base = _log_softmax(logits("f16", "f16"))
    for ck, cv, bound in (("q4_0", "f16", 0.06), ("f16", "q4_0", 0.015)):
        lq = _log_softmax(logits(ck, cv))
        kl = float((np.exp(base) * (base - lq)).sum(1).mean())
        assert kl < bound, (ck, cv, kl)


def _gpt_oss_with_sinks(path, monkeypatch, sinks):
    """A small gpt-oss (head_dim 32, so its cache can be quantized; a window of 8 on even layers)
    whose per-head sink logits are set to `sinks` (synth writes them 0.0)."""
    monkeypatch.setitem(synth.SHAPES, "gpt-oss-kvq", dict(
        arch="gpt-oss", n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=64, n_layer=2,
        n_vocab=512, rope_freq_base=10000.0, rms_eps=1e-5, n_ctx_train=4096, tied=False,
        qkv_bias=True, n_expert=4, n_expert_used=2, n_ff_exp=32, gpt_oss=True, n_swa=8))
    synth.synth("gpt-oss-kvq", "F32", path, seed=3)
    with GGUFFile.open(path) as f:
        offsets = [t.offset for n, t in f.tensors.items() if n.endswith("attn_sinks.weight")]
    with open(path, "r+b") as fh:
        for off in offsets:
            fh.seek(off)
            fh.write(np.asarray(sinks, np.float32).tobytes())
    return path


def _teacher_forced(path, backend, ck, cv, toks):
    with Model.load(path, backend=backend, n_threads=2, cache_type_k=ck, cache_type_v=cv) as m:
        s = m.session(n_ctx=64)
        rows = [s.eval(toks[:12], logits="all")] + [s.eval([t]) for t in toks[12:]]
        return np.concatenate(rows)


@pytest.mark.parametrize("ck, cv", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("f16", "q8_0"),
                                    ("q8_0", "f16")])
def test_attention_sinks_over_a_quantized_cache(tmp_path, monkeypatch, ck, cv):
    """gpt-oss's sink logit joins the softmax over a quantized cache as over an F16 one (the
    compiled flash row adds it after the keys, as ggml does): the compiled path against the
    NumPy reference, which stores the same q8_0/q4_0 rows and adds the sink to the softmax's
    sum; on a 12-token prompt and 10 single tokens past the window of 8."""
    toks = [1] + np.random.default_rng(0).integers(3, 512, 21).tolist()
    path = _gpt_oss_with_sinks(str(tmp_path / "oss.gguf"), monkeypatch, [1.5, -0.5, 0.0, 3.0])
    got, want = _teacher_forced(path, "cpu", ck, cv, toks), _teacher_forced(path, "reference", ck, cv, toks)
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    # the sinks matter: without them (a -inf logit adds nothing) the logits move far more
    nosink = _gpt_oss_with_sinks(str(tmp_path / "nosink.gguf"), monkeypatch, [-np.inf] * 4)
    assert np.abs(_teacher_forced(nosink, "cpu", ck, cv, toks) - want).max() > 1e-2


@pytest.mark.parametrize("ck, cv", [("q8_0", "q8_0"), ("q4_0", "q4_0")])
def test_sinks_over_a_quantized_cache_are_reproducible(tmp_path, monkeypatch, ck, cv):
    """Reproducibility (docs/engine.md) with gpt-oss's sinks and windows over a quantized cache:
    every row of a prompt, in one batch or in chunks, is the bits of the token evaluated alone
    (every row reads the stored rows in the one-token order)."""
    toks = [1] + np.random.default_rng(1).integers(3, 512, 29).tolist()
    path = _gpt_oss_with_sinks(str(tmp_path / "oss.gguf"), monkeypatch, [1.5, -0.5, 0.0, 3.0])
    with Model.load(path, n_threads=2, cache_type_k=ck, cache_type_v=cv) as m:
        whole = m.session(n_ctx=64).eval(toks, logits="all")
        s = m.session(n_ctx=64)
        chunks = np.concatenate([s.eval(toks[:9], logits="all"), s.eval(toks[9:30], logits="all")])
        t = m.session(n_ctx=64)
        alone = np.concatenate([t.eval([k]) for k in toks])
    np.testing.assert_array_equal(chunks, whole)
    np.testing.assert_array_equal(alone, whole)
