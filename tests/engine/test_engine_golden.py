"""Teacher-forced parity with llama.cpp's recorded logits (../shared/testdata/golden), with the
tolerances of testdata/README.md, for every golden model, on the compiled backend's fastest
path, its generic C path, and the NumPy reference backend."""
import os

import numpy as np
import pytest

from conftest import TESTDATA, testdata
from golden_logits import teacher_forced
from kernel_paths import kernels  # noqa: F401  (fixture: best and generic paths)

GOLDEN = sorted(f[:-len(".golden.npz")] for f in os.listdir(os.path.join(TESTDATA, "golden"))
                if f.endswith(".golden.npz")) if os.path.isdir(os.path.join(TESTDATA, "golden")) else []
# the reference backend is slow (float64 NumPy): one file per architecture and weight family
REFERENCE_SUBSET = ["stories260K", "synthetic-llama-Q4_K_M", "synthetic-llama-BF16",
                    "synthetic-qwen2-Q8_0", "synthetic-qwen3-Q4_K_M", "synthetic-phi3-Q8_0",
                    "synthetic-gemma3-f32"]


def limits(name):
    if any(x in name for x in ("-f32", "-F16", "stories260K")):
        return 0.05, 0.01
    if "-BF16" in name:
        return 0.10, 0.02
    return 0.35, 0.06


def run_golden(name, backend):
    got, ref = teacher_forced(name, backend)
    d = np.abs(got - ref)
    lim_max, lim_mean = limits(name)
    top = np.sort(ref, 1)
    decided = top[:, -1] - top[:, -2] > 0.6
    misses = int((decided & (got.argmax(1) != ref.argmax(1))).sum())
    assert d.max() <= lim_max and d.mean() <= lim_mean and misses == 0, \
        f"{name}/{backend}: max {d.max():.4f} mean {d.mean():.5f} top-1 misses {misses}"
    return d


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_compiled(name, kernels):
    run_golden(name, "cpu")


@pytest.mark.parametrize("name", [n for n in REFERENCE_SUBSET if n in GOLDEN])
def test_golden_reference(name):
    run_golden(name, "reference")


def test_compiled_path_is_close_to_reference():
    """The compiled pass mirrors llama.cpp's activation quantization; on F32 weights it must be
    nearly identical to the reference pass."""
    pytest.importorskip("edged._core")
    from edged import Model
    z = np.load(testdata("golden", "synthetic-qwen2-f32.golden.npz"))
    toks = z["tokens"].tolist()[:20]
    out = {}
    for be in ("cpu", "reference"):
        m = Model.load(testdata("models", "synthetic-qwen2-f32.gguf"), backend=be)
        out[be] = m.session(64).eval(toks, logits="all")
        m.close()
    assert np.abs(out["cpu"] - out["reference"]).max() < 0.01
