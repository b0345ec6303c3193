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
them (the others depend on weight kernels whose float summation order differs from llama.cpp's).

The quantized weight kernels sum in edged's canonical order (docs/kernels.md), the same on every
path and for every batch shape, which is not the order of llama.cpp's x86 kernels (lane partials
and a horizontal sum at the end): the files whose kernels used to mirror llama.cpp bit for bit
(CANONICAL below) now differ from it by a last-bit rounding per product that the Q8 activation
rounding of the next layer amplifies (~0.1 after a few positions, as before the mirror), within
the golden tolerances (test_engine_golden.py), and give the same bits on every path.
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
    "synthetic-gemma3-Q8_0": (0.15, 0.006),      # canonical order 0.0925/0.00368 (mirror 0.0172/0.00011)
    "synthetic-llama-Q3_K_M": (0.25, 0.025),     # canonical order 0.1764/0.0160 (0.1009/0.0014 -> 0.2158/0.0373)
}
# files whose kernels summed like llama.cpp's x86 build until the canonical order (0.0000
# then): (max, mean) with the canonical order, measured 2026-12-01 (the same on every path)
# with about 1.5x margin
CANONICAL = {
    "synthetic-llama-Q8_0": (0.17, 0.025),       # 0.1098/0.0165
    "synthetic-llama-Q5_0": (0.26, 0.027),       # 0.1721/0.0178
    "synthetic-llama-Q4_1": (0.24, 0.027),       # 0.1570/0.0175
    "synthetic-llama-Q5_1": (0.22, 0.028),       # 0.1408/0.0187
    "synthetic-qwen2-Q8_0": (0.18, 0.022),       # 0.1161/0.0141
    "synthetic-phi3-Q8_0": (0.21, 0.015),        # 0.1386/0.0094
    "synthetic-gemma3-Q8_0": (0.15, 0.006),      # 0.0925/0.0037
}
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


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_canonical_order_same_bits_on_every_path(core, name):
    """Within the measured distance of llama.cpp, and the same logits on every kernel path."""
    first = None
    for path in core.available_paths() + [v for v in core.VARIANTS if v.split("-")[0] in core.available_paths()]:
        core.set_path(path)
        got, ref = teacher_forced(name, "cpu")
        check(np.abs(got - ref), name, path, *CANONICAL[name])
        if first is None:
            first = (path, got)
        assert got.tobytes() == first[1].tobytes(), f"{name}: {path} differs from {first[0]}"


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_backend_rounds_like_llama_cpp(name):
    check(golden_diff(name, "reference"), name, "reference", *REFERENCE[name])


def test_first_position_differs_only_in_the_last_bits(core):
    """The first position (no earlier position's rounding carried through the attention) is
    llama.cpp's up to the last bits of each product sum: the canonical order rounds each block
    where llama.cpp rounds lane partials, nothing else differs."""
    d = golden_diff("synthetic-llama-Q8_0", "cpu")
    assert d[0].max() < 1e-5, np.round(d.max(1), 4)
