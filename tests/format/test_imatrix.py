"""`edged quantize --imatrix` against llama.cpp: tests/data/imatrix holds the importance matrices
llama-imatrix (0.3.36) computed for tools/make_goldens.py's llama256 F16 model over
calibration.txt, in both of its formats (GGUF and legacy .dat), and the sha256 of every tensor
llama-quantize --imatrix wrote from them (IQ4_NL, IQ4_XS). edged must write the same bytes."""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("gguf")  # tools/make_goldens.py writes the F16 model with it

from conftest import ROOT  # noqa: E402
from edged.errors import ConfigError, ModelFormatError  # noqa: E402
from edged.format import quants  # noqa: E402
from edged.format.gguf import GGMLType, GGUFFile, Key  # noqa: E402
from edged.format.imatrix import read_imatrix  # noqa: E402
from edged.format.quantize import quantize_file  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "imatrix")
REF = json.load(open(os.path.join(DATA, "llama-quantize-sha256.json")))["tensors"]


@pytest.fixture(scope="module")
def f16(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("make_goldens", os.path.join(ROOT, "tools", "make_goldens.py"))
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    path = str(tmp_path_factory.mktemp("imatrix") / "llama256-f16.gguf")
    mg.write_gguf("llama256", mg.CASES["llama256"], path, seed=1000 + list(mg.CASES).index("llama256"))
    return path


def imatrix_path(fmt):
    return os.path.join(DATA, f"llama256.imatrix.{fmt}")


def test_both_formats_read_alike():
    g, d = read_imatrix(imatrix_path("gguf")), read_imatrix(imatrix_path("dat"))
    assert sorted(g.entries) == sorted(d.entries) and len(g.entries) == 7
    assert g.datasets == d.datasets == ["text.txt"] and g.chunk_count == d.chunk_count == 38
    for name, w in g.entries.items():
        assert w.shape == (256,) and w.dtype == np.float32 and np.all(w > 0), name
        np.testing.assert_allclose(d.entries[name], w, rtol=1e-6)


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
@pytest.mark.parametrize("mix", ["IQ4_NL", "IQ4_XS"])
def test_quantize_with_imatrix_equals_llama_quantize(mix, fmt, f16, tmp_path):
    out = str(tmp_path / "out.gguf")
    quantize_file(f16, out, mix, imatrix=imatrix_path(fmt))
    got = GGUFFile.open(out)
    ref = REF[f"{mix} {fmt}"]
    assert list(got.tensors) == list(ref)
    for name, (tname, sha) in ref.items():
        assert got.tensors[name].type.name == tname, name
        assert hashlib.sha256(np.asarray(got.tensor_bytes(name)).tobytes()).hexdigest() == sha, name
    assert got.metadata[Key.QUANTIZE_IMATRIX_N_ENTRIES] == 7
    assert got.metadata[Key.QUANTIZE_IMATRIX_DATASET] == "text.txt"
    assert got.metadata[Key.QUANTIZE_IMATRIX_N_CHUNKS] == 38


@pytest.mark.parametrize("t", [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                               GGMLType.Q5_1, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
                               GGMLType.Q6_K], ids=lambda t: t.name)
def test_imatrix_lowers_the_weighted_error(t, f16):
    """What an importance matrix is for: a smaller error weighted by the activations' energy
    (the IQ4 types with the NumPy quantizers, the others with the compiled ones)."""
    if t in quants.WEIGHTED:
        quantize = quants.quantize
    else:
        core = pytest.importorskip("edged._core")

        def quantize(x, t, qw):
            return core.quantize_rows(x, int(t), None, qw)
    im = read_imatrix(imatrix_path("gguf"))
    f = GGUFFile.open(f16)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
        ti = f.tensors[name]
        x = np.array(f.tensor_bytes(name)).view(np.float16).astype(np.float32).reshape(-1, ti.shape[0])
        w = im.entries[name]
        err = {}
        for key, qw in (("with", w), ("without", None)):
            y = quants.dequantize(quantize(x, t, qw), t, x.shape)
            err[key] = float((w * (y - x) ** 2).sum())
        assert err["with"] < err["without"] * 0.99, (name, err)


def test_bad_imatrix_files(f16, tmp_path):
    with pytest.raises(ModelFormatError, match="not an importance matrix"):
        read_imatrix(f16)
    raw = open(imatrix_path("dat"), "rb").read()
    cut = tmp_path / "cut.dat"
    cut.write_bytes(raw[:100])
    with pytest.raises(ModelFormatError, match="truncated"):
        read_imatrix(str(cut))


def test_cli_imatrix(f16, tmp_path):
    out = tmp_path / "m.gguf"
    r = subprocess.run([sys.executable, "-m", "edged", "quantize", f16, str(out), "IQ4_XS", "--imatrix",
                        imatrix_path("dat")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = GGUFFile.open(str(out))
    sha = hashlib.sha256(np.asarray(got.tensor_bytes("blk.0.ffn_up.weight")).tobytes()).hexdigest()
    assert sha == REF["IQ4_XS dat"]["blk.0.ffn_up.weight"][1]


def run_limited(args, timeout=60):
    """`edged ARGS` in a child held to 2 GiB of address space: a reader that does not stop at
    the file's size fails there (or at the timeout) instead of exhausting the machine."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    return subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit)


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "dir"])
@pytest.mark.parametrize("role", ["imatrix", "input"])
def test_quantize_refuses_files_that_never_end(special, role, f16, tmp_path):
    """Issue 41.14: `--imatrix /dev/zero` read until memory ran out and a FIFO hung the open.
    Now anything but a regular file is refused at once, as the model to quantize is."""
    path = {"fifo": str(tmp_path / "fifo"), "dir": str(tmp_path), "/dev/zero": "/dev/zero"}[special]
    if special == "fifo":
        os.mkfifo(path)
    out = str(tmp_path / "out.gguf")
    args = ["quantize", f16, out, "Q4_0", "--imatrix", path] if role == "imatrix" else \
        ["quantize", path, out, "Q4_0"]
    r = run_limited(args)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    kind = {"fifo": "a FIFO", "/dev/zero": "a character device", "dir": "a directory"}[special]
    assert f"{path}: is {kind}, not a regular file" in r.stderr
    assert not os.path.exists(out)


def test_legacy_imatrix_is_read_within_its_size(tmp_path):
    """A legacy header that claims more than the file holds is refused without reading on."""
    raw = open(imatrix_path("dat"), "rb").read()
    name_len = int.from_bytes(raw[4:8], "little")
    at = 8 + name_len + 4                         # entry 0's value count
    bad = raw[:at] + (2**31 - 1).to_bytes(4, "little") + raw[at + 4:]
    path = tmp_path / "big.dat"
    path.write_bytes(bad)
    with pytest.raises(ModelFormatError, match="truncated importance matrix"):
        read_imatrix(str(path))
    path.write_bytes(b"\0\0")
    with pytest.raises(ModelFormatError, match="too short"):
        read_imatrix(str(path))
