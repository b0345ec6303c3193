"""The quantizers and dequantizers (ed_quant.h, ed_dequant.h) round as their C reads, never
through a fused multiply-add, whichever compiler builds them: gcc takes the functions'
optimize("fp-contract=off") attribute, clang ignores it and takes the headers' pragma. The
release wheels are built by zig's clang (tools/build-wheels.sh), for aarch64 among others,
where an unguarded `a * b + c` becomes one fmadd and a quantized file's bytes could differ
from llama-quantize's."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(ROOT, "cython_kernels", "kernels")
FUSED = re.compile(r"^\s+(fmadd|fmsub|fnmadd|fnmsub|fmla|fmls)\s", re.M)
TU = """#include "ed_quant.h"
#include "ed_dequant.h"
int q(int t, const float *x, void *y, long k) { return ed_quantize_row(t, x, y, k); }
int qw(int t, const float *x, const float *w, void *y, long k) { return ed_quantize_row_w(t, x, w, y, k); }
int dq(int t, const void *x, float *y, long k) { return ed_dequantize_row(t, x, y, k); }
/* a control in the same unit, after the headers: contraction is back on here */
float control(float a, float b, float c) { return a * b + c; }
"""


def test_quantizers_never_fuse_under_clang(tmp_path):
    pytest.importorskip("ziglang")  # zig's clang: the wheels' compiler (test extra)
    src = tmp_path / "tu.c"
    src.write_text(TU)
    out = tmp_path / "tu.s"
    r = subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-gnu",
                        "-O3", "-std=gnu11", "-Wno-unknown-attributes", "-I" + KERNELS, "-S",
                        "-o", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    asm = out.read_text()
    bodies = re.split(r"^(\w+):", asm, flags=re.M)
    funcs = dict(zip(bodies[1::2], bodies[2::2]))
    # the control proves the compiler contracts where it is allowed to (else the test could not fail)
    assert FUSED.search(funcs["control"]), funcs["control"]
    fused = {name: len(FUSED.findall(body)) for name, body in funcs.items() if name != "control"}
    assert sum(fused.values()) == 0, {k: v for k, v in fused.items() if v}
