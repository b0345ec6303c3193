"""`edged quantize --imatrix` for every type llama-quantize quantizes importance-weighted
(Q4_0..Q5_1, Q2_K..Q6_K and their _S/_M/_L mixes; Q8_0 ignores the matrix) against llama.cpp:
tests/data/imatrix/llama-quantize-weighted-sha256.json holds the type and sha256 of every tensor
llama-quantize (0.3.36) wrote, with and without tests/data/imatrix/llama256.imatrix.gguf, for
four F16 models (tools/make_imatrix_refs.py, which also made the file: llama256, the same
shape with 8 layers, an 8-layer phi3 with fused attn_qkv, and the qwen3moe golden shape whose
16 experts each get their slice of tests/data/imatrix/qwen3moe.imatrix.gguf). edged must write the same bytes
and choose the same type per tensor (incl. llama.cpp's imatrix-only guard on the first ffn_down
layers of Q4_0/Q5_0, and fused attn_qkv ruled like attn_v)."""
import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("gguf")  # tools/make_goldens.py writes the F16 models with it

from conftest import ROOT  # noqa: E402
from edged.errors import ConfigError  # noqa: E402
from edged.format import quants  # noqa: E402
from edged.format.gguf import GGMLType, GGUFFile  # noqa: E402
from edged.format.imatrix import read_imatrix  # noqa: E402
from edged.format.quantize import choose_types, parse_mix, quantize_file  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "imatrix")
IMATRIX = os.path.join(DATA, "llama256.imatrix.gguf")
RUNS = json.load(open(os.path.join(DATA, "llama-quantize-weighted-sha256.json")))["runs"]


def _refs():
    spec = importlib.util.spec_from_file_location("make_imatrix_refs", os.path.join(ROOT, "tools", "make_imatrix_refs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def f16(tmp_path_factory):
    """model name -> path of its F16 file (as tools/make_imatrix_refs.py writes it)"""
    refs = _refs()
    mg = refs._make_goldens()
    d = tmp_path_factory.mktemp("imatrix-weighted")
    out = {}
    for name, (case, seed) in refs.models(mg).items():
        out[name] = str(d / f"{name}.gguf")
        mg.write_gguf(name, case, out[name], seed=seed)
    return out


def _check(path, ref):
    got = GGUFFile.open(path)
    assert sorted(got.tensors) == sorted(ref)
    bad = []
    for name, (tname, sha) in ref.items():
        t = got.tensors[name].type.name
        if t != tname or hashlib.sha256(np.asarray(got.tensor_bytes(name)).tobytes()).hexdigest() != sha:
            bad.append((name, t, tname))
    assert not bad, bad


@pytest.mark.parametrize("run", sorted(RUNS))
def test_same_bytes_as_llama_quantize(run, f16, tmp_path):
    pytest.importorskip("edged._core")
    model, mix, how = run.split()
    out = str(tmp_path / "out.gguf")
    quantize_file(f16[model], out, mix, imatrix=_refs().imatrix_for(model) if how == "imatrix" else None)
    _check(out, RUNS[run])


@pytest.mark.parametrize("run", [r for r in sorted(RUNS) if r.split()[0] != "llama256"])
def test_types_as_llama_quantize(run, f16):
    """the per-tensor choice alone (no compiled core needed): the Q4_0/Q5_0 ffn_down guard with
    an imatrix, fused attn_qkv like attn_v in the _M/_L mixes"""
    model, mix, how = run.split()
    with GGUFFile.open(f16[model]) as f:
        types = choose_types(f, parse_mix(mix), has_imatrix=how == "imatrix")
    assert {n: t.name for n, t in types.items()} == {n: t for n, (t, _) in RUNS[run].items()}


def test_the_runs_use_the_matrix():
    """the references differ where they should: weighted tensors change with the matrix, Q8_0
    (which ignores it) and tensors without an entry do not"""
    for mix in ("Q3_K_M", "Q4_K_M", "Q5_K_M"):
        plain, weighted = RUNS[f"phi3-256x8 {mix} plain"], RUNS[f"phi3-256x8 {mix} imatrix"]
        assert plain["blk.0.ffn_down.weight"] != weighted["blk.0.ffn_down.weight"]  # has an entry
        assert plain["blk.0.attn_qkv.weight"] == weighted["blk.0.attn_qkv.weight"]  # has none
    assert RUNS["llama256x8 Q4_0 imatrix"]["blk.0.ffn_down.weight"][0] == "Q4_1"
    assert RUNS["llama256x8 Q4_0 imatrix"]["blk.1.ffn_down.weight"][0] == "Q4_0"


def test_compiled_weighted_iq4_equals_the_numpy_one(f16):
    core = pytest.importorskip("edged._core")
    im = read_imatrix(IMATRIX)
    f = GGUFFile.open(f16["llama256"])
    x = np.array(f.tensor_bytes("blk.0.ffn_up.weight")).view(np.float16).astype(np.float32).reshape(-1, 256)
    w = im.entries["blk.0.ffn_up.weight"]
    for t in (GGMLType.IQ4_NL, GGMLType.IQ4_XS):
        assert np.array_equal(core.quantize_rows(x, int(t), None, w), quants.quantize(x, t, w)), t.name


def test_without_the_core_a_kquant_imatrix_is_refused_by_name(f16, tmp_path):
    with pytest.raises(ConfigError, match=r"Q4_K.*importance.*compiled"):
        quantize_file(f16["llama256"], str(tmp_path / "o.gguf"), "Q4_K_M", imatrix=IMATRIX, compiled=False)
    assert not os.listdir(tmp_path)  # nothing half-written


def test_q2_k_s_needs_the_matrix(f16, tmp_path):
    """llama-quantize refuses a Q2_K_S file whose Q2_K tensors lack an importance matrix entry
    ("Missing importance matrix for tensor blk.1.attn_k.weight" on llama256x8 with the matrix
    of blk.0 only; "this quantization requires an imatrix!" without one)."""
    with pytest.raises(ConfigError, match=r"'blk\.1\.attn_k\.weight' would be Q2_K in a Q2_K_S file"):
        quantize_file(f16["llama256x8"], str(tmp_path / "o.gguf"), "Q2_K_S", imatrix=IMATRIX)
    with pytest.raises(ConfigError, match=r"'blk\.0\.attn_k\.weight' would be Q2_K in a Q2_K_S file"):
        quantize_file(f16["llama256"], str(tmp_path / "o.gguf"), "Q2_K_S")
    assert not os.listdir(tmp_path)


def test_bad_importance_row_is_refused():
    core = pytest.importorskip("edged._core")
    x = np.zeros((2, 256), np.float32)
    with pytest.raises(ValueError, match="importance row has 32 values"):
        core.quantize_rows(x, int(GGMLType.Q4_K), None, np.ones(32, np.float32))
