"""The compiled core's x86-64 feature detection (CPUID + XCR0, cython_kernels/kernels/ed_cpu.h)
against the kernel's own view in /proc/cpuinfo, which Linux also clears for extensions whose
register state it does not enable. A wheel built by another compiler runtime once reported no
AVX2 on an AVX-512 machine and ran the generic path; this catches that on any build."""
import platform

import pytest

core = pytest.importorskip("edged._core")

# /proc/cpuinfo flag -> the name edged's core reports
CPUINFO_NAMES = {"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
                 "avx512vl": "avx512vl", "avx512dq": "avx512dq", "avx512_vnni": "avx512vnni",
                 "avx_vnni": "avxvnni", "avx512_bf16": "avx512bf16"}


def cpuinfo_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 feature detection")
def test_cpu_features_match_the_kernels_view():
    flags = cpuinfo_flags()
    expected = {ours for theirs, ours in CPUINFO_NAMES.items() if theirs in flags}
    assert set(core.cpu_features()) == expected
