"""Models by name: load on demand, keep at most `max_loaded_models` within the memory budget,
swap without failing a request, pin the default model, unload idle ones (keep_alive).

Runs on the event loop; the slow parts (signature check, mapping, warm-up, close) go to a
worker thread. Loads are serialised. A swap first verifies and maps the new model while the
old one keeps serving, so a failed load (bad signature, bad file, over budget) leaves the old
one untouched; only then are the victims drained (their in-flight requests finish) and closed,
and the new model warmed and published.
"""
import asyncio
import gc
import os
import time

from ..errors import (CapacityError, EdgedError, ModelFormatError, ModelNotFound, RequestError,
                      SignatureError, UnsupportedModelError)
from ..system import available_memory
from ..trust import blocks
from .loader import LoadedModel
from .log import log
from .names import check_model_name, list_models, model_path


def settle_heap():
    """Collect what the last load or unload left, then move every object alive now (the
    models' tokenizers, templates, the daemon's own modules) out of the garbage collector's
    reach (gc.freeze). Without it a full collection walks them all, 30 ms on an idle x86 core
    with SmolLM2 loaded and more on a busy Pi; it runs in whichever thread allocates at that
    moment, so the decode loop stalled every few seconds (a 2-4x gap in every stream).
    Unfreezing first lets the collection free an unloaded model's cycles (one pause per load
    or unload, not per pass)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class Registry:
    def __init__(self, cfg, loader, metrics, executor):
        self.cfg, self.loader, self.metrics, self.executor = cfg, loader, metrics, executor
        self.models: dict[str, LoadedModel] = {}
        self._load_lock = asyncio.Lock()
        self._waiters = []                        # futures woken whenever a lease is released
        self._refused = {}                        # name -> (file identity, trust, error): no re-hash of a bad file
        self._loads = {}                          # name -> the task loading it, shared by its waiters
        self.loading: str | None = None           # name being loaded, for /health
        self.on_change = lambda what: None        # the daemon reports phases to systemd (STATUS=)

    # --- lookup -------------------------------------------------------------------------
    def path(self, name):
        return model_path(self.cfg.models_dir, name)

    def default_name(self):
        if self.cfg.default_model:
            return self.cfg.default_model
        if len(self.models) == 1:
            return next(iter(self.models))
        return None

    def resolve(self, name):
        """Name from a request (None -> the default); raises RequestError/ModelNotFound."""
        if name is None:
            name = self.default_name()
            if name is None:
                raise RequestError("no model given and no default model configured: set \"model\"")
        check_model_name(name)
        if name not in self.models and not os.path.isfile(self.path(name)):
            raise ModelNotFound(f"model {name!r} not found in {self.cfg.models_dir}")
        return name

    def listing(self):
        out = []
        for name in sorted(set(list_models(self.cfg.models_dir)) | set(self.models)):
            p = self.path(name)
            lm = self.models.get(name)
            try:
                st = os.stat(p)
                size, created = st.st_size, int(st.st_mtime)
            except OSError:
                size, created = (lm.size if lm else 0), int(lm.loaded_at if lm else 0)
            entry = {"id": name, "object": "model", "created": created, "owned_by": "edged",
                     "loaded": bool(lm and not lm.draining), "size": size,
                     "signed": bool(lm.signer) if lm else _has_signature(p)}
            if lm:
                be = lm.model.backend
                entry.update(signer=lm.signer, pinned=lm.pinned, in_flight=lm.refs, memory=lm.size,
                             kv_cache=lm.kv_cache(), load_seconds={k: round(v, 4) for k, v in lm.timings.items()},
                             # which arithmetic answers (docs/engine.md, "Reproducibility")
                             kernel_path=be.kernel_path if be else None,
                             kernel_variant=be.kernel_variant if be else None)
            out.append(entry)
        return out

    # --- leases -------------------------------------------------------------------------
    async def acquire(self, name):
        """The loaded model `name`, loading (and swapping) it first if needed. Pair with release()."""
        while True:
            lm = self.models.get(name)
            if lm is not None and not lm.draining:
                lm.refs += 1
                lm.last_used = time.monotonic()
                return lm
            await asyncio.shield(self._load(name))

    def _load(self, name):
        """The running load of `name`, started if there is none. It is a task of its own, so a
        request that stops waiting (its queue_timeout, a disconnect) does not cancel a load that
        the other waiters and the next request will use: on a slow device a model that takes
        longer than queue_timeout to load still ends up loaded."""
        task = self._loads.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self.ensure_loaded(name))
            self._loads[name] = task
            task.add_done_callback(lambda t: self._load_done(name, t))
        return task

    def _load_done(self, name, task):
        if self._loads.get(name) is task:
            del self._loads[name]
        if not task.cancelled():
            task.exception()            # retrieved: a load nobody waits for any more was logged already

    def release(self, lm):
        lm.refs -= 1
        lm.last_used = time.monotonic()
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)
        if (lm.refs == 0 and self.keep_alive(lm) == 0 and not lm.pinned and not lm.draining
                and lm.name != self.cfg.default_model):
            asyncio.get_running_loop().create_task(self.unload(lm.name, only_if_idle=True))

    async def _wait_until(self, predicate):
        while not predicate():
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    # --- load / unload ------------------------------------------------------------------
    async def ensure_loaded(self, name):
        loop = asyncio.get_running_loop()
        async with self._load_lock:
            if name in self.models and not self.models[name].draining:
                return self.models[name]
            path = self.path(name)
            ident = _identity(path)
            refused = self._refused.get(name)
            if refused and refused[0] == ident and refused[1] is self.loader.trust:
                raise type(refused[2])(str(refused[2]))        # same file, same trust: same answer
            t_start = time.monotonic()
            self.loading = name
            self.on_change(f"loading model {name}")
            try:
                try:
                    new = await loop.run_in_executor(self.executor, self.loader.load, name, path)
                except BaseException as e:
                    self.metrics.loads["failed"] += 1
                    log.warning("load of model %s failed: %s", name, e)
                    if isinstance(e, (SignatureError, ModelFormatError, UnsupportedModelError)) and ident:
                        self._refused[name] = (ident, self.loader.trust, e)
                    raise
                self._refused.pop(name, None)
                victims = self._victims_for(new)
                if victims is None:
                    await loop.run_in_executor(self.executor, new.close)
                    self.metrics.loads["failed"] += 1
                    raise CapacityError(
                        f"model {name!r} does not fit beside the pinned model(s) "
                        f"{', '.join(m.name for m in self.models.values() if m.pinned) or '(none)'} "
                        f"(max_loaded_models={self.cfg.max_loaded_models}, memory_budget="
                        f"{self._budget()} bytes, model {new.size} bytes)")
                if victims:
                    self.metrics.swap_count += 1
                    for v in victims:
                        v.draining = True
                    log.info("swap: draining %s for %s", ", ".join(v.name for v in victims), name)
                    await self._wait_until(lambda: all(v.refs == 0 for v in victims))
                    for v in victims:
                        self.models.pop(v.name, None)
                        await loop.run_in_executor(self.executor, v.close)
                        log.info("unloaded model %s", v.name)
                try:
                    await loop.run_in_executor(self.executor, self.loader.warm, new)
                except BaseException:
                    await loop.run_in_executor(self.executor, new.close)
                    self.metrics.loads["failed"] += 1
                    raise
                new.pinned = self.cfg.pin_default_model and name == self.cfg.default_model
                new.last_used = time.monotonic()
                self.models[name] = new
                settle_heap()
                total = time.monotonic() - t_start
                new.timings["total"] = total
                for k in ("verify", "map", "warmup", "total"):
                    self.metrics.load_seconds[k] += new.timings.get(k, 0.0)
                self.metrics.loads["ok"] += 1
                if victims:
                    self.metrics.swap_seconds += total
                    self.metrics.last_swap_seconds = total
                log.info("loaded model %s (signer %s): verify %.3fs, map %.3fs, warm-up %.3fs, total %.3fs",
                         name, new.signer or "none", new.timings["verify"], new.timings["map"],
                         new.timings.get("warmup", 0.0), total)
                return new
            finally:
                self.loading = None
                self.on_change(None)

    def _budget(self):
        if self.cfg.memory_budget:
            return self.cfg.memory_budget
        avail = available_memory()
        return None if avail is None else avail + sum(m.size for m in self.models.values())

    def _victims_for(self, new):
        """Models to unload (least recently used first) so `new` fits; None if it cannot."""
        budget = self._budget()
        live = sorted((m for m in self.models.values() if not m.draining), key=lambda m: m.last_used)
        victims = []

        def fits():
            count = len(live) - len(victims) + 1
            used = sum(m.size for m in live if m not in victims) + new.size
            return count <= self.cfg.max_loaded_models and (budget is None or used <= budget)

        for m in live:
            if fits():
                break
            if not m.pinned:
                victims.append(m)
        return victims if fits() else None

    async def unload(self, name, only_if_idle=False):
        loop = asyncio.get_running_loop()
        async with self._load_lock:
            lm = self.models.get(name)
            if lm is None:
                return False
            if only_if_idle and (lm.refs or lm.pinned):
                return False
            lm.draining = True
            await self._wait_until(lambda: lm.refs == 0)
            self.models.pop(name, None)
            await loop.run_in_executor(self.executor, lm.close)
            settle_heap()
            log.info("unloaded model %s", name)
            return True

    async def idle_sweep(self):
        """Unload unpinned models idle for longer than keep_alive (negative keep_alive: never)."""
        now = time.monotonic()
        for lm in list(self.models.values()):
            ka = self.keep_alive(lm)
            if lm.name == self.cfg.default_model or ka < 0:
                continue
            if not lm.pinned and lm.refs == 0 and not lm.draining and now - lm.last_used >= ka:
                log.info("model %s idle for %.0fs (keep_alive %gs): unloading", lm.name, now - lm.last_used, ka)
                await self.unload(lm.name, only_if_idle=True)

    def keep_alive(self, lm):
        """Seconds `lm` stays loaded once idle: a request's keep_alive (Ollama's API), else the config's."""
        return self.cfg.keep_alive if lm.keep_alive is None else lm.keep_alive

    def reconfigure(self, cfg):
        self.cfg = cfg
        for name, lm in self.models.items():
            lm.pinned = cfg.pin_default_model and name == cfg.default_model

    async def close_all(self):
        loop = asyncio.get_running_loop()
        for name in list(self.models):
            lm = self.models.pop(name)
            await loop.run_in_executor(self.executor, lm.close)


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _has_signature(path):
    """Whether a signature is present (detached .sig or appended block), without verifying it:
    only the file's tail is read. Verification happens at load."""
    if os.path.exists(path + ".sig"):
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return bool(blocks.read_blocks(fd, os.fstat(fd).st_size, path))
    except (EdgedError, EOFError, OSError):
        return False
    finally:
        os.close(fd)
