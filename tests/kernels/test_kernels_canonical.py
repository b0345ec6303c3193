"""The canonical summation order (docs/kernels.md): a quantized matrix product gives the same
bits however its tokens are grouped (one prompt batch through the packed panels, the same
tokens in chunks, one token at a time, row tiles instead of panels), on any thread count, and
on every kernel path (generic, avx2, plain AVX2, avx512, AVX-512 without VNNI, neon): the same
bits as the plain C dot. Random weights of every quantized type, and real weight matrices of
the shared SmolLM2 and synthetic llama files and of tests/data/goldens' IQ4_NL / IQ4_XS files
(llama-quantize's; MXFP4 exists there only as 3-D expert tensors, so it has random weights only)."""
import os

import numpy as np
import pytest

from conftest import ROOT, TESTDATA
from edged.format import quants
from edged.format.gguf import GGUFFile, row_bytes

core = pytest.importorskip("edged._core")

QTYPES = list(quants.BLOCK_TYPES)  # every quantized weight type
PATHS = core.available_paths() + [v for v in core.VARIANTS if v.split("-")[0] in core.available_paths()]


def groupings(w, t, x, pool):
    """The product of every token with W, computed in each way the engine groups tokens."""
    n = x.shape[0]
    out = {}

    def mm(rows, min_cols=8, p=None):
        old = core.gemm_min_cols(min_cols)
        try:
            out = np.zeros((rows.shape[0], w.size // row_bytes(t, x.shape[1])), np.float32)
            core.matmul(out, w, int(t), np.ascontiguousarray(rows), p)
            return out
        finally:
            core.gemm_min_cols(old)

    out["batch (panels)"] = mm(x)
    out["batch, 2 threads"] = mm(x, p=pool)
    out["batch (row tiles)"] = mm(x, min_cols=10**6)
    out["chunks 9 + rest"] = np.concatenate([mm(x[:9]), mm(x[9:])])
    out["token by token"] = np.concatenate([mm(x[i:i + 1]) for i in range(n)])
    return out


def assert_all_equal(results, what):
    names = list(results)
    for name in names[1:]:
        a, b = results[names[0]], results[name]
        assert a.tobytes() == b.tobytes(), (
            f"{what}: {name} differs from {names[0]} (max |diff| {np.max(np.abs(a - b)):.3g})")


@pytest.fixture(scope="module")
def pool():
    return core.Pool(2)


@pytest.mark.parametrize("t", QTYPES, ids=lambda t: t.name)
def test_every_grouping_and_path_gives_the_same_bits(t, pool):
    rng = np.random.default_rng(int(t))
    n_rows, k, n_tok = 45, 512, 19  # row and token counts that leave every tile remainder
    w = quants.quantize(rng.standard_normal((n_rows, k)).astype(np.float32) * np.float32(0.1), t).reshape(-1)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    old = core.kernel_path()
    per_path = {}
    try:
        for path in PATHS:
            core.set_path(path)
            results = groupings(w, t, x, pool)
            assert_all_equal(results, f"{t.name} on {path}")
            per_path[path] = results["token by token"]
    finally:
        core.set_path(old)
    assert_all_equal(per_path, f"{t.name} across paths")


def real_matrices():
    """(file, tensor) pairs of the shared models: every quantized type they hold, once."""
    pairs, seen = [], set()
    goldens = os.path.join(ROOT, "tests", "data", "goldens")
    for folder, name in [(os.path.join(TESTDATA, "models"), n) for n in (
            "SmolLM2-135M-Instruct.Q4_1", "synthetic-llama-Q4_K_M", "synthetic-llama-Q8_0",
            "synthetic-llama-Q2_K", "synthetic-llama-Q3_K_M")] + [
            (goldens, "synthetic-llama256-IQ4_NL"), (goldens, "synthetic-llama256-IQ4_XS")]:
        path = os.path.join(folder, f"{name}.gguf")
        if not os.path.exists(path):  # EDGED_REQUIRE_ALL: the shared data is checked elsewhere
            continue
        with GGUFFile.open(path) as f:
            for info in f.tensors.values():
                if info.type in QTYPES and len(info.shape) == 2 and info.type not in seen:
                    seen.add(info.type)
                    pairs.append(pytest.param(path, info.name, id=f"{name}:{info.name}:{info.type.name}"))
    return pairs


@pytest.mark.parametrize("path,tensor", real_matrices())
def test_real_weights_give_the_same_bits_for_every_grouping(path, tensor, pool):
    with GGUFFile.open(path) as f:
        info = f.tensors[tensor]
        w = np.frombuffer(bytes(f.tensor_bytes(tensor)), np.uint8).copy()
    k, n_rows = info.shape
    rows = min(n_rows, 96)
    w = w[:rows * row_bytes(info.type, k)]
    x = np.random.default_rng(7).standard_normal((21, k)).astype(np.float32)
    old = core.kernel_path()
    per_path = {}
    try:
        for p in PATHS:
            core.set_path(p)
            results = groupings(w, info.type, x, pool)
            assert_all_equal(results, f"{tensor} on {p}")
            per_path[p] = results["token by token"]
    finally:
        core.set_path(old)
    assert_all_equal(per_path, f"{tensor} across paths")
