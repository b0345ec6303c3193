"""The forward pass's small ops (RMSNorm, RoPE, SiLU/GELU, attention over an F16 cache) against
plain NumPy, on every SIMD path this CPU supports, over odd shapes."""
import numpy as np
import pytest

core = pytest.importorskip("edged._core")
PATHS = core.available_paths()

# named tolerances
TOL_NORM = 1e-6        # relative, float32 arithmetic vs float64
TOL_ROPE = 2e-5        # absolute on unit-scale values; float32 angle and cos/sin
TOL_ACT = 1e-6         # relative
TOL_ATTN = 2e-3        # absolute on unit-scale values: q rounded to F16 like llama.cpp


@pytest.fixture(params=PATHS)
def path(request):
    old = core.kernel_path()
    core.set_path(request.param)
    yield request.param
    core.set_path(old)


@pytest.mark.parametrize("n", [1, 31, 33, 255, 257])
def test_rmsnorm(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    core.rmsnorm(out, x, w, 1e-5)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=TOL_NORM * 10, atol=TOL_NORM)
    core.rmsnorm(out, x, None, 1e-5)
    np.testing.assert_allclose(out, ref / w, rtol=TOL_NORM * 10, atol=TOL_NORM)


def rope_ref(x, pos, n_rot, base, freq_scale, ff, neox):
    x = x.astype(np.float64).copy()
    i = np.arange(n_rot // 2)
    theta = pos * base ** (-2.0 * i / n_rot)
    if ff is not None:
        theta = theta / ff[:n_rot // 2]
    theta = theta * freq_scale
    c, s = np.cos(theta), np.sin(theta)
    if neox:
        a, b = x[:, i].copy(), x[:, i + n_rot // 2].copy()
        x[:, i], x[:, i + n_rot // 2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[:, 2 * i].copy(), x[:, 2 * i + 1].copy()
        x[:, 2 * i], x[:, 2 * i + 1] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("hd,n_rot", [(64, 64), (64, 32), (128, 128), (2, 2)])
def test_rope(neox, hd, n_rot):
    rng = np.random.default_rng(hd + n_rot)
    for pos, base, scale, with_ff in [(0, 10000.0, 1.0, False), (1, 10000.0, 1.0, False),
                                      (37, 1e6, 1.0, True), (300, 500000.0, 0.25, True)]:
        x = rng.standard_normal((3, hd)).astype(np.float32)
        ff = (1.0 + rng.random(n_rot // 2) * 4).astype(np.float32) if with_ff else None
        y = x.copy()
        core.rope(y, pos, n_rot, base, scale, ff, neox)
        np.testing.assert_allclose(y, rope_ref(x, pos, n_rot, base, scale, ff, neox), atol=TOL_ROPE * max(1, pos / 10))
        assert np.array_equal(y[:, n_rot:], x[:, n_rot:])


def test_activations():
    x = np.linspace(-8, 8, 257).astype(np.float32)
    s = x.copy(); core.activation(s, "silu")
    g = x.copy(); core.activation(g, "gelu")
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s, x64 / (1 + np.exp(-x64)), rtol=TOL_ACT * 10, atol=TOL_ACT)
    # GELU as llama.cpp's CPU backend computes it: a table over F16 inputs with F16 entries
    gelu = lambda t: 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3)))
    assert np.array_equal(g.astype(np.float16).astype(np.float32), g)
    x16 = x.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(g, gelu(x16).astype(np.float16), rtol=1e-3, atol=1e-7)
    np.testing.assert_allclose(g, gelu(x64), rtol=2e-3, atol=2e-3)


def test_silu_mul_every_path():
    """The FFN's silu(gate) * up: the x86 vector code equals the scalar mirror bit for bit,
    also where it falls back per lane (exp overflow, -inf, NaN) and in the tail."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(1000) * 6, np.linspace(-120, 120, 301),
                        [88.0, 89.0, 90.0, -88.0, -89.0, -104.0, np.inf, -np.inf, np.nan, 0.0, -0.0],
                        rng.standard_normal(5)]).astype(np.float32)
    up = rng.standard_normal(x.shape[0]).astype(np.float32)
    before = core.kernel_path()
    try:
        got = {}
        for path in core.available_paths():
            core.set_path(path)
            g = x.copy()
            core.activation(g, "silu", up)
            got[path] = g
    finally:
        core.set_path(before)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = x64 / (1 + np.exp(-x64)) * up
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got["generic"][fin], ref[fin], rtol=TOL_ACT * 10, atol=TOL_ACT)
    for path, g in got.items():
        assert np.array_equal(g.view(np.uint32), got["generic"].view(np.uint32)), path


def attention_ref(q, k, v, pos, n_head, n_head_kv, scale, n_swa, sinks=None):
    n, Qd = q.shape
    hd = Qd // n_head
    group = n_head // n_head_kv
    q16 = q.astype(np.float16).astype(np.float64)
    k64, v64 = k.view(np.float16).astype(np.float64), v.view(np.float16).astype(np.float64)
    out = np.zeros((n, Qd))
    for t in range(n):
        p = pos + t
        j0 = max(0, p - n_swa + 1) if n_swa > 0 else 0
        for h in range(n_head):
            kvh = h // group
            kk = k64[j0:p + 1, kvh * hd:(kvh + 1) * hd]
            vv = v64[j0:p + 1, kvh * hd:(kvh + 1) * hd]
            s = kk @ q16[t, h * hd:(h + 1) * hd] * scale
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            w = np.exp(s - m)
            total = w.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))  # no value
            out[t, h * hd:(h + 1) * hd] = (w / total) @ vv
    return out


# head dims: multiples of 16 (every blocked kernel), 24 (AVX-512 hands it to the 8-lane kernel),
# 12 (row by row); 72 query heads on one KV head: more rows than one block holds
@pytest.mark.parametrize("n_head,n_head_kv,hd", [(4, 2, 64), (8, 1, 32), (3, 3, 16), (14, 2, 24),
                                                 (2, 1, 12), (72, 1, 16)])
@pytest.mark.parametrize("n_swa", [0, 5])
def test_attention(path, n_head, n_head_kv, hd, n_swa):
    rng = np.random.default_rng(n_head * 100 + hd + n_swa)
    n_ctx = 33
    for pos, n in [(0, 1), (0, 7), (20, 1), (25, 8)]:
        k = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
        v = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
        q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
        out = np.full_like(q, np.nan)
        scale = 1 / np.sqrt(hd)
        core.attention(out, q, k, v, pos, n_head, n_head_kv, scale, n_swa)
        ref = attention_ref(q, k, v, pos, n_head, n_head_kv, scale, n_swa)
        np.testing.assert_allclose(out, ref, atol=TOL_ATTN)
        # keys beyond the causal limit must not matter
        k2 = k.copy(); k2[pos + n:] = 0x7c00  # +inf in f16
        out2 = np.empty_like(out)
        core.attention(out2, q, k2, v, pos, n_head, n_head_kv, scale, n_swa)
        assert np.array_equal(out, out2)


@pytest.mark.parametrize("n_swa", [0, 100])
def test_attention_long(path, n_swa):
    """A prompt over many key tiles, in two batches, with peaked scores: the running max of
    the online softmax grows within and across tiles (and the window slides past tiles)."""
    rng = np.random.default_rng(7 + n_swa)
    n_head, n_head_kv, hd, n_ctx = 14, 2, 64, 300
    k = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    ramp = np.linspace(0.2, 3.0, n_ctx, dtype=np.float32)[:, None]  # later keys score higher
    k = (k.view(np.float16) * ramp.astype(np.float16)).view(np.uint16)
    for pos, n in [(0, 150), (150, 150)]:
        q = (4 * rng.standard_normal((n, n_head * hd))).astype(np.float32)
        out = np.full_like(q, np.nan)
        core.attention(out, q, k, v, pos, n_head, n_head_kv, 1 / np.sqrt(hd), n_swa)
        ref = attention_ref(q, k, v, pos, n_head, n_head_kv, 1 / np.sqrt(hd), n_swa)
        np.testing.assert_allclose(out, ref, atol=TOL_ATTN)


@pytest.mark.parametrize("n_head,n_head_kv,hd", [(8, 2, 64), (14, 2, 24), (2, 1, 12)])
def test_attention_sinks(path, n_head, n_head_kv, hd):
    """gpt-oss's sinks: one logit per head that joins the softmax and adds no value, in the
    exact kernel (1 and 8 tokens) and the blocked one (a 150-token batch over key tiles),
    with a window; sinks from far below to far above the scores."""
    rng = np.random.default_rng(hd + n_head)
    n_ctx = 300
    k = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    sinks = np.linspace(-20.0, 8.0, n_head).astype(np.float32)
    for pos, n, n_swa in [(0, 1, 0), (20, 8, 0), (0, 150, 0), (150, 150, 100)]:
        q = (2 * rng.standard_normal((n, n_head * hd))).astype(np.float32)
        out = np.full_like(q, np.nan)
        core.attention(out, q, k, v, pos, n_head, n_head_kv, 1 / np.sqrt(hd), n_swa, sinks)
        ref = attention_ref(q, k, v, pos, n_head, n_head_kv, 1 / np.sqrt(hd), n_swa, sinks)
        np.testing.assert_allclose(out, ref, atol=TOL_ATTN)
        plain = attention_ref(q, k, v, pos, n_head, n_head_kv, 1 / np.sqrt(hd), n_swa)
        assert np.abs(ref - plain).max() > 100 * TOL_ATTN   # the sinks matter here


def test_attention_rejects_bad_shapes():
    q = np.zeros((1, 64), np.float32)
    kv = np.zeros((4, 32), np.uint16)
    with pytest.raises(ValueError):
        core.attention(np.zeros((1, 64), np.float32), q, kv, kv, 0, 2, 2, 0.1)
    with pytest.raises(ValueError, match="outside"):
        core.attention(np.zeros((1, 64), np.float32), q, np.zeros((4, 64), np.uint16),
                       np.zeros((4, 64), np.uint16), 4, 2, 2, 0.1)


# head dims: 64 and 128 (the blocked kernels), 32 and 96 (the one-token code for every row);
# 9 query heads on 3 KV heads (SmolLM2), 14 on 2 (Qwen2.5-0.5B), 40 on 1 (more rows than a block)
@pytest.mark.parametrize("n_head,n_head_kv,hd", [(9, 3, 64), (14, 2, 64), (4, 2, 128), (40, 1, 64),
                                                 (8, 1, 32), (2, 1, 96)])
@pytest.mark.parametrize("n_swa", [0, 37])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_rows_are_one_token_results(path, n_head, n_head_kv, hd, n_swa, with_sinks):
    """Reproducibility (docs/engine.md): attention of a batch of query rows gives each row the
    bits of that token evaluated alone over the same cache, whatever the batch, its chunking
    or the kernel path; a long prompt and keys beyond one 16-key group and 64 lanes; with
    gpt-oss's sinks (from far below to above the scores: they join the max and the sum)."""
    rng = np.random.default_rng(n_head * 1000 + hd + n_swa)
    n_ctx, pos, n = 200, 11, 150
    k = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    q = (3 * rng.standard_normal((n, n_head * hd))).astype(np.float32)
    scale = 1 / np.sqrt(hd)
    sinks = np.linspace(-20.0, 8.0, n_head).astype(np.float32) if with_sinks else None
    whole = np.full_like(q, np.nan)
    core.attention(whole, q, k, v, pos, n_head, n_head_kv, scale, n_swa, sinks)
    np.testing.assert_allclose(whole, attention_ref(q, k, v, pos, n_head, n_head_kv, scale, n_swa, sinks),
                               atol=TOL_ATTN)
    for lo, hi in [(0, 1), (1, 9), (9, 41), (41, 42), (42, 150)]:  # chunks, single tokens included
        part = np.full_like(q[lo:hi], np.nan)
        core.attention(part, q[lo:hi], k, v, pos + lo, n_head, n_head_kv, scale, n_swa, sinks)
        assert np.array_equal(part, whole[lo:hi]), (lo, hi)
    one = np.full_like(q[:1], np.nan)
    for t in (0, 63, 64, 77, 149):
        core.attention(one, q[t:t + 1], k, v, pos + t, n_head, n_head_kv, scale, n_swa, sinks)
        assert np.array_equal(one[0], whole[t]), t


@pytest.mark.parametrize("n_head,n_head_kv,hd", [(9, 3, 64), (4, 2, 128), (40, 1, 64)])
@pytest.mark.parametrize("n_swa", [0, 37])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_of_few_rows_same_bits_on_every_path(n_head, n_head_kv, hd, n_swa, with_sinks):
    """Decode and small chunks (a few query rows) take the x86 one-row kernel (keys as vector
    lanes, ed_attn_x86.inc attn1): each token's output has the bits of the generic path's
    one-token attention, over key ranges that start and end inside a 16-key group and span
    several 64-key lane rounds, with and without sinks and a sliding window."""
    rng = np.random.default_rng(n_head + hd + n_swa)
    n_ctx, pos = 400, 301
    k = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    q = (3 * rng.standard_normal((6, n_head * hd))).astype(np.float32)
    sinks = np.linspace(-20.0, 8.0, n_head).astype(np.float32) if with_sinks else None
    old, outs = core.kernel_path(), {}
    try:
        for p in ["generic"] + [p for p in PATHS if p != "generic"]:
            core.set_path(p)
            for n in (1, 2, 5, 6):
                out = np.full_like(q[:n], np.nan)
                core.attention(out, q[:n], k, v, pos + 6 - n, n_head, n_head_kv, 1 / np.sqrt(hd), n_swa, sinks)
                outs[p, n] = out
    finally:
        core.set_path(old)
    for (p, n), out in outs.items():
        assert np.array_equal(out, outs["generic", n]), (p, n)
    np.testing.assert_allclose(outs["generic", 6], attention_ref(q, k, v, pos, n_head, n_head_kv, 1 / np.sqrt(hd),
                                                                 n_swa, sinks), atol=TOL_ATTN)


def test_attention_same_bits_on_every_path():
    """The canonical order is the same on every kernel path (ed_parity.h): a prompt's attention
    output does not depend on which path this CPU picked."""
    rng = np.random.default_rng(5)
    n_head, n_head_kv, hd, n_ctx, n = 14, 2, 64, 120, 100
    k = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_ctx, n_head_kv * hd)).astype(np.float16).view(np.uint16)
    q = (3 * rng.standard_normal((n, n_head * hd))).astype(np.float32)
    old, outs = core.kernel_path(), {}
    try:
        for p in PATHS:
            core.set_path(p)
            outs[p] = np.empty_like(q)
            core.attention(outs[p], q, k, v, 3, n_head, n_head_kv, 0.125, 0)
    finally:
        core.set_path(old)
    for p in PATHS:
        assert np.array_equal(outs[p], outs[PATHS[0]]), p
