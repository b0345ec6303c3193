"""The registry's loads without a daemon: a load belongs to no single request."""
import asyncio
import concurrent.futures
import threading
import time
import types

import pytest

from edged.errors import UnsupportedModelError
from edged.service import config
from edged.service.loader import LoadedModel
from edged.service.metrics import Metrics
from edged.service.registry import Registry


class SlowLoader:
    """Loads take `seconds` (a slow device); counts them; 'bad' is refused."""
    trust = None

    def __init__(self, seconds):
        self.seconds, self.calls, self.lock = seconds, [], threading.Lock()

    def load(self, name, path):
        with self.lock:
            self.calls.append(name)
        time.sleep(self.seconds)
        if name == "bad":
            raise UnsupportedModelError(f"model {name!r}: unknown architecture 'x'")
        model = types.SimpleNamespace(tokenizer=None, backend=None, close=lambda: None)
        return LoadedModel(name, path, model, None, 1000, {"verify": 0.0, "map": 0.0}, 64)

    def warm(self, lm):
        pass


@pytest.fixture
def registry(tmp_path):
    for name in ("slow", "bad"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
    cfg = config.load(None, {"models_dir": str(tmp_path), "require_signature": False,
                             "trusted_keys": str(tmp_path / "none")})
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    yield lambda loader: Registry(cfg, loader, Metrics(), executor)
    executor.shutdown(wait=True)


def test_a_request_that_stops_waiting_does_not_cancel_the_load(registry):
    """queue_timeout shorter than the load: the first request gives up (503 in the daemon), the
    load goes on, and the next request gets the model without a second load."""
    loader = SlowLoader(0.6)
    reg = registry(loader)

    async def scenario():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reg.acquire("slow"), 0.1)
        waiter = asyncio.ensure_future(asyncio.wait_for(reg.acquire("slow"), 5))
        lm = await waiter
        assert lm.name == "slow" and lm.refs == 1
        reg.release(lm)
        again = await asyncio.wait_for(reg.acquire("slow"), 0.1)      # loaded: no wait
        reg.release(again)

    asyncio.run(scenario())
    assert loader.calls == ["slow"]
    assert reg.metrics.loads["ok"] == 1 and not reg.metrics.loads["failed"]


def test_waiters_of_one_load_share_its_error(registry):
    loader = SlowLoader(0.2)
    reg = registry(loader)

    async def scenario():
        return await asyncio.gather(*(reg.acquire("bad") for _ in range(3)), return_exceptions=True)

    errors = asyncio.run(scenario())
    assert all(isinstance(e, UnsupportedModelError) for e in errors), errors
    assert loader.calls == ["bad"]


def test_a_loaded_model_is_out_of_the_garbage_collectors_walk(registry):
    """After a load the objects alive (the model's, the daemon's) are frozen (gc.freeze): a full
    collection, which runs in whatever thread allocates at that moment, no longer walks them,
    so it cannot stall the decode loop for tens of milliseconds every few seconds."""
    import gc
    reg = registry(SlowLoader(0.0))

    async def scenario():
        lm = await reg.acquire("slow")
        reg.release(lm)
        return lm

    try:
        lm = asyncio.run(scenario())
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(lm) and not any(o is lm for o in gc.get_objects())
    finally:
        gc.unfreeze()
