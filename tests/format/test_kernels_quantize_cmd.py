"""`edged quantize` against llama-quantize's own output: the synthetic-llama-<TYPE>.gguf fixtures
were made by llama.cpp from synthetic-llama-f32.gguf, so every tensor's type and bytes and the
metadata must come out the same; the file must read back with the PyPI gguf reader."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import testdata
from edged.format.gguf import GGUFFile, GGUFWriter, GGMLType, Key, ValueType

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIXES = ["Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
         "F16", "BF16"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("mix", MIXES)
def test_quantize_equals_llama_quantize(mix, compiled, tmp_path):
    src = testdata("models", "synthetic-llama-f32.gguf")
    ref = GGUFFile.open(testdata("models", f"synthetic-llama-{mix}.gguf"))
    out = tmp_path / "out.gguf"
    from edged.format.quantize import quantize_file
    quantize_file(src, str(out), mix, compiled=compiled)
    got = GGUFFile.open(str(out))
    assert list(got.tensors) == list(ref.tensors)
    for name, ti in ref.tensors.items():
        assert got.tensors[name].type == ti.type, name
        assert got.tensors[name].shape == ti.shape, name
        assert np.array_equal(got.tensor_bytes(name), ref.tensor_bytes(name)), name
    for k, v in ref.metadata.items():
        assert k in got.metadata and str(got.metadata[k]) == str(v), k
    assert got.file_size == ref.file_size


def test_cli_quantize_summary_and_pypi_reader(tmp_path):
    gguf = pytest.importorskip("gguf")
    src = testdata("models", "synthetic-llama-f32.gguf")
    out = tmp_path / "m.gguf"
    r = run_cli("quantize", src, str(out), "q4_k")
    assert r.returncode == 0, r.stderr
    assert "MOSTLY_Q4_K_M" in r.stderr and "quantized " in r.stderr   # the bar is for terminals only
    rd = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in rd.tensors}
    assert types["output.weight"] == "Q6_K" and types["blk.0.attn_q.weight"] == "Q4_K"
    assert int(rd.fields["general.file_type"].parts[-1][0]) == 15
    assert not list(tmp_path.glob(".edged-quantize-*"))  # no temp file left


def test_cli_bad_type_and_missing_input(tmp_path):
    r = run_cli("quantize", "nope.gguf", str(tmp_path / "o.gguf"), "Q7_X")
    assert r.returncode == 2 and "Q7_X" in r.stderr
    r = run_cli("quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "o.gguf"), "Q8_0")
    assert r.returncode != 0 and not (tmp_path / "o.gguf").exists()


def test_writer_roundtrip_with_pypi_reader(tmp_path):
    gguf = pytest.importorskip("gguf")
    w = GGUFWriter()
    w.add(Key.ARCHITECTURE, "llama")
    w.add("test.i32", -5, ValueType.INT32)
    w.add("test.f32", 0.5)
    w.add("test.bool", True)
    w.add("test.arr", np.arange(4, dtype=np.int32))
    w.add("test.strs", ["a", "bc", ""])
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("a.weight", (32, 2), GGMLType.F32)
    w.add_tensor("b.weight", (3,), GGMLType.F32)
    p = tmp_path / "w.gguf"
    with open(p, "wb") as f:
        w.write_header(f)
        with pytest.raises(ValueError, match="out of order"):
            w.write_tensor(f, "b.weight", np.zeros(3, np.float32))
        w.write_tensor(f, "a.weight", x)
        w.write_tensor(f, "b.weight", np.ones(3, np.float32))
    ours = GGUFFile.open(str(p))
    assert ours.metadata["test.i32"] == -5 and ours.metadata["test.strs"] == ["a", "bc", ""]
    assert np.array_equal(np.array(ours.tensor_bytes("a.weight")).view(np.float32), x.ravel())
    rd = gguf.GGUFReader(str(p))
    assert [t.name for t in rd.tensors] == ["a.weight", "b.weight"]
    assert np.array_equal(rd.tensors[1].data, np.ones(3, np.float32))


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                               GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K,
                               GGMLType.Q5_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_compiled_quantizer_equals_numpy_reference(t):
    core = pytest.importorskip("edged._core")
    from edged.format import quants
    rng = np.random.default_rng(int(t))
    for rows in (1, 31, 33):
        x = (rng.standard_normal((rows, 512)) * rng.choice([1e-3, 1.0, 50.0], (rows, 1))).astype(np.float32)
        x[0, :256] = 0                       # an all-zero block
        if rows > 1:
            x[1, 256:] = np.float32(1e-20)   # a block below GROUP_MAX_EPS
            x[-1, :32] = 7.0                 # a flat block
        ours = core.quantize_rows(x, int(t), core.Pool(2))
        assert np.array_equal(ours, quants.quantize(x, t)), (t.name, rows)


@pytest.mark.parametrize("mix", ["Q8_0", "Q4_K_M"])
def test_quantized_stories_loads_and_tracks_f32(mix, tmp_path):
    """stories260K (n_embd 64: no K-quant block fits, so llama.cpp's fallbacks apply) quantized
    by edged loads in edged and keeps the F32 model's greedy choices on the golden tokens."""
    from edged import Model
    from edged.format.quantize import quantize_file
    src = testdata("models", "stories260K.gguf")
    out = tmp_path / f"stories-{mix}.gguf"
    types = quantize_file(src, str(out), mix)
    if mix == "Q4_K_M":
        assert types["blk.0.attn_q.weight"] == GGMLType.Q5_0      # Q4_K -> Q5_0 fallback
        assert types["blk.0.ffn_down.weight"] == GGMLType.F16    # rows of n_ff 172 fit no block
        assert types["output.weight"] == GGMLType.Q8_0           # n_embd 64: not Q6_K
    g = np.load(testdata("golden", "stories260K.golden.npz"))
    ids = [int(t) for t in g["tokens"][:24]]
    logits = {}
    for name, path in (("f32", src), ("q", str(out))):
        m = Model.load(path, n_threads=2)
        try:
            s = m.session(n_ctx=64)
            logits[name] = s.eval(ids, logits="all")
        finally:
            m.close()
    agree = np.mean(logits["f32"].argmax(1) == logits["q"].argmax(1))
    assert agree >= 0.9, agree
    assert np.abs(logits["f32"] - logits["q"]).max() < (0.5 if mix == "Q8_0" else 3.0)


@pytest.mark.parametrize("name, mix, kept", [
    ("embed-bert.gguf", "F16", ("token_types.weight", "position_embd.weight")),
    ("embed-bert.gguf", "Q8_0", ("token_types.weight", "position_embd.weight")),
    ("synthetic-lfm2.gguf", "Q8_0", ("blk.0.shortconv.conv.weight", "blk.4.shortconv.conv.weight")),
])
def test_tensors_llama_quantize_keeps_stay_at_their_type(name, mix, kept, tmp_path):
    # llama-quant.cpp's tensor_allows_quantization keeps BERT's position and token-type
    # embeddings and the short convolutions' weights (also Mamba's ssm_conv1d, gemma3n's altup,
    # laurel and per_layer_model_proj) at their type; checked byte for byte against
    # llama-quantize on a bert-base file at BF16, Q8_0 and Q4_K_M.
    from edged.format.quantize import _quantizable, quantize_file
    src = GGUFFile.open(os.path.join(ROOT, "tests", "data", "goldens", name))
    out = tmp_path / "out.gguf"
    quantize_file(src.name, str(out), mix)
    got = GGUFFile.open(str(out))
    for n in kept:
        assert got.tensors[n].type == src.tensors[n].type == GGMLType.F32, n
        assert np.array_equal(got.tensor_bytes(n), src.tensor_bytes(n)), n
    assert got.tensors["blk.0.ffn_up.weight"].type == GGMLType[mix]
    for n in ("blk.0.ssm_conv1d.weight", "blk.0.altup_proj.weight", "blk.0.laurel_l.weight",
              "per_layer_model_proj.weight", "v.patch_embd.weight", "blk.0.ffn_gate_inp.weight"):
        assert not _quantizable(n, (64, 64)), n
    assert _quantizable("blk.0.ssm_in.weight", (64, 64))
