"""`edged info` without a model: the machine's kernel path, features, threads and NUMA nodes."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
core = pytest.importorskip("edged._core")


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "edged", "info", *args], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, **(env or {})))


def test_info_describes_the_machine():
    r = run()
    assert r.returncode == 0, r.stderr
    assert f"kernel path:  {core.kernel_path()}" in r.stdout
    assert "numa nodes:   node" in r.stdout
    mi = json.loads(run("--json").stdout)["machine"]
    assert mi["kernel_path"] == core.kernel_path()
    assert mi["default_threads"] >= 1 and set(mi["allowed_cpus"]) <= set(os.sched_getaffinity(0))


def test_info_follows_and_checks_edged_kernels():
    r = run(env={"EDGED_KERNELS": "generic"})
    assert "kernel path:  generic" in r.stdout
    r = run(env={"EDGED_KERNELS": "sse9"})
    assert r.returncode == 2 and "EDGED_KERNELS='sse9'" in r.stderr


def test_one_supported_type_table():
    """The compiled kernels run exactly the types the format layer decodes and the engine loads
    (edged.format.quants.SUPPORTED -> edged.engine.arch.SUPPORTED_TYPES; ED_TRAITS in C)."""
    from edged import _core
    from edged.engine.arch import SUPPORTED_TYPES
    from edged.format.quants import SUPPORTED
    assert set(SUPPORTED) == set(SUPPORTED_TYPES) == {int(t) for t in _core.supported_types()}
