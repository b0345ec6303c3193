"""BF16 weight products on the AVX-512 paths (ed_simd_x86.inc, ED_BF16_ROWS): VDPBF16PS's order,
bit for bit, whether the CPU runs the instruction or its FMA emulation (edged._core.bf16_dp).

The order, as a NumPy model: the row in chunks of 32 values (the last zero-padded), lane j of
16 holding the pair k = 2j, 2j + 1: acc += w[k + 1] * y[k + 1], then acc += w[k] * y[k], each
add rounded to float32 (a product of two BF16 values is exact in float32, so one FMA is one
float32 add of it), then the 16 lanes' tree of the F32 kernels (l + l + 8, l + l + 4, ...)."""
import numpy as np
import pytest

from edged.format.gguf import GGMLType
from kernel_paths import every_path  # noqa: F401  (fixture: the paths named by parametrize)

core = pytest.importorskip("edged._core")

AVX512 = [p for p in ("avx512", "avx512-vnni") if "avx512" in core.available_paths()]
HAS_DP = "avx512bf16" in core.cpu_features()


def to_bf16(x):
    """float32 -> BF16 bits, to nearest even (ed_fp32_to_bf16, finite values)"""
    u = np.asarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


def pair_order(w, y):
    """out[t, r] = W[r] . y[t] (BF16 bits, (N, K) and (T, K)) in VDPBF16PS's order"""
    (N, K), T = w.shape, y.shape[0]
    Kp = -(-K // 32) * 32
    wf = np.zeros((N, Kp), np.float32)
    yf = np.zeros((T, Kp), np.float32)
    wf[:, :K], yf[:, :K] = bf16_float(w), bf16_float(y)
    acc = np.zeros((T, N, 16), np.float32)
    for i in range(0, Kp, 32):
        wc, yc = wf[:, i:i + 32].reshape(N, 16, 2), yf[:, i:i + 32].reshape(T, 16, 2)
        acc = acc + yc[:, None, :, 1] * wc[None, :, :, 1]
        acc = acc + yc[:, None, :, 0] * wc[None, :, :, 0]
    for h in (8, 4, 2, 1):
        acc = acc[..., :h] + acc[..., h:2 * h]
    return acc[..., 0]


def matmul(w, x, pool=None):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    core.matmul(out, w.view(np.uint8).reshape(-1), int(GGMLType.BF16), x, pool)
    return out


@pytest.mark.parametrize("T,K,N", [(1, 32, 1), (3, 31, 5), (1, 768, 67), (5, 800, 19), (37, 96, 131)])
@pytest.mark.parametrize("dp", [True, False])
@pytest.mark.parametrize("every_path", AVX512, indirect=True)
def test_bf16_products_in_the_instructions_order(T, K, N, dp, every_path):
    """Every shape (a tail of 1..31 values, one token's dot, tiles, cache blocks of many tokens)
    equals the model exactly, with the instruction and with its emulation."""
    if dp and not HAS_DP:
        pytest.skip("no AVX512_BF16 on this CPU")
    rng = np.random.default_rng(T * K + N)
    w = to_bf16(rng.standard_normal((N, K)) * 0.1)
    x = bf16_float(to_bf16(rng.standard_normal((T, K))))    # already BF16: rounding changes nothing
    old = core.bf16_dp(dp)
    try:
        got = matmul(w, x, core.Pool(2) if T > 4 else None)
    finally:
        core.bf16_dp(old)
    np.testing.assert_array_equal(got, pair_order(w, to_bf16(x)))


@pytest.mark.skipif(not HAS_DP, reason="compares VDPBF16PS with its emulation: needs AVX512_BF16")
@pytest.mark.parametrize("every_path", AVX512, indirect=True)
def test_emulation_gives_the_instructions_bits(every_path):
    """Random BF16 values from denormals to 2^123 (products that underflow float32 or overflow
    it, zeros of both signs) and pairs that cancel exactly, so that sums pass through zero and
    denormals: the FMA emulation and the instruction agree on every bit, and the model without
    flushing does not (the data reaches the flushes)."""
    rng = np.random.default_rng(7)
    N, K, T = 48, 96, 6
    sign = rng.integers(0, 2, (N + T, K)) << 15
    exp = rng.integers(107, 147, (N + T, K))                     # 2^-20 .. 2^19
    tiny = rng.choice([0, 1, 2, 40, 60, 62, 63, 64], (N + T, K))  # denormal, or products near
    exp[16:32], exp[N + 3:] = tiny[16:32], tiny[N + 3:]          # 2^-126 (rows 16-31 x tokens 3-5)
    exp[:16, ::7] = 250                                           # 2^123: overflows, with tokens 0-2
    bits = (sign | exp << 7 | rng.integers(0, 128, (N + T, K))).astype(np.uint16)
    bits[rng.random((N + T, K)) < 0.05] = 0x8000                 # -0
    w, y = bits[:N], bits[N:]
    w[33::2, ::2] = w[32::2, 1::2]                                # pairs that cancel exactly
    w[33::2, 1::2] = w[32::2, ::2] ^ 0x8000
    w[5] = 0x0001                                                 # all denormal
    x = bf16_float(y)
    got = []
    for dp in (True, False):
        old = core.bf16_dp(dp)
        try:
            got.append(matmul(w, x))
        finally:
            core.bf16_dp(old)
    np.testing.assert_array_equal(got[0].view(np.uint32), got[1].view(np.uint32))
    assert (got[0][:, 5] == 0).all() and np.isinf(got[0]).any() and (np.abs(got[0][3:, 16:32]) < 2.0 ** -100).all()
    with np.errstate(all="ignore"):
        model = pair_order(w, y)
    fin = np.isfinite(got[0])
    assert not np.array_equal(got[0][fin], model[fin])
