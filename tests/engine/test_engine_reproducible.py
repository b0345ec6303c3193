"""Reproducible by construction (docs/engine.md, "Reproducibility"): a token's logits are the
same bits however they were reached: the prompt as one batch, in any chunks, token by token,
on 1..3 threads, in a batch with other sessions' decode tokens and prompt chunks, or after a
prefix from the cache; with attention sinks (gpt-oss) and over quantized KV caches (q8_0,
q4_0: every row reads the same stored rows in the one-token order). Every kernel that sums (the
weight-row dots of every batch shape, and attention) sums in one canonical order, so these hold
with tolerance 0 on every kernel path. Before, the prompt path (packed panels, blocked attention) summed in other orders: up to 1.30
apart in SmolLM2-135M's logits between one batch and token by token (issue #20)."""
import json
import os

import numpy as np
import pytest

from conftest import ROOT, testdata

pytest.importorskip("edged._core")

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# every weight type (the _K_M files mix K-quants) and every architecture of the shared data
SYNTHETIC = ["synthetic-llama-Q8_0.gguf", "synthetic-llama-Q4_0.gguf", "synthetic-llama-Q4_1.gguf",
             "synthetic-llama-Q5_0.gguf", "synthetic-llama-Q5_1.gguf", "synthetic-llama-Q2_K.gguf",
             "synthetic-llama-Q3_K_M.gguf", "synthetic-llama-Q4_K_M.gguf", "synthetic-llama-Q5_K_M.gguf",
             "synthetic-llama-Q6_K.gguf", "synthetic-llama-F16.gguf", "synthetic-llama-BF16.gguf",
             "synthetic-llama-f32.gguf", "synthetic-qwen2-Q8_0.gguf", "synthetic-qwen3-Q4_K_M.gguf",
             "synthetic-gemma3-Q4_K_M.gguf", "synthetic-phi3-Q8_0.gguf"]
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens")
# the repository's own small files: soft-capping and sliding windows (gemma2), mixture of
# experts (the router's top-k must see the same logits), YaRN, granite's scales, gpt-oss's
# attention sinks with alternating sliding windows (and its MXFP4 experts), gemma4's layers of
# their own sizes (and its experts beside a dense FFN)
FAMILIES = ["synthetic-gemma2.gguf", "synthetic-qwen3moe.gguf", "synthetic-qwen2moe.gguf",
            "synthetic-qwen2-yarn.gguf", "synthetic-granite.gguf", "synthetic-smollm3.gguf",
            "synthetic-phi4mini.gguf", "synthetic-gpt-oss.gguf", "synthetic-gpt-oss-mxfp4.gguf",
            "synthetic-kv-q8_0.gguf", "synthetic-gemma4.gguf", "synthetic-gemma4-moe.gguf"]
# quantized KV caches (llama.cpp's -ctk/-ctv): SmolLM2 (head_dim 64, the width the blocked
# F16 kernel takes) and the kv golden file (head_dim 32); the synthetic gpt-oss's head_dim 16
# holds no 32-value block (its sinks over a quantized cache: test_engine_kvcache.py)
QUANTIZED_KV = [(SMOL, "q8_0", "q8_0"), (SMOL, "q4_0", "q4_0"), (SMOL, "q8_0", "f16"),
                ("synthetic-kv-q8_0.gguf", "q4_0", "q4_0")]
CASES = [(name, "f16", "f16") for name in [SMOL] + SYNTHETIC + FAMILIES] + QUANTIZED_KV


def model_path(name):
    return os.path.join(GOLDENS, name) if name in FAMILIES else testdata("models", name)


def load(name, ck="f16", cv="f16", n_threads=1):
    from edged import Model
    return Model.load(model_path(name), n_threads=n_threads, cache_type_k=ck, cache_type_v=cv)


def passage(m):
    """SmolLM2's 82-token reference passage (ids of its own vocabulary; folded into others')."""
    ref = json.load(open(testdata("models", SMOL.replace(".gguf", ".reference.json"))))
    ids = ref["passage_ids"]
    ids = json.loads(ids) if isinstance(ids, str) else ids
    return [int(t) % m.n_vocab for t in ids]


def last_logits(m, toks, chunks, n_batch=128):
    """The last position's logits, the tokens fed in pieces of the given sizes."""
    s = m.session(n_ctx=128, n_batch=n_batch)
    i, out = 0, None
    for c in chunks:
        out = s.eval(toks[i:i + c])
        i += c
    assert i == len(toks)
    s.close()
    return out


@pytest.mark.parametrize("name, ck, cv", CASES)
def test_logits_do_not_depend_on_batching(name, ck, cv, kernel_path):
    """(a) one batch, (b) any chunking (also through n_batch), (c) token by token; and every
    row of a batch's logits="all" equals that token computed alone."""
    m = load(name, ck, cv)
    try:
        toks = passage(m)
        n = len(toks)
        one = last_logits(m, toks, [n])
        for chunks in ([40, n - 40], [1, 7, 8, 31, n - 47]):
            np.testing.assert_array_equal(last_logits(m, toks, chunks), one, err_msg=f"chunks {chunks}")
        np.testing.assert_array_equal(last_logits(m, toks, [n], n_batch=9), one, err_msg="n_batch 9")
        np.testing.assert_array_equal(last_logits(m, toks, [1] * n), one, err_msg="token by token")
        s, t = m.session(n_ctx=128), m.session(n_ctx=128)
        rows = s.eval(toks[:24], logits="all")
        alone = np.concatenate([t.eval([k]) for k in toks[:24]])
        np.testing.assert_array_equal(rows, alone, err_msg="logits='all' rows")
    finally:
        m.close()


@pytest.mark.parametrize("name, ck, cv", [(SMOL, "f16", "f16"), (SMOL, "q4_0", "q4_0"),
                                         ("synthetic-gpt-oss.gguf", "f16", "f16")])
def test_logits_do_not_depend_on_threads(name, ck, cv):
    """(d) 1, 2 and 3 threads (more threads than cores too) give the same bits, for one batch
    and for chunks."""
    got = []
    for k in (1, 2, 3):
        m = load(name, ck, cv, n_threads=k)
        toks = passage(m)
        got += [last_logits(m, toks, [len(toks)]), last_logits(m, toks, [33, len(toks) - 33])]
        m.close()
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])


@pytest.mark.parametrize("name, ck, cv", [(SMOL, "f16", "f16"), ("synthetic-llama-Q4_K_M.gguf", "f16", "f16"),
                                         ("synthetic-qwen2-Q8_0.gguf", "f16", "f16"),
                                         ("synthetic-gemma2.gguf", "f16", "f16"),
                                         ("synthetic-qwen3moe.gguf", "f16", "f16"),
                                         ("synthetic-gpt-oss.gguf", "f16", "f16")] + QUANTIZED_KV)
def test_batches_of_sessions_and_cached_prefixes(name, ck, cv, kernel_path):
    """(e) a session decoding in batches of changing composition (other sessions' decode
    tokens, another session's prompt chunk in the same pass) equals a twin fed token by token,
    and the chunk's own logits equal its prompt evaluated alone; (f) a prompt whose prefix came
    from the cache (after another prompt) equals it evaluated from scratch."""
    from edged import BatchEntry
    m = load(name, ck, cv)
    try:
        toks = passage(m)
        rng = np.random.default_rng(5)
        a = m.session(n_ctx=160)
        a.eval(toks[:60])
        twin = m.session(n_ctx=160)
        for k in toks[:60]:
            twin.eval([k])
        others = [m.session(n_ctx=160) for _ in range(3)]
        for i, o in enumerate(others):
            o.eval(toks[10 * i:10 * i + 5 + 7 * i])
        for step in range(6):
            group = [a] + others[:step % 4]          # 1..4 rows, a different mix each step
            ids = rng.integers(0, m.n_vocab, len(group)).tolist()
            got = m.decode_batch(group, ids)[0:1]
            np.testing.assert_array_equal(got, twin.eval([ids[0]]), err_msg=f"decode step {step}")
        # a prompt chunk of a new session riding in the decode steps of a and another
        p = m.session(n_ctx=160)
        alone = m.session(n_ctx=160)
        for lo, hi in [(0, 17), (17, 50), (50, 51), (51, 82)]:
            ids = rng.integers(0, m.n_vocab, 2).tolist()
            out = m.decode([BatchEntry(a, [ids[0]]), BatchEntry(p, toks[lo:hi]),
                            BatchEntry(others[0], [ids[1]], logits=None)])
            np.testing.assert_array_equal(out[0], twin.eval([ids[0]]), err_msg=f"decode row, chunk {lo}")
            np.testing.assert_array_equal(out[1], alone.eval(toks[lo:hi]), err_msg=f"chunk {lo}:{hi}")
            assert out[2] is None
        # (f): the cache holds toks[:50] + something else; the 50 tokens are reused (as the
        # daemon's prompt cache does: truncate to the common prefix, evaluate the rest)
        fresh = m.session(n_ctx=160)
        want = fresh.eval(toks[:70])
        c = m.session(n_ctx=160)
        c.eval(toks[:50] + toks[:9])
        c.truncate(50)
        np.testing.assert_array_equal(c.eval(toks[50:70]), want)
    finally:
        m.close()


def test_one_pass_for_mixed_entries(monkeypatch):
    """A step of decode tokens and a prompt chunk is ONE forward pass (the weights are read
    once for every row), and a step too big for one pass still answers every entry."""
    from edged import BatchEntry, Model
    m = Model.load(testdata("models", SMOL), n_threads=1)
    try:
        toks = passage(m)
        a, b, p = (m.session(n_ctx=160, n_batch=32) for _ in range(3))
        a.eval(toks[:5]); b.eval(toks[5:9])
        calls = []
        real = m.backend.decode_rows
        monkeypatch.setattr(m.backend, "forward", lambda *x: calls.append("forward"))
        monkeypatch.setattr(m.backend, "decode_rows", lambda *x: calls.append("rows") or real(*x))
        out = m.decode([BatchEntry(a, [1]), BatchEntry(p, toks[:20]), BatchEntry(b, [2])])
        assert calls == ["rows"] and [o.shape for o in out] == [(1, m.n_vocab)] * 3
        monkeypatch.undo()
        q = m.session(n_ctx=160, n_batch=32)
        want = q.eval(toks[:40], logits="all")[-1:]
        c = m.session(n_ctx=160, n_batch=32)
        out = m.decode([BatchEntry(a, [3]), BatchEntry(c, toks[:40])])  # 41 rows > n_batch 32
        np.testing.assert_array_equal(out[1], want)
    finally:
        m.close()
