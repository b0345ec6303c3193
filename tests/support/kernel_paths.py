"""The kernel paths a test runs on, as a fixture: import it into a test module
(`from kernel_paths import kernels  # noqa: F401`) and take `kernels` as an argument."""
import pytest


@pytest.fixture(params=["best", "generic"])
def kernels(request):
    """The fastest path this CPU supports, and the generic C path."""
    core = pytest.importorskip("edged._core")
    before = core.kernel_path()
    core.set_path(None if request.param == "best" else request.param)
    yield request.param
    core.set_path(before)


@pytest.fixture
def every_path(request):
    """Each SIMD path this CPU supports in turn (parametrize with `paths()`)."""
    core = pytest.importorskip("edged._core")
    before = core.kernel_path()
    core.set_path(request.param)
    yield request.param
    core.set_path(before)


def paths():
    """The paths `every_path` runs on: all this CPU supports (none without the core)."""
    try:
        from edged import _core
    except ImportError:
        return []
    return _core.available_paths()
