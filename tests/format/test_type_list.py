"""One list of types: the compiled core's (cython_kernels/kernels/ed_types.h, ED_TYPES, from which
every C table is generated) against the Python format layer (gguf.py's ids and block sizes,
quants.py's table of dequantizers and quantizers, arch.py's SUPPORTED_TYPES) and against every
kernel path's tables. A type in one of these lists and not in another fails here."""
import os

import numpy as np
import pytest

from edged.engine.arch import SUPPORTED_TYPES
from edged.errors import ConfigError
from edged.format import quants
from edged.format.gguf import GGMLType, TYPE_INFO

core = pytest.importorskip("edged._core")

ROWS = core.type_list()
WEIGHTS = {r["id"] for r in ROWS if r["weight"]}
ACTS = {r["id"] for r in ROWS if r["act"]}


def test_core_list_is_the_ggml_types_python_knows():
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    for r in ROWS:
        t = GGMLType(r["id"])
        assert t.name == r["name"], r
        assert (TYPE_INFO[t].block_size, TYPE_INFO[t].type_size) == (r["block"], r["type_size"]), r
        assert r["vec_type"] in ACTS, r
    assert {GGMLType(i).name for i in ACTS} == {"F32", "F16", "BF16", "Q8_0", "Q8_1", "Q8_K"}


def test_weight_types_are_one_set():
    assert WEIGHTS == {int(t) for t in quants.SUPPORTED} == {int(t) for t in SUPPORTED_TYPES}
    assert WEIGHTS == set(core.supported_types())


@pytest.mark.parametrize("t", sorted(WEIGHTS), ids=lambda t: GGMLType(t).name)
def test_every_weight_type_has_both_codecs_on_both_sides(t):
    """Quantize and dequantize one row with the NumPy twin and the compiled core: the same bytes
    and the same floats (a type missing from either side's table raises)."""
    k = 512
    x = np.random.default_rng(t).standard_normal((2, k)).astype(np.float32)
    raw = quants.quantize(x, t)
    assert raw.shape == (2, quants.row_bytes(t, k))
    if t not in (int(f) for f in quants.FLOAT_TYPES):  # the float types are conversions, not codecs
        np.testing.assert_array_equal(core.quantize_rows(x, t), raw)
    out = np.empty((2, k), np.float32)
    core.dequantize_rows(out, raw.reshape(-1), t)
    np.testing.assert_array_equal(out, quants.dequantize(raw, t, (2, k)))


@pytest.fixture
def restore_path():
    yield
    core.select_kernels(os.environ.get("EDGED_KERNELS") or None)  # the path chosen at import


def test_every_path_has_a_kernel_for_every_type(restore_path):
    floats = {int(t) for t in quants.FLOAT_TYPES}
    ran = set()
    for name in ("generic", "avx2", "avx2-vnni", "avx512", "avx512-vnni", "neon", "neon-dotprod"):
        try:
            core.select_kernels(name)
        except ConfigError:
            continue  # not on this CPU (tests/kernels/test_kernels_cross.py checks NEON under qemu)
        ran.add(core.kernel_variant())
        tables = {role: set(ids) for role, ids in core.kernel_tables().items()}
        assert tables["dot"] == WEIGHTS, name
        assert tables["quant"] == ACTS, name
        assert tables["tile"] == (set() if name == "generic" else WEIGHTS), name
        for role in ("rows_r4", "gemm"):  # a path's own packed kernels: block types only
            assert tables[role] <= WEIGHTS - floats, (name, role)
        # row kernels: a path's own for some types; on x86 the float weights' too (register blocks)
        assert tables["rows"] <= WEIGHTS, name
        assert (floats <= tables["rows"]) == name.startswith("avx"), name
    assert "generic" in ran and len(ran) >= 2
