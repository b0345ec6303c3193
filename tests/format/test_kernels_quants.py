"""edged.format.quants against independent oracles: the PyPI gguf package's dequantize (bit for bit on
random valid blocks) and llama.cpp's own quantizer output (synthetic-llama-<TYPE>.gguf made by
llama-quantize from synthetic-llama-f32.gguf; IQ4_NL / IQ4_XS / MXFP4 in test_kernels_table_types.py)."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import gguf.quants  # noqa: E402

from conftest import testdata  # noqa: E402
from edged.format import quants  # noqa: E402
from edged.format.gguf import GGMLType, GGUFFile, TYPE_INFO  # noqa: E402

ALL = list(quants.SUPPORTED)  # every weight type
BLOCK32 = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1]
KQUANTS = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


def random_blocks(t, n_blocks, rng):
    """Random bytes whose half-float fields are finite (valid blocks)."""
    info = TYPE_INFO[t]
    if t == GGMLType.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
    if t == GGMLType.F16:
        return rng.standard_normal(n_blocks).astype(np.float16).view(np.uint8)
    if t == GGMLType.BF16:
        return (rng.standard_normal(n_blocks).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, info.type_size), dtype=np.uint8)
    halves = {GGMLType.Q8_0: [0], GGMLType.Q4_0: [0], GGMLType.Q5_0: [0], GGMLType.Q4_1: [0, 2],
              GGMLType.Q5_1: [0, 2], GGMLType.Q2_K: [80, 82], GGMLType.Q3_K: [108],
              GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208],
              GGMLType.IQ4_NL: [0], GGMLType.IQ4_XS: [0], GGMLType.MXFP4: []}[t]
    for off in halves:
        h = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_dequantize_matches_gguf_bit_for_bit(t):
    rng = np.random.default_rng(int(t) + 1)
    info = TYPE_INFO[t]
    n_blocks = 3 * 67
    raw = random_blocks(t, n_blocks, rng)
    rows, k = 3, 67 * info.block_size
    ours = quants.dequantize(raw, t, (rows, k))
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType(int(t)))
    assert ours.dtype == np.float32 and ours.shape == (rows, k)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


def test_unknown_type_is_refused_by_name():
    from edged.errors import UnsupportedModelError
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        quants.dequantize(np.zeros(66, np.uint8), GGMLType.IQ2_XXS, (256,))


def _pairs():
    """(float32 weights, llama.cpp bytes, type) for every quantized tensor of the fixtures."""
    src = GGUFFile.open(testdata("models", "synthetic-llama-f32.gguf"))
    names = {"Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1",
             "Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K"}
    out = {}
    for tname, fname in names.items():
        q = GGUFFile.open(testdata("models", f"synthetic-llama-{fname}.gguf"))
        for name, ti in q.tensors.items():
            if ti.type.name != tname or name not in src.tensors:
                continue
            s = src.tensors[name]
            if s.type != GGMLType.F32:
                continue
            x = np.array(src.tensor_bytes(name)).view(np.float32).reshape(-1, s.shape[0])
            out.setdefault(ti.type, []).append((name, x, np.array(q.tensor_bytes(name))))
    return out


@pytest.fixture(scope="module")
def llama_pairs():
    return _pairs()


@pytest.mark.parametrize("t", BLOCK32, ids=lambda t: t.name)
def test_block32_quantize_equals_llama_cpp_bytes(t, llama_pairs):
    assert llama_pairs.get(t), f"no {t.name} tensor in the fixtures"
    for name, x, ref in llama_pairs[t]:
        ours = quants.quantize(x, t).reshape(-1)
        assert np.array_equal(ours, ref), f"{name}: {np.count_nonzero(ours != ref)} bytes differ"


# named tolerance: share of super-blocks allowed to differ from llama.cpp's bytes (float
# contraction/ordering differences in C can flip a near-tie in the search)
KQUANT_BLOCK_MISMATCH = 0.01


@pytest.mark.parametrize("t", KQUANTS, ids=lambda t: t.name)
def test_kquant_quantize_matches_llama_cpp(t, llama_pairs):
    info = TYPE_INFO[t]
    assert llama_pairs.get(t), f"no {t.name} tensor in the fixtures"
    for name, x, ref in llama_pairs[t][:3]:
        ours = quants.quantize(x, t).reshape(-1, info.type_size)
        ref = ref.reshape(-1, info.type_size)
        differ = np.any(ours != ref, axis=1)
        assert differ.mean() <= KQUANT_BLOCK_MISMATCH, f"{name}: {differ.sum()}/{len(differ)} blocks differ"
        # never worse in error than llama.cpp on the blocks that differ
        k = x.shape[1]
        xd = x.reshape(-1, info.block_size)
        e_ours = np.square(quants.dequantize(ours.reshape(-1), t, (x.size,)).reshape(-1, info.block_size) - xd).sum(1)
        e_ref = np.square(quants.dequantize(ref.reshape(-1), t, (x.size,)).reshape(-1, info.block_size) - xd).sum(1)
        assert e_ours[differ].sum() <= e_ref[differ].sum() * 1.05 + 1e-12, name


def test_quantize_roundtrip_error_small():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    limits = {GGMLType.Q8_0: 0.01, GGMLType.Q6_K: 0.03, GGMLType.Q5_K: 0.06, GGMLType.Q5_0: 0.08,
              GGMLType.Q5_1: 0.08, GGMLType.Q4_K: 0.12, GGMLType.Q4_0: 0.15, GGMLType.Q4_1: 0.15,
              GGMLType.Q3_K: 0.3, GGMLType.Q2_K: 0.5, GGMLType.F16: 1e-3, GGMLType.BF16: 1e-2}
    for t, lim in limits.items():
        y = quants.dequantize(quants.quantize(x, t), t, x.shape)
        rel = np.sqrt(np.mean((y - x) ** 2))
        assert rel < lim, (t.name, rel)


def test_q8_K_activation_blocks():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    b = quants.quantize_q8_K(x).reshape(-1, 292)
    d = b[:, :4].copy().view(np.float32)[:, 0]
    qs = b[:, 4:260].view(np.int8)
    bs = b[:, 260:292].copy().view(np.int16)
    assert np.array_equal(bs, qs.reshape(-1, 16, 16).sum(-1))
    np.testing.assert_allclose(d[:, None] * qs, x.reshape(-1, 256), atol=np.abs(x).max() / 127 * 0.51)
    assert np.abs(qs).max() <= 127


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_compiled_dequantize_rows_bit_exact(t):
    """The compiled embedding lookup gives the same bits as gguf's dequantize (and ours)."""
    core = pytest.importorskip("edged._core")
    rng = np.random.default_rng(int(t) + 100)
    info = TYPE_INFO[t]
    k = 2 * max(info.block_size, 32)
    n_rows = 33
    raw = random_blocks(t, n_rows * k // info.block_size, rng)
    ref = gguf.quants.dequantize(raw.reshape(n_rows, -1), gguf.GGMLQuantizationType(int(t))).astype(np.float32)
    ids = np.array([0, 32, 5, 5, 17], np.int64)
    out = np.full((len(ids), k), np.nan, np.float32)
    core.dequantize_rows(out, raw, int(t), ids)
    np.testing.assert_array_equal(out.view(np.uint32), ref[ids].view(np.uint32))
    allrows = np.empty((n_rows, k), np.float32)
    core.dequantize_rows(allrows, raw, int(t))
    np.testing.assert_array_equal(allrows.view(np.uint32), ref.view(np.uint32))
    with pytest.raises(IndexError):
        core.dequantize_rows(out, raw, int(t), np.array([0, 1, 2, 3, n_rows], np.int64))
