"""The sdist is complete and installs like a user's `pip install edged-X.tar.gz` would: built
from this checkout, a wheel is built from the sdist alone (pip unpacks it in a temporary
directory, so a source the sdist lacks fails the compile), installed into a fresh venv, and its
`edged` script describes a real model with the compiled core.

Offline: the wheel is built without build isolation by this test venv's setuptools and Cython
(the `test` extra), and the fresh venv sees this venv's site-packages through a .pth file for
the runtime dependencies only (the package itself is imported from the fresh venv, checked).
It compiles the core once: a few minutes."""
import email
import glob
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

from conftest import ROOT, testdata

SOURCES = (".pyx", ".pxd", ".pxi", ".h", ".inc")


def _run(cmd, cwd, timeout=1800, env=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    for mod in ("build", "Cython", "setuptools", "wheel"):
        pytest.importorskip(mod, reason=f"could not import {mod}: install edged's test extra")
    out = tmp_path_factory.mktemp("sdist")
    _run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), ROOT], ROOT)
    (path,) = glob.glob(str(out / "edged-*.tar.gz"))
    return path


def test_sdist_holds_every_source_and_the_metadata(sdist):
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        top = names[0].split("/")[0]
        pkg_info = email.message_from_bytes(tar.extractfile(f"{top}/PKG-INFO").read())
    inside = {n.split("/", 1)[1] for n in names if "/" in n}
    wanted = {os.path.relpath(os.path.join(d, f), ROOT)
              for d, _, files in os.walk(os.path.join(ROOT, "cython_kernels"))
              for f in files if f.endswith(SOURCES)}
    assert any(w.endswith("core.pyx") for w in wanted) and any(w.endswith(".h") for w in wanted)
    assert not wanted - inside, f"sources missing from the sdist: {sorted(wanted - inside)}"
    for f in ("setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "edged/cli.py", "edged/data/stories260K.gguf",
              "systemd/edged.service", "systemd/sysusers.d/edged.conf"):
        assert f in inside, f
    assert not [n for n in inside if n.endswith((".so", ".c")) and n.startswith("cython_kernels")]
    assert pkg_info["Name"] == "edged"
    from edged import __version__
    assert pkg_info["Version"] == __version__
    assert pkg_info["Requires-Python"] == ">=3.10"
    assert pkg_info["License-Expression"] == "MIT"
    assert "Operating System :: POSIX :: Linux" in pkg_info.get_all("Classifier")
    requires = pkg_info.get_all("Requires-Dist")
    assert any(r.startswith("tomli") and "python_version < \"3.11\"" in r for r in requires), requires
    for r in requires:
        if "extra ==" not in r and not r.startswith("tomli"):
            assert "<" in r.split(";")[0], f"no upper bound: {r}"


def test_wheel_built_from_the_sdist_installs_and_runs(sdist, tmp_path):
    model = testdata("models", "stories260K.gguf")
    wheels = tmp_path / "wheels"
    # Only the sdist is given: pip unpacks and builds it in a temporary directory of its own.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(wheels), sdist], str(tmp_path), env={"EDGED_DEBUG_BUILD": ""})
    (whl,) = glob.glob(str(wheels / "edged-*.whl"))
    tag = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert whl.endswith(f"-{tag}.whl") and "-cp3" in whl, whl     # compiled, not py3-none-any
    with zipfile.ZipFile(whl) as z:
        compiled = {n.split(".")[0] for n in z.namelist() if n.startswith("edged/_") and n.endswith(".so")}
        data = set(z.namelist())
    assert {"edged/_core", "edged/_bpe", "edged/_gguf_scan"} <= compiled, compiled
    assert "edged/data/stories260K.gguf" in data                  # the demo model ships too

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], str(tmp_path))
    py = str(venv / "bin" / "python")
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], str(tmp_path)).stdout.strip()
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", whl], str(tmp_path))
    # the runtime dependencies, from this venv (appended after the fresh venv's own site-packages)
    with open(os.path.join(site, "zz-test-deps.pth"), "w") as f:
        f.write(sysconfig.get_path("purelib") + "\n")

    env = {"PYTHONPATH": ""}          # nothing of the checkout on the path
    where = _run([py, "-c", "import edged, edged._core; print(edged.__file__); print(edged._core.__file__)"],
                 str(tmp_path), env=env).stdout.split()
    assert all(p.startswith(str(venv)) for p in where), where
    r = _run([str(venv / "bin" / "edged"), "info", "-m", model, "-c", "256"], str(tmp_path), env=env)
    assert "architecture: llama" in r.stdout and "memory at n_ctx    256" in r.stdout, r.stdout
    assert "machine: kernel path" in r.stdout, r.stdout    # the compiled core is in the wheel
    r = _run([str(venv / "bin" / "edged"), "generate", "-m", model, "-p", "Once upon a time", "-n", "8"],
             str(tmp_path), env=env)
    assert r.stdout.startswith(", there was a little girl"), r.stdout
