"""Parity with llama.cpp tighter than testdata/README.md's tolerances, where edged mirrors it.

llama.cpp (the golden files' CPU build, flash attention off) rounds the query and the softmax
row to F16 around its F16 KV cache, sums in fixed SIMD orders, uses its own vector expf and a
F16 GELU table; cython_kernels/kernels/ed_parity.h reproduces that bit for bit on every kernel path.
Its x86 build also quantizes Q8_0/Q8_1 activations with 127 / amax and halves to even
(ed_types.h and the SIMD quantizers do the same).
Before it did, every position after the first was off by ~0.1 on quantized files (the Q8
activation rounding amplifies the last float differences) and the float files sat at the
README's float64-reference level. The limits below are the measured values (2026-11-30) with
about 2x margin, each below what the engine reached before; they apply to the files that reach
them (the others still depend on weight kernels whose float summation order differs from
llama.cpp's, e.g. its repacked Q4_0/Q4_K/Q2_K kernels and the generic C path).
"""
import numpy as np
import pytest

from golden_logits import teacher_forced

# (max, mean) abs logit difference on every kernel path (the attention and activation
# mirror does not depend on the path). Measured max/mean after -> before the mirror:
ALL_PATHS = {
    "stories260K": (0.02, 0.0011),               # 0.0126/0.00081 -> 0.0305/0.0014
    "synthetic-llama-f32": (0.003, 0.00012),     # 0.0014/0.000057 -> 0.0019/0.00025
    "synthetic-qwen2-f32": (0.003, 0.00014),     # 0.0011/0.000070 -> 0.0022/0.00027
    "synthetic-qwen3-f32": (0.0006, 0.00003),    # 0.0002/0.000015 -> 0.0004/0.00006
    "synthetic-gemma3-f32": (0.003, 0.00025),    # 0.0018/0.00012 -> 0.0031/0.00049
    "synthetic-llama-BF16": (0.05, 0.0045),      # 0.0296/0.0031 -> 0.0404/0.0073
    "synthetic-gemma3-Q8_0": (0.04, 0.0005),     # 0.0172/0.00011 -> 0.1405/0.0234
    "synthetic-llama-Q3_K_M": (0.2, 0.004),      # 0.1009/0.0014 -> 0.2158/0.0373
}
# identical to llama.cpp (up to float noise in the last bits) on the x86 SIMD paths, whose
# Q8_0/Q4_1/Q5_0/Q5_1 kernels sum like llama.cpp's, with the Q8_0/Q8_1 activations quantized
# like its x86 build (127 / amax, halves to even): 0.0000 -> 0.11-0.19 before
SIMD_EXACT = ["synthetic-llama-Q8_0", "synthetic-llama-Q5_0", "synthetic-llama-Q4_1",
              "synthetic-llama-Q5_1", "synthetic-qwen2-Q8_0", "synthetic-phi3-Q8_0",
              "synthetic-gemma3-Q8_0"]
# the reference backend (float64, no activation quantization) with the F16 roundings
REFERENCE = {
    "stories260K": (0.012, 0.0007),              # 0.0052/0.00034 -> 0.0308/0.00168
    "synthetic-llama-f32": (0.002, 0.0001),      # 0.0007/0.00004 -> 0.0029/0.00032
    "synthetic-qwen2-f32": (0.003, 0.00015),     # 0.0011/0.00007 -> 0.0032/0.00033
    "synthetic-gemma3-f32": (0.003, 0.0003),     # 0.0018/0.00018 -> 0.0031/0.00052
}


def golden_diff(name, backend):
    """|edged - llama.cpp| logits, teacher-forced like the golden check (prompt as one batch)."""
    got, ref = teacher_forced(name, backend)
    return np.abs(got - ref)


@pytest.fixture
def core():
    core = pytest.importorskip("edged._core")
    before = core.kernel_path()
    yield core
    core.set_path(before)


def check(d, name, label, lim_max, lim_mean):
    assert d.max() <= lim_max and d.mean() <= lim_mean, \
        f"{name} ({label}): max {d.max():.5f} (<= {lim_max}) mean {d.mean():.6f} (<= {lim_mean})"


@pytest.mark.parametrize("path", ["best", "generic"])
@pytest.mark.parametrize("name", sorted(ALL_PATHS))
def test_tight_parity_every_path(core, name, path):
    core.set_path(None if path == "best" else path)
    check(golden_diff(name, "cpu"), name, core.kernel_path(), *ALL_PATHS[name])


@pytest.mark.parametrize("path", ["avx2", "avx512"])
@pytest.mark.parametrize("name", SIMD_EXACT)
def test_identical_on_x86_simd_paths(core, name, path):
    if path not in core.available_paths():
        pytest.skip(f"{path} not supported on this CPU")
    core.set_path(path)
    check(golden_diff(name, "cpu"), name, path, 1e-4, 1e-5)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_backend_rounds_like_llama_cpp(name):
    check(golden_diff(name, "reference"), name, "reference", *REFERENCE[name])


def test_first_decode_positions_are_bit_identical(core):
    """On a file whose kernels match, prompt rows and decoded rows alike are llama.cpp's
    own numbers: the attention mirror covers both llama.cpp paths (tinyBLAS for the prompt
    batch, ggml_vec_dot_f16 for one token)."""
    paths = [p for p in ("avx512", "avx2") if p in core.available_paths()]
    if not paths:
        pytest.skip("no x86 SIMD path on this CPU")
    core.set_path(paths[0])
    d = golden_diff("synthetic-llama-Q8_0", "cpu")
    assert (d[:20].max(1) < 1e-5).all(), np.round(d.max(1), 4)
