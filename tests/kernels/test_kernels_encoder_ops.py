"""The encoder's compiled per-layer ops (cython_kernels/forward/encoder.h: LayerNorm with bias
and residual, GELU / SiLU-gated activation, non-causal attention with biases and NeoX RoPE)
against the NumPy reference the reference backend runs (edged/engine/encoder.py,
edged/engine/reference.py), on every SIMD path this CPU supports, over odd shapes, with and
without the thread pool."""
import math

import numpy as np
import pytest

from edged.engine.encoder import layer_norm
from edged.engine.reference import gelu_ggml, rope, silu
from kernel_paths import every_path, paths  # noqa: F401  (fixture: every SIMD path)

core = pytest.importorskip("edged._core")

# named tolerances
TOL_NORM = 2e-6        # absolute on unit-scale outputs: float32 vs float64 centring
TOL_GELU = 2.0 ** -10  # relative: one F16 step (ggml fills its table in float32, the
                       # reference rounds a float64 GELU to F16)
TOL_ACT = 1e-6         # relative: SiLU in float32 vs float64
TOL_ATTN = 2e-5        # absolute on unit-scale values: float32 products vs float64


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"threads{n}")
def pool(request):
    return None if request.param == 1 else core.Pool(request.param)


@pytest.mark.parametrize("n,E", [(1, 8), (5, 31), (33, 64), (7, 257)])
def test_enc_norm(n, E, pool):
    rng = np.random.default_rng(n * E)
    x = (rng.standard_normal((n, E)) * 3 + 1).astype(np.float32)
    res = rng.standard_normal((n, E)).astype(np.float32)
    bias = rng.standard_normal(E).astype(np.float32)
    w, b = rng.standard_normal(E).astype(np.float32), rng.standard_normal(E).astype(np.float32)
    got = x.copy()
    core.enc_norm(got, w, b, 1e-12, res, bias, pool)
    want = layer_norm((x + bias) + res, w, b, 1e-12)
    np.testing.assert_allclose(got, want, atol=TOL_NORM * np.abs(w).max() * 4, rtol=0)
    got = x.copy()
    core.enc_norm(got, w, b, 1e-5, None, None, pool)
    np.testing.assert_allclose(got, layer_norm(x, w, b, 1e-5), atol=TOL_NORM * np.abs(w).max() * 4)
    with pytest.raises(ValueError, match="enc_norm"):
        core.enc_norm(got, w[:-1], b, 1e-5)


@pytest.mark.parametrize("n,F", [(1, 1), (3, 33), (17, 255), (4, 1024)])
@pytest.mark.parametrize("every_path", paths(), indirect=True)
def test_enc_act(n, F, pool, every_path):
    rng = np.random.default_rng(n + F)
    h = (rng.standard_normal((n, F)) * 6).astype(np.float32)
    h[0, 0] = -12.0                        # the table's ends: 0 below -10, x above 10
    if F > 1:
        h[0, 1] = 11.5
    bias = rng.standard_normal(F).astype(np.float32)
    got = h.copy()
    core.enc_act(got, bias, None, pool)
    want = gelu_ggml((h + bias).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=TOL_GELU, atol=TOL_ACT)
    up = rng.standard_normal((n, F)).astype(np.float32)
    got = h.copy()
    core.enc_act(got, None, up, pool)
    np.testing.assert_allclose(got, silu(h.astype(np.float64)) * up, rtol=TOL_ACT * 4, atol=TOL_ACT)


def test_enc_act_gelu_same_bits_on_every_path():
    """GELU rounds its table index to F16 per path (F16C on x86, 8 at a time, 256 values per
    pass): the bits of the generic path's scalar rounding, over ties, the table's ends, the
    remainders of 8 and 256 and NaN."""
    rng = np.random.default_rng(23)
    h = (rng.standard_normal((3, 771)) * 6).astype(np.float32)
    h[0, :40] = (np.arange(40, dtype=np.float32) + 0.5) / 1024           # F16 ties near 0
    h[1, :6] = [-10.0, -9.999, 10.0, 9.999, np.inf, -np.inf]
    h[2, 300], h[2, 769] = np.nan, -np.nan
    bias = rng.standard_normal(771).astype(np.float32)
    before = core.kernel_path()
    outs = {}
    try:
        for p in paths():
            core.set_path(p)
            for b in (None, bias):
                got = h.copy()
                core.enc_act(got, b, None, core.Pool(2))
                outs[p, b is None] = got.view(np.uint32)
    finally:
        core.set_path(before)
    for (p, nob), got in outs.items():
        assert np.array_equal(got, outs["generic", nob]), p


def attention_ref(q, k, v, lens, H, scale, base):
    """Per sequence and head, softmax(scale q k^T) v in float64; NeoX RoPE when base > 0."""
    T, Qd = q.shape
    D = Qd // H
    q, k, v = (m.astype(np.float64).reshape(T, H, D) for m in (q, k, v))
    pos = np.concatenate([np.arange(n) for n in lens])
    if base > 0:
        q, k = rope(q, pos, D, base, 1.0, True), rope(k, pos, D, base, 1.0, True)
    out = np.empty((T, H, D))
    s0 = 0
    for n in lens:
        qs, ks, vs = (m[s0:s0 + n].transpose(1, 0, 2) for m in (q, k, v))
        sc = qs @ ks.transpose(0, 2, 1) * scale
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        out[s0:s0 + n] = (sc @ vs).transpose(1, 0, 2)
        s0 += n
    return out.reshape(T, Qd)


@pytest.mark.parametrize("lens,H,D", [([1], 1, 2), ([7, 1, 33], 3, 8), ([17, 16], 2, 64),
                                      ([40], 4, 34)])
@pytest.mark.parametrize("fused", [True, False], ids=["qkv", "q_k_v"])
@pytest.mark.parametrize("base", [0.0, 10000.0], ids=["learned_pos", "rope"])
@pytest.mark.parametrize("every_path", paths(), indirect=True)
def test_enc_attention(lens, H, D, fused, base, pool, every_path):
    rng = np.random.default_rng(sum(lens) * H * D)
    T, Qd = sum(lens), H * D
    qkv = rng.standard_normal((T, 3 * Qd)).astype(np.float32)
    orig = qkv.copy()                          # enc_attention adds biases and RoPE in place
    biases = [rng.standard_normal(Qd).astype(np.float32) for _ in range(3)]
    want = attention_ref(*(qkv[:, i * Qd:(i + 1) * Qd] + biases[i] for i in range(3)), lens, H,
                         1 / math.sqrt(D), base)
    if fused:                                  # column slices of one product: one row stride
        q, k, v = qkv[:, :Qd], qkv[:, Qd:2 * Qd], qkv[:, 2 * Qd:]
    else:
        q, k, v = (np.ascontiguousarray(qkv[:, i * Qd:(i + 1) * Qd]) for i in range(3))
    out = np.empty((T, Qd), np.float32)
    starts = np.cumsum([0] + lens).astype(np.int64)
    core.enc_attention(out, q, k, v, starts, H, 1 / math.sqrt(D), *biases, base, pool)
    np.testing.assert_allclose(out, want, atol=TOL_ATTN, rtol=0)
    # a sequence sees only itself: changing another sequence's keys leaves it unchanged
    if len(lens) > 1:
        q2, k2, v2 = (np.ascontiguousarray(orig[:, i * Qd:(i + 1) * Qd]) for i in range(3))
        k2[lens[0]:] += 5.0
        out2 = np.empty_like(out)
        core.enc_attention(out2, q2, k2, v2, starts, H, 1 / math.sqrt(D), *biases, base, pool)
        np.testing.assert_array_equal(out2[:lens[0]], out[:lens[0]])


def test_enc_attention_refuses_bad_shapes():
    x = np.zeros((4, 8), np.float32)
    out = np.empty_like(x)
    with pytest.raises(ValueError, match="starts"):
        core.enc_attention(out, x, x, x, np.array([0, 3], np.int64), 2, 0.5)
    with pytest.raises(ValueError, match="empty"):
        core.enc_attention(out, x, x, x, np.array([0, 0, 4], np.int64), 2, 0.5)
    with pytest.raises(ValueError, match="heads"):
        core.enc_attention(out, x, x, x, np.array([0, 4], np.int64), 3, 0.5)
    wide = np.zeros((4, 16), np.float32)
    with pytest.raises(ValueError, match="row stride"):
        core.enc_attention(out, wide[:, :8], x, x, np.array([0, 4], np.int64), 2, 0.5)


def q8_0_act(x):
    """Activations to Q8_0 as llama.cpp's x86 build (and ed_quant_q8_0) quantizes them: the
    multiplier 127 / amax in float, halves to even, the scale amax / 127 stored as F16."""
    b = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1)
    with np.errstate(divide="ignore"):
        mul = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((b * mul[..., None]).astype(np.float32)).astype(np.int64)
    return q, (amax / np.float32(127)).astype(np.float16).astype(np.float32)


def llama_order_q8_0(x, wq, wd):
    """x (T, K) times Q8_0 rows (wq (N, K/32, 32) int, wd (N, K/32) F16 scales) in llama.cpp's
    x86 order (ggml_vec_dot_q8_0_q8_0, tinyBLAS): per block 8 exact lane sums of 4 products,
    lane = fma(dw * dy, sum, lane) (float64 holds dw*dy*sum exactly; one rounding to float32
    after the add), then ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)) in float32."""
    q, dy = q8_0_act(x)
    T, N, nb = x.shape[0], wq.shape[0], wq.shape[1]
    out = np.empty((T, N), np.float32)
    for t in range(T):
        lanes = (wq * q[t][None]).reshape(N, nb, 8, 4).sum(-1).astype(np.float64)
        d = (wd * dy[t][None]).astype(np.float32).astype(np.float64)
        acc = np.zeros((N, 8), np.float32)
        for b in range(nb):
            acc = (d[:, b:b + 1] * lanes[:, b] + acc).astype(np.float32)
        out[t] = ((acc[:, 0] + acc[:, 4]) + (acc[:, 2] + acc[:, 6])) + \
                 ((acc[:, 1] + acc[:, 5]) + (acc[:, 3] + acc[:, 7]))
    return out


@pytest.mark.parametrize("T,K,N", [(1, 32, 1), (3, 96, 7), (65, 384, 33), (4, 1536, 5)])
@pytest.mark.parametrize("every_path", paths(), indirect=True)
def test_enc_matmul_q8_0_in_llama_cpp_order(T, K, N, pool, every_path):
    """An encoder's Q8_0 products give llama.cpp's bits on every path (65 tokens: past one
    64-token chunk); the canonical order (core.matmul) does not, which is what moved
    all-MiniLM-L6-v2's "hello world" to cosine 0.9998 from llama.cpp's vector."""
    rng = np.random.default_rng(T * K + N)
    wq = rng.integers(-127, 128, (N, K // 32, 32))
    wd = (rng.random((N, K // 32)) * 0.02 + 1e-4).astype(np.float16)
    raw = np.empty((N, K // 32, 34), np.uint8)
    raw[..., :2] = wd.view(np.uint8).reshape(N, K // 32, 2)
    raw[..., 2:] = wq.astype(np.int8).view(np.uint8)
    x = (rng.standard_normal((T, K)) * np.where(rng.random(K) < 0.02, 40, 1)).astype(np.float32)
    x[0, :32] = 0                                    # an all-zero block: scale 0
    got = np.empty((T, N), np.float32)
    core.enc_matmul_q8_0(got, raw.reshape(-1), x, pool)
    np.testing.assert_array_equal(got, llama_order_q8_0(x, wq, wd.astype(np.float32)))
    if K >= 384:
        canonical = np.empty_like(got)
        core.matmul(canonical, raw.reshape(-1), 8, x, pool)
        assert not np.array_equal(canonical, got)
        np.testing.assert_allclose(canonical, got, rtol=0, atol=1e-5 * np.abs(got).max())
    with pytest.raises(ValueError, match="enc_matmul_q8_0"):
        core.enc_matmul_q8_0(got, raw.reshape(-1)[:-1], x, pool)


@pytest.mark.parametrize("lens,H,D", [([37, 9, 4, 3], 2, 64), ([21], 3, 48), ([1024], 1, 64),
                                      ([18], 2, 72)])
@pytest.mark.parametrize("every_path", paths(), indirect=True)
def test_enc_attention_blocks_keep_the_row_kernels_bits(lens, H, D, pool, every_path):
    """The scores in 4 x 4 blocks of dots with their reduction trees run together (avx512,
    avx2), the rows' maxima in SIMD: the bits of one dot at a time (edges of 1..3 keys or
    queries, 16-query blocks, a head size that is no multiple of 16)."""
    rng = np.random.default_rng(sum(lens) * D)
    T, Qd = sum(lens), H * D
    starts = np.cumsum([0] + lens).astype(np.int64)
    qkv = (rng.standard_normal((T, 3 * Qd)) * 2).astype(np.float32)
    outs = []
    for blocks in (True, False):
        old = core.enc_blocks(blocks)
        try:
            q, k, v = (np.ascontiguousarray(qkv[:, i * Qd:(i + 1) * Qd]) for i in range(3))
            out = np.empty((T, Qd), np.float32)
            core.enc_attention(out, q, k, v, starts, H, 1 / math.sqrt(D), None, None, None, 0.0, pool)
            outs.append(out)
        finally:
            core.enc_blocks(old)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("T,K,N", [(1, 16, 1), (4, 48, 4), (7, 768, 67), (64, 160, 131)])
@pytest.mark.parametrize("every_path", paths(), indirect=True)
def test_enc_matmul_f16_is_matmuls_product(T, K, N, pool, every_path):
    """An F16 weight's product in 4 x 4 blocks (avx512; elsewhere None: matmul) gives
    edged._core.matmul's bits (the same lanes and trees), past the block's edges."""
    rng = np.random.default_rng(T * K + N)
    w = (rng.standard_normal((N, K)) * 0.1).astype(np.float16)
    x = rng.standard_normal((T, K)).astype(np.float32)
    want = np.empty((T, N), np.float32)
    core.matmul(want, w.view(np.uint8).reshape(-1), 1, x, pool)
    got = np.full((T, N), np.nan, np.float32)
    if core.enc_matmul_f16(got, w.view(np.uint8).reshape(-1), x, pool) is None:
        assert not every_path.startswith("avx512") or T < 4
        return
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="enc_matmul_f16"):
        core.enc_matmul_f16(got, w.view(np.uint8).reshape(-1)[:-2], x, pool)
