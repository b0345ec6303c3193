"""Compiled dot products / matmul on every SIMD path this CPU supports, against the NumPy
reference (edged.format.quants): W dequantized, activations quantized to the weight type's partner
format (Q8_0 / Q8_1 / Q8_K / F16 / BF16) and dequantized, product in float64."""
import os
import subprocess
import sys

import numpy as np
import pytest

from edged.format import quants
from edged.format.gguf import GGMLType, TYPE_INFO
from matmul_reference import check_matmul, q8_act_llama_x86, random_weights

core = pytest.importorskip("edged._core")

TYPES = list(quants.SUPPORTED)  # every weight type
PATHS = core.available_paths()
# a family less a feature (EDGED_KERNELS=avx2-vnni, ...): the table a CPU without it runs
VARIANTS = [v for v in core.VARIANTS if v.split("-")[0] in PATHS]
ROWS = (1, 31, 33, 255, 257)

@pytest.fixture(params=PATHS + VARIANTS)
def path(request):
    old = core.kernel_path()
    core.set_path(request.param)
    yield request.param
    core.set_path(old)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmul_matches_reference(path, t):
    assert core.kernel_path() == path.split("-")[0]
    rng = np.random.default_rng(int(t) * 7 + 1)
    blk = TYPE_INFO[t].block_size
    ks = (256, 512) if blk == 256 else ((32, 96, 288) if blk == 32 else (31, 33, 256))
    for k in ks:
        for n_rows in ROWS:
            raw, wd = random_weights(t, n_rows, k, rng)
            for n_tok in (1, 3):
                check_matmul(raw, wd, t, rng.standard_normal((n_tok, k)).astype(np.float32), path)


@pytest.mark.parametrize("n_tok", [5, 40])  # row tiles; packed panels where the path has them
def test_matmul_threads_equal_single(path, n_tok):
    rng = np.random.default_rng(5)
    raw, _ = random_weights(GGMLType.Q4_K, 257, 512, rng)
    x = rng.standard_normal((n_tok, 512)).astype(np.float32)
    a = np.zeros((n_tok, 257), np.float32)
    b = np.zeros((n_tok, 257), np.float32)
    core.matmul(a, raw, int(GGMLType.Q4_K), x)
    core.matmul(b, raw, int(GGMLType.Q4_K), x, pool=core.Pool(2))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("t", [GGMLType.F16, GGMLType.BF16, GGMLType.F32], ids=lambda t: t.name)
def test_float_weights_in_cache_blocks_give_each_token_alone(path, t):
    """More tokens than a tile takes run in blocks of (tokens, 64 rows) claimed by whichever
    thread is free (kernels.pxi _mm_blocks; K = 4096 F16: 16 tokens a block): every output is
    the bits of its token multiplied alone, on one thread or three."""
    rng = np.random.default_rng(int(t) + 3)
    k, n_rows, n_tok = 4096, 150, 37                # 3 token blocks x 3 row blocks, remainders
    raw, _ = random_weights(t, n_rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    alone = np.stack([core.matmul(np.zeros((1, n_rows), np.float32), raw, int(t), x[i:i + 1])[0]
                      for i in range(n_tok)])
    for pool in (None, core.Pool(3)):
        got = np.zeros((n_tok, n_rows), np.float32)
        core.matmul(got, raw, int(t), x, pool=pool)
        assert np.array_equal(got, alone)


def test_f16_activations_round_as_the_scalar_code(path):
    """The x86 paths round activations to F16 with F16C: the bits of the scalar code (numpy's
    float16, round to nearest even) for ties, subnormals, overflow and infinities; a NaN
    becomes the one quiet NaN 0x7e00 (keeping its sign) as there."""
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((2, 1027)) * np.logspace(-9, 5, 1027)).astype(np.float32)
    ties = (np.arange(1, 65, dtype=np.float32) + 0.5) * np.float32(2.0 ** -14) / 1024  # halfway
    x[0, :64] = ties
    x[0, 64:72] = [65504, 65519.996, 65520, -65520, np.inf, -np.inf, 6e-8, -3e-8]
    x[1, 5], x[1, 1000], x[1, 1026] = np.nan, -np.nan, np.nan
    got = core.quantize_act(x, int(GGMLType.F16)).view(np.uint16).reshape(2, -1)
    with np.errstate(over="ignore"):             # 65520 and above: inf, as the kernels
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert set(got[nan].tolist()) == {0x7e00, 0xfe00} and (got[nan] & 0x7fff == 0x7e00).all()


def test_quantize_act_matches_reference():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[1, :256] = 0  # an all-zero block
    x[2, :32] = np.arange(32, dtype=np.float32) - 15.5  # halves: amax 127 makes the multiplier 1
    x[2, 0] = 127
    assert np.array_equal(core.quantize_act(x, int(GGMLType.Q8_0)), q8_act_llama_x86(x))
    assert np.array_equal(core.quantize_act(x, int(GGMLType.Q4_1)), q8_act_llama_x86(x, with_sum=True))
    ours = core.quantize_act(x, int(GGMLType.Q4_K)).reshape(-1, 292)
    ref = quants.quantize_q8_K(x).reshape(-1, 292)
    assert np.array_equal(ours[:, :260], ref[:, :260])
    assert np.array_equal(ours[:, 260:], ref[:, 260:])


def test_bad_arguments_raise_before_nogil():
    x = np.zeros((1, 33), np.float32)
    with pytest.raises(ValueError, match="block size"):
        core.matmul(np.zeros((1, 1), np.float32), np.zeros(18, np.uint8), int(GGMLType.Q4_0), x)
    with pytest.raises(ValueError, match="expected 36 bytes"):
        core.matmul(np.zeros((1, 2), np.float32), np.zeros(18, np.uint8), int(GGMLType.Q4_0), np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="no kernel"):
        core.matmul(np.zeros((1, 1), np.float32), np.zeros(66, np.uint8), int(GGMLType.IQ2_XXS), np.zeros((1, 256), np.float32))


def _run(env_value):
    env = dict(os.environ, EDGED_KERNELS=env_value)
    code = "import edged._core as c; print(c.kernel_path())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_env_forces_each_supported_path():
    for p in PATHS:
        r = _run(p)
        assert r.returncode == 0 and r.stdout.strip() == p, r.stderr


def test_env_unsupported_or_unknown_path_is_an_error():
    unsupported = [p for p in core.PATHS if p not in PATHS]
    for bad in unsupported + ["sse9"]:
        r = _run(bad)
        assert r.returncode != 0
        assert "EDGED_KERNELS" in r.stderr and bad in r.stderr


def test_variant_names_select_the_table_without_the_feature():
    """"avx2-vnni" runs the plain AVX2 table on any AVX2 CPU (VNNI or not); the family name
    runs the best table of the family this CPU has; `edged info`'s path stays the family."""
    old = core.kernel_path()
    try:
        for v in VARIANTS:
            family, feature = v.split("-")
            assert core.set_path(v) == family and core.kernel_variant() == family
            core.set_path(family)
            best = core.kernel_variant()
            assert best in (family, f"{family}+{feature}")
            cpu_name = {"avx2-vnni": "avxvnni", "avx512-vnni": "avx512vnni", "neon-dotprod": "dotprod"}[v]
            assert (best != family) == (cpu_name in core.cpu_features())
        for bad in ("avx2-sse9", "avx2+vnni+x", "-vnni"):
            with pytest.raises(Exception, match="EDGED_KERNELS"):
                core.set_path(bad)
    finally:
        core.set_path(old)
    for v in VARIANTS:
        r = subprocess.run([sys.executable, "-c", "import edged._core as c; print(c.kernel_path(), c.kernel_variant())"],
                           env=dict(os.environ, EDGED_KERNELS=v), capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.split() == [v.split("-")[0]] * 2, r.stderr


def test_default_is_best_supported():
    r = _run("")
    assert r.stdout.strip() == PATHS[-1]


def test_aligned_empty_is_64_byte_aligned():
    for shape in [(1,), (3, 5), (7, 33)]:
        a = core.aligned_empty(shape, np.float32)
        assert a.ctypes.data % 64 == 0 and a.shape == shape
