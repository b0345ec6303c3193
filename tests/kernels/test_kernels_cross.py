"""tests/kernels/c/kernels_check.c: every SIMD path against the generic C path, all 16 types, dots and
tiles, and attention over quantized KV caches (q8_0/q4_0 K and V). Native build always; an
aarch64 build under qemu (NEON path) when aarch64-linux-gnu-gcc and qemu-aarch64(-static) are
installed (tools/bootstrap.sh)."""
import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "kernels", "c", "kernels_check.c")
INCLUDES = ["-I" + d for d in [os.path.join(ROOT, "cython_kernels")] + sorted(glob.glob(os.path.join(ROOT, "cython_kernels", "*/")))]
FLOAT_TYPES = {"F32", "F16", "BF16"}  # the unquantized types: one order on the SIMD paths, not generic's
FLAGS = ["-O2", "-std=gnu11", "-pthread", *INCLUDES, SRC, "-lm"]


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
    assert " ok" in r.stdout and "FAIL" not in r.stdout  # incl. the tiles bit for bit (same-ok)
    # every compiled path's tables cover the one type list (ed_types.h ED_TYPES)
    tables = [l for l in r.stdout.splitlines() if l.startswith("tables ")]
    assert len(tables) == {"x86_64": 5, "aarch64": 3}.get(os.uname().machine, 1) and all(l.endswith(" ok") for l in tables)
    if "x86" in os.uname().machine:  # the AVX2 softmax expf and SiLU (ed_parity.h) equal the scalar code
        assert any(l in r.stdout.splitlines() for l in ("parity simd expf silu ok", "parity scalar expf silu ok")), r.stdout
        assert any(l in r.stdout.splitlines() for l in ("parity simd dot ok", "parity scalar dot ok")), r.stdout
        assert any(l in r.stdout.splitlines() for l in ("parity simd f16 lanes ok", "parity scalar f16 lanes ok")), r.stdout
    # every path's Q8_0 and Q8_1 activation quantizers give the generic bytes (ties, zeros, huge values)
    aq = [l for l in r.stdout.splitlines() if l.startswith("actquant ")]
    assert aq and all(l.endswith(" same-bytes ok") for l in aq), r.stdout
    assert {l.split()[2] for l in aq} == {"Q8_0", "Q8_1"}, r.stdout
    # every type has a tile (ED_TILE: a prompt's tokens, a decode batch's sessions) equal to the
    # one-token path on the x86 SIMD paths (the generic path runs its dot per column)
    digests = [l.split() for l in r.stdout.splitlines() if l.startswith("digest ")]
    x86 = [d for d in digests if d[1] in ("avx2", "avx2nv", "avx512", "avx512nv")]
    assert all("same-ok" in d for d in x86), r.stdout
    assert not any("same-ok" in d for d in digests if d[1] == "generic")
    # the canonical order: every quantized dot, tile, row kernel and panel equals the plain C dot
    # bit for bit on every path, so the digests of a type agree across paths
    quantized = [d for d in digests if d[2] not in FLOAT_TYPES]
    assert len({d[2] for d in quantized}) == 13 and all(d[-1] == "canon-ok" for d in quantized), r.stdout
    for name in {d[2] for d in quantized}:
        assert len({d[3] for d in quantized if d[2] == name}) == 1, (name, r.stdout)
    # the float types on every SIMD path in llama.cpp's order (16 FMA lanes, the 16-lane tree)
    simd = {d[1] for d in digests} - {"generic"}
    assert {l for l in r.stdout.splitlines() if l.startswith("floatorder ")} == {
        f"floatorder {p} {t} ok" for p in simd for t in FLOAT_TYPES}, r.stdout
    # attention over a quantized KV cache: 4 cache type pairs on every path that ran, the same
    # stored bytes and outputs within float rounding of the generic path's
    kv = [l for l in r.stdout.splitlines() if l.startswith("kvcache ")]
    ran = {l.split()[0] for l in r.stdout.splitlines() if l.endswith(" ok") and not l.startswith(("kvcache", "digest", "extreme", "long", "parity", "repack", "actquant", "tables", "floatorder"))}
    assert len(kv) == 4 * len(ran) and all(l.endswith(" same-bytes ok") for l in kv), r.stdout
    if "x86" in os.uname().machine:  # Q4_0 / Q5_0 row kernels over rows too long for their per-call column sums
        long_rows = {l for l in r.stdout.splitlines() if l.startswith("long ")}
        assert long_rows == {f"long {p} {t} rows ok" for p in ran - {"generic"} for t in ("Q4_0", "Q5_0")}, r.stdout
    # weights repacked at load (ed_repack.h's R4 layout, the generic twin of the NEON kernel
    # here): rows and panels over them equal the plain C dot on the mapped rows, on every path
    repack = {l for l in r.stdout.splitlines() if l.startswith("repack ")}
    # Q4_0, Q5_0, Q8_0; in x86's groups of 8 also Q4_1, Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q2_K..Q6_K
    n_r4 = 13 if "x86" in os.uname().machine else 3
    assert {l.split()[1] for l in repack} == ran and len(repack) == n_r4 * len(ran), r.stdout
    assert all(l.endswith(" ok") for l in repack), r.stdout
    for path in ("avx2", "avx2nv", "avx512"):  # the packed panels ran on every x86 path this CPU has
        if f"{path}: not supported" not in r.stdout and "x86" in os.uname().machine:
            assert sum(l.startswith(path + " ") and " panels " in l for l in r.stdout.splitlines()) >= 9, r.stdout


def test_neon_path_matches_generic_under_qemu(tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not cc or not qemu:
        pytest.skip("aarch64-linux-gnu-gcc / qemu-aarch64 not installed")
    r = build_and_run(cc, tmp_path / "check-arm64", runner=(qemu, "-cpu", "max"), extra=("-static",))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dotprod" in r.stdout.splitlines()[0]  # the dotprod variant ran
    assert {l for l in r.stdout.splitlines() if l.startswith("tables ")} == {
        "tables neon+dotprod ok", "tables neon ok", "tables generic ok"}, r.stdout
    # the NEON softmax expf and SiLU (ed_parity.h) equal the scalar code bit for bit
    assert "parity simd expf silu ok" in r.stdout.splitlines(), r.stdout
    # and the attention's F16 dot (ed_pm_dot: 64 and 16 lanes, NEON on both variants)
    assert "parity simd dot ok" in r.stdout.splitlines(), r.stdout
    # the F16 rows of the query and the cache, the lane reduction over fewer keys than lanes,
    # and the NEON Q8_0 activation quantizer of both variants (ed_quant_q8_0's bytes)
    want = {"parity simd f16 lanes ok", "actquant neon Q8_0 same-bytes ok", "actquant neonnd Q8_0 same-bytes ok"}
    assert want <= set(r.stdout.splitlines()), r.stdout
    lines = [l for l in r.stdout.splitlines() if l.startswith("neon ") and " panels " not in l]
    assert len(lines) == 16 and all(l.endswith(" ok") for l in lines), r.stdout
    # dotprod has the packed panels for the 13 quantized types (each also checked in an ok line)
    assert sum(" panels " in l for l in r.stdout.splitlines() if l.startswith("neon ")) == 13, r.stdout
    # the row kernels (ED_ROWS, 4 rows as lanes) of the 32-block types on both variants, with
    # extreme weights and quants; their outputs are in the canon-ok digests below
    # the NEON+dotprod row kernel over weights repacked at load (R4: 4 rows interleaved, SDOT
    # by lane) and the panels over them, bit for bit with the mapped rows' plain C dot
    assert {"repack neon Q4_0 rows panels ok", "repack neon Q8_0 rows panels ok",
            "repack neon Q5_0 rows panels ok",  # not repacked by default there: the generic twin
            "repack neonnd Q4_0 rows ok", "repack neonnd Q8_0 rows ok"} <= set(r.stdout.splitlines()), r.stdout
    # prompts over repacked weights: the dotprod path's own panels packed from the R4 groups and
    # its kernel for them (16 rows x 3 tokens), for 1-5 tokens and 4-16 rows, equal the plain C dot
    assert {l for l in r.stdout.splitlines() if " kernel_r4 " in l} == {
        "repack neon Q4_0 panels kernel_r4 ok", "repack neon Q8_0 panels kernel_r4 ok"}, r.stdout
    rows = {l for l in r.stdout.splitlines() if l.startswith("extreme neon") and " rows " in l}
    assert rows == {f"extreme {v} {t} rows ok" for v in ("neon", "neonnd") for t in ("Q4_0", "Q5_0", "Q8_0")}, r.stdout
    # the wide types' panels (u = w + 128 over 0..255) at their edge, on the dotprod panels
    assert {f"extreme neon {t} panels ok" for t in ("Q8_0", "IQ4_NL", "IQ4_XS")} <= set(r.stdout.splitlines()), r.stdout
    # baseline Advanced SIMD (Cortex-A72, Raspberry Pi 4: no dotprod)
    a72 = subprocess.run([qemu, "-cpu", "cortex-a72", str(tmp_path / "check-arm64")],
                         capture_output=True, text=True, timeout=600)
    assert a72.returncode == 0 and "dotprod" not in a72.stdout.splitlines()[0], a72.stdout
    assert sum(l.startswith("neon ") and l.endswith(" ok") for l in a72.stdout.splitlines()) == 16
    assert " panels " not in a72.stdout  # no panel kernel without dotprod: the row tiles
    assert "parity simd dot ok" in a72.stdout.splitlines(), a72.stdout
    assert {"parity simd f16 lanes ok", "actquant neon Q8_0 same-bytes ok"} <= set(a72.stdout.splitlines()), a72.stdout
    assert {l for l in a72.stdout.splitlines() if l.startswith("extreme ")} == rows, a72.stdout
    # every type has a NEON dot (none left on the generic C loop) and a tile equal to the
    # one-token dot bit for bit, and both variants give the same bits (the dots'
    # and tiles' results, digested per type; the panels are dotprod-only and not in the digest)
    digests = lambda out: [l for l in out.splitlines() if l.startswith("digest neon ")]  # noqa: E731
    assert len(digests(r.stdout)) == 16 and all(" simd-dot" in l for l in digests(r.stdout)), r.stdout
    assert all(" same-ok" in l for l in digests(r.stdout)), r.stdout
    assert all(l.endswith(" canon-ok") for l in digests(r.stdout) if l.split()[2] not in FLOAT_TYPES), r.stdout
    assert digests(a72.stdout) == digests(r.stdout), (r.stdout, a72.stdout)
    # forcing "neon-dotprod" on a dotprod CPU selects the table a CPU without dotprod runs
    nd = lambda out: [l for l in out.splitlines() if l.startswith("digest neonnd ")]  # noqa: E731
    assert len(nd(r.stdout)) == 16 and nd(r.stdout) == nd(a72.stdout), (r.stdout, a72.stdout)
    # the float dots in the x86 paths' order, so F16 weights give llama.cpp's bits (a reduction
    # in NEON's pairwise order moved a q4_0 KV cache value: the kv-q4_0 golden, 0.167 away)
    for out in (r.stdout, a72.stdout):
        assert {l for l in out.splitlines() if l.startswith("floatorder ")} == {
            f"floatorder {v} {t} ok" for v in ("neon", "neonnd") for t in FLOAT_TYPES}, out
    # attention over quantized KV caches on both NEON variants (and generic) under emulation
    for out in (r.stdout, a72.stdout):
        kv = [l for l in out.splitlines() if l.startswith("kvcache ")]
        assert len(kv) == 12 and all(l.endswith(" same-bytes ok") for l in kv), out
    # the compiled quantizers give the same bytes on aarch64 (FMA available) as natively
    native_cc = shutil.which("cc") or shutil.which("gcc")
    if native_cc:
        n = build_and_run(native_cc, tmp_path / "check")
        quant = lambda out: [l for l in out.splitlines() if l.startswith("quant ")]  # noqa: E731
        assert len(quant(r.stdout)) == 13 and quant(r.stdout) == quant(n.stdout)
        # the canonical order gives the quantized types the same bits on aarch64 as on x86
        qd = lambda out, path: sorted(l.split()[2:4] for l in out.splitlines()  # noqa: E731
                                      if l.startswith(f"digest {path} ") and l.split()[2] not in FLOAT_TYPES)
        assert len(qd(r.stdout, "neon")) == 13 and qd(r.stdout, "neon") == qd(n.stdout, "generic")
    # every 32-block type has a row kernel (8 rows as lanes) on every x86 path, Q4_K and Q5_K
    # too (mapped on the paths without VNNI, repacked on all) and Q2_K, Q3_K, Q6_K, IQ4_XS (repacked), exact at the edge of its integer
    # range (the i16 sums; "extreme PATH TYPE rows ok")
    extreme = {tuple(l.split()[1:3]) for l in r.stdout.splitlines() if l.startswith("extreme ") and l.endswith(" rows ok")}
    for path in ("avx2", "avx2nv", "avx512", "avx512nv"):
        if f"{path}: not supported" not in r.stdout and "x86" in os.uname().machine:
            for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                         "Q6_K", "IQ4_XS"):
                assert (path, name) in extreme, (path, name, r.stdout)
