import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(ROOT, "..", "shared", "testdata")


def testdata(*parts):
    """Path inside ../shared/testdata; skips the test when the shared data is missing."""
    path = os.path.join(TESTDATA, *parts)
    if not os.path.exists(path):
        pytest.skip(f"shared test data missing: {path}")
    return path


def testdata_files(sub, suffix):
    d = os.path.join(TESTDATA, sub)
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(suffix))


@pytest.fixture(params=["generic", "avx2", "avx2-vnni", "avx512", "avx512-vnni", "neon", "neon-dotprod"])
def kernel_path(request):
    """Each kernel path this CPU supports (a family, or one less a feature: plain AVX2 on a VNNI
    machine), selected for the test; the previous one is restored."""
    core = pytest.importorskip("edged._core")
    from edged.errors import ConfigError
    old = core.kernel_path()
    try:
        core.set_path(request.param)
    except ConfigError:
        core.set_path(old)
        pytest.skip(f"kernel path {request.param} not supported on this CPU")
    yield request.param
    core.set_path(old)


# Helpers, not tests: keep pytest from collecting them where test modules import them.
testdata.__test__ = False
testdata_files.__test__ = False


# EDGED_REQUIRE_ALL=1 (set by .ci/run): a test that would skip because the shared data, the
# compiled core or a test dependency is missing fails instead, so CI cannot pass by skipping.
REQUIRE_ALL = os.environ.get("EDGED_REQUIRE_ALL", "") not in ("", "0")
MISSING = ("shared test data missing", "shared template missing", "could not import",
           "compiled sampler not built", "not on this branch yet", "not available on this branch")


def _required(report):
    if not (REQUIRE_ALL and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = str(report.longrepr[2])
    if any(m in reason for m in MISSING):
        report.outcome = "failed"
        report.longrepr = f"EDGED_REQUIRE_ALL=1 and this test would skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _required(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _required(outcome.get_result())
