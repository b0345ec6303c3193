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


# Helpers, not tests: keep pytest from collecting them where test modules import them.
testdata.__test__ = False
testdata_files.__test__ = False
