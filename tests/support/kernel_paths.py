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
