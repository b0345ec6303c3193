"""Packed 16-row panels (cython_kernels/kernels/ed_gemm.h), the prompt-batch matrix product: every
packable type against the NumPy reference on odd shapes (partial panels, token counts that
leave every tile remainder), forced on for any batch size; and a whole model's logits with the
panels on and off."""
import numpy as np
import pytest

from conftest import testdata
from edged.format import quants
from edged.format.gguf import TYPE_INFO
from matmul_reference import check_matmul, random_weights

core = pytest.importorskip("edged._core")

PACKED = list(quants.BLOCK_TYPES)  # every quantized weight type
# the x86 paths, and each as a CPU without (AVX-)VNNI runs it: there the u8 x s8 pairs sum in
# i16, and the wide types (u = weight + 128 spans 0..255: Q8_0, IQ4_NL, IQ4_XS) split u in nibbles
PANEL_PATHS = [p for p in core.available_paths() if p in ("avx2", "avx512")]
PANEL_PATHS += [p + "-vnni" for p in PANEL_PATHS]


@pytest.fixture(params=PANEL_PATHS or [None])
def panels(request):
    if request.param is None:
        pytest.skip("no path with packed panels on this CPU (AVX2 or AVX-512)")
    old_path, old_min = core.kernel_path(), core.gemm_min_cols(1)
    core.set_path(request.param)
    yield request.param
    core.set_path(old_path)
    core.gemm_min_cols(old_min)


def test_panel_types(panels):
    # every x86 table packs every quantized type, with or without VNNI
    assert sorted(core.gemm_types()) == sorted(int(t) for t in PACKED)
    core.set_path("generic")
    assert core.gemm_types() == []


@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
def test_panels_match_reference(panels, t):
    if int(t) not in core.gemm_types():
        pytest.skip(f"{t.name} keeps the row tiles on {panels}")
    rng = np.random.default_rng(int(t) * 13 + 3)
    ks = (256, 768) if TYPE_INFO[t].block_size == 256 else (32, 96, 288)
    for k in ks:
        for n_rows in (1, 15, 16, 17, 33, 257):
            raw, wd = random_weights(t, n_rows, k, rng)
            for n_tok in (1, 5, 6, 7, 13):
                x = rng.standard_normal((n_tok, k)).astype(np.float32)
                x[0, :32] *= 40.0  # a block with large activations
                check_matmul(raw, wd, t, x, panels)


@pytest.mark.parametrize("name", ["synthetic-llama-Q4_K_M", "synthetic-qwen2-Q8_0", "synthetic-llama-Q4_0",
                                  "synthetic-phi3-Q4_K_M", "synthetic-llama-Q2_K"])
def test_prompt_batch_panels_match_llama_cpp(panels, name):
    """A 65-token batch through the panels: llama.cpp's logits within the golden tolerance
    (random-weight models amplify rounding, so the panels and the row tiles are each compared
    with llama.cpp, not with each other), and the same top-1 where llama.cpp's is clear."""
    from edged import Model
    g = np.load(testdata("golden", f"{name}.golden.npz"))
    toks = [int(t) for t in g["tokens"]]
    m = Model.load(testdata("models", f"{name}.gguf"), n_threads=2)
    core.gemm_min_cols(8)
    on = m.session(n_ctx=128).eval(toks, logits="all")
    core.gemm_min_cols(10**6)
    off = m.session(n_ctx=128).eval(toks, logits="all")
    ref = g["logits"]
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.6
    for x in (on, off):
        d = np.abs(x - ref)
        assert d.max() <= 0.35 and d.mean() <= 0.06, (float(d.max()), float(d.mean()))
        assert np.array_equal(x.argmax(1)[clear], ref.argmax(1)[clear])
    m.close()
