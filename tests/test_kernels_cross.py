"""tests/c/kernels_check.c: every SIMD path against the generic C path, all 13 types, dots and
tiles; decode-batch tiles (ED_MDOT_SAME) bit for bit against the one-token path. Native build
always; an aarch64 build under qemu (NEON path) when aarch64-linux-gnu-gcc and
qemu-aarch64(-static) are installed (tools/bootstrap.sh)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "c", "kernels_check.c")
FLAGS = ["-O2", "-std=gnu11", "-pthread", "-I" + os.path.join(ROOT, "cython_kernels"), SRC, "-lm"]


def build_and_run(cc, out, runner=(), extra=()):
    r = subprocess.run([cc, *FLAGS, *extra, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=600)


def test_native_paths_match_generic(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    r = build_and_run(cc, tmp_path / "check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " ok" in r.stdout and "FAIL" not in r.stdout
    # every type has a decode-batch tile equal to its one-token path on the x86 SIMD paths
    simd = [l for l in r.stdout.splitlines() if l.split(" ", 1)[0] in ("avx2", "avx512", "avx512nv")]
    assert all(" same exact " in l for l in simd), r.stdout


def test_neon_path_matches_generic_under_qemu(tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not cc or not qemu:
        pytest.skip("aarch64-linux-gnu-gcc / qemu-aarch64 not installed")
    r = build_and_run(cc, tmp_path / "check-arm64", runner=(qemu, "-cpu", "max"), extra=("-static",))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dotprod" in r.stdout.splitlines()[0]  # the dotprod variant ran
    lines = [l for l in r.stdout.splitlines() if l.startswith("neon ")]
    assert len(lines) == 13 and all(l.endswith(" ok") for l in lines), r.stdout
    assert sum(" same exact " in l for l in lines) == 3, r.stdout  # Q4_0, Q8_0, Q6_K
    # baseline Advanced SIMD (Cortex-A72, Raspberry Pi 4: no dotprod)
    a72 = subprocess.run([qemu, "-cpu", "cortex-a72", str(tmp_path / "check-arm64")],
                         capture_output=True, text=True, timeout=600)
    assert a72.returncode == 0 and "dotprod" not in a72.stdout.splitlines()[0], a72.stdout
    assert sum(l.startswith("neon ") and l.endswith(" ok") for l in a72.stdout.splitlines()) == 13
    # the compiled quantizers give the same bytes on aarch64 (FMA available) as natively
    native_cc = shutil.which("cc") or shutil.which("gcc")
    if native_cc:
        n = build_and_run(native_cc, tmp_path / "check")
        quant = lambda out: [l for l in out.splitlines() if l.startswith("quant ")]  # noqa: E731
        assert len(quant(r.stdout)) == 10 and quant(r.stdout) == quant(n.stdout)
