"""The table types IQ4_NL, IQ4_XS and MXFP4 against independent oracles.

- llama.cpp's own quantizer: tests/data/goldens/synthetic-NAME-MIX.gguf were made by
  llama-quantize from the F16 files tools/make_goldens.py writes (the same writer and seed
  rebuild them here), so `edged quantize` must give every tensor the same type and bytes;
- the PyPI gguf package: MXFP4 quantization (gguf.quants implements llama.cpp's), and (in
  test_kernels_quants.py) dequantization of all three bit for bit;
- the compiled quantizers (ed_quant.h) against the NumPy ones, on rows with llama.cpp's edge
  cases (zero and near-zero blocks, one spike, negative maxima, ties).
"""
import importlib.util
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import gguf.quants  # noqa: E402

from conftest import ROOT  # noqa: E402
from edged.format import quants  # noqa: E402
from edged.format.gguf import GGMLType, GGUFFile, Key, TYPE_INFO  # noqa: E402
from edged.format.quantize import quantize_file  # noqa: E402

GOLDENS = os.path.join(ROOT, "tests", "data", "goldens")
TABLE = [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4]


def _make_goldens():
    spec = importlib.util.spec_from_file_location("make_goldens", os.path.join(ROOT, "tools", "make_goldens.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MG = _make_goldens()
QUANTIZED = sorted(n for n in MG.QUANTIZED if os.path.exists(os.path.join(GOLDENS, f"synthetic-{n}.gguf")))


def test_quantized_fixtures_present():
    assert {"llama256-IQ4_NL", "llama256-IQ4_XS", "qwen3moe-MXFP4_MOE"} <= set(QUANTIZED)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("name", QUANTIZED)
def test_quantize_equals_llama_quantize(name, compiled, tmp_path):
    base, mix = MG.QUANTIZED[name]
    src = tmp_path / "f16.gguf"
    MG.write_gguf(base, MG.CASES[base], str(src), seed=1000 + list(MG.CASES).index(base))
    out = tmp_path / "out.gguf"
    quantize_file(str(src), str(out), mix, compiled=compiled)
    ref = GGUFFile.open(os.path.join(GOLDENS, f"synthetic-{name}.gguf"))
    got = GGUFFile.open(str(out))
    assert list(got.tensors) == list(ref.tensors)
    for tname, ti in ref.tensors.items():
        assert got.tensors[tname].type == ti.type, tname
        assert np.array_equal(got.tensor_bytes(tname), ref.tensor_bytes(tname)), tname
    assert got.metadata[Key.FILE_TYPE] == ref.metadata[Key.FILE_TYPE]
    types = {ti.type for ti in ref.tensors.values()}
    want = {"IQ4_NL": GGMLType.IQ4_NL, "IQ4_XS": GGMLType.IQ4_XS, "MXFP4_MOE": GGMLType.MXFP4}.get(mix)
    assert want is None or want in types


def _edge_rows(k, rng):
    """Rows of k with llama.cpp's edge cases in every 32-block position."""
    rows = [rng.standard_normal(k), rng.standard_normal(k) * 1e-3, np.zeros(k),
            np.linspace(-1, 1, k), np.round(rng.standard_normal(k) * 4) / 4]
    spike = rng.standard_normal(k) * 0.01
    spike[::37] = 5.0
    rows.append(spike)
    holes = rng.standard_normal(k)
    holes[32:64] = 0.0           # an all-zero block inside a live row
    holes[96:128] = 1e-17        # below GROUP_MAX_EPS
    holes[160] = -9.0            # a negative maximum
    rows.append(holes)
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("t", TABLE, ids=lambda t: t.name)
def test_compiled_quantizer_equals_numpy(t):
    core = pytest.importorskip("edged._core")
    x = _edge_rows(512, np.random.default_rng(int(t)))
    ours = quants.quantize(x, t)
    np.testing.assert_array_equal(core.quantize_rows(x, int(t)), ours)


def test_mxfp4_quantize_equals_gguf():
    x = _edge_rows(512, np.random.default_rng(5))
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    np.testing.assert_array_equal(quants.quantize(x, GGMLType.MXFP4), ref)


@pytest.mark.parametrize("t,limit", [(GGMLType.IQ4_NL, 0.09), (GGMLType.IQ4_XS, 0.09),
                                     (GGMLType.MXFP4, 0.13)], ids=lambda v: getattr(v, "name", ""))
def test_roundtrip_error(t, limit):
    """RMS error of quantize -> dequantize on unit Gaussian rows: 4-bit codebooks."""
    x = np.random.default_rng(9).standard_normal((4, 1024)).astype(np.float32)
    y = quants.dequantize(quants.quantize(x, t), t, x.shape)
    assert np.sqrt(np.mean((y - x) ** 2)) < limit


def test_type_sizes():
    assert (TYPE_INFO[GGMLType.IQ4_NL].type_size, TYPE_INFO[GGMLType.IQ4_XS].type_size,
            TYPE_INFO[GGMLType.MXFP4].type_size) == (18, 136, 17)
    assert quants.row_bytes(GGMLType.IQ4_XS, 512) == 272
