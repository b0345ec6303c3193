"""The daemon's life: start (socket, trust store, sandbox, default model, READY=1), serve,
reload on SIGHUP (RELOADING=1 ... READY=1), stop on SIGTERM/SIGINT (STOPPING=1, drain, exit 0).

Signal handlers only put an event on a queue; the main coroutine acts on it.
"""
import asyncio
import concurrent.futures
import os
import signal
import time

from aiohttp import web

from ..errors import ConfigError, EdgedError
from ..trust import store
from . import config as config_mod
from . import apikeys, sandbox, systemd
from .api import Api
from .loader import Loader
from .log import log, setup as setup_log
from .metrics import Metrics
from .policy import LoadPolicy
from .prompt_store import PromptStore
from .registry import Registry
from .renderer import RenderWorker
from .scheduler import Decoder, Slots
from .transport import Listener, fit_descriptor_limit, make_app, open_socket

# Keys read once at start-up; a reload keeps the running value and says so.
RESTART_KEYS = ("socket", "listen", "api_keys_file", "socket_mode", "socket_group", "sandbox",
                "sandbox_on_deny", "n_parallel", "max_connections", "cache_dir", "cache_max_bytes")


def load_trust(cfg):
    """The trust store from cfg.trusted_keys / cfg.revoked_keys (None when signatures are optional
    and no key directory exists)."""
    if not os.path.isdir(cfg.trusted_keys):
        if cfg.require_signature:
            raise ConfigError(f"config key 'trusted_keys': {cfg.trusted_keys} is not a directory "
                              "(require_signature is on, so trusted keys are needed)")
        return None
    return store.TrustStore.load(cfg.trusted_keys, store.revocation_file(cfg.revoked_keys))


class Daemon:
    def __init__(self, cfg, config_path=None, overrides=None):
        self.cfg, self.config_path, self.overrides = cfg, config_path, overrides or {}
        self.metrics = Metrics()
        self.policy = LoadPolicy()
        self.stopping = False
        self.events = None
        self.sock = self.how = None
        self.tcp, self.api_keys = [], ()     # TCP listeners from systemd, their API keys
        self.loader = self.registry = self.slots = self.decoder = self.api = self.listener = None
        self.renderer = None

    # --- start ------------------------------------------------------------------------
    def prepare(self, trust):
        """Everything but the socket and the threads; used by tests that drive the Api directly."""
        self.loader = Loader(self.cfg, trust, PromptStore.open(self.cfg, self.metrics))
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="edged-load")
        self.registry = Registry(self.cfg, self.loader, self.metrics, self.executor)
        self.registry.on_change = self._status
        self.slots = Slots(self.cfg.n_parallel, self.cfg.max_queue)
        self.api = Api(self)

    def start_threads(self):
        cfg = self.cfg
        self.decoder = Decoder(self.metrics, cfg.decode_latency_budget, cfg.decode_latency_budget_ms,
                               cfg.prompt_chunk_max, cfg.prompt_slowdown_max)

    async def run(self):
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self.events = asyncio.Queue()
        systemd.notify("STATUS=starting")
        if cfg.listen:      # refused before anything is bound or loaded: no TCP without keys
            try:
                self.api_keys = apikeys.load(cfg.api_keys_file)
            except ConfigError as e:
                raise ConfigError(f"config key 'listen' needs API keys: {e}") from None
        trust = load_trust(cfg)
        cfg.resolve_names()
        self.prepare(trust)
        fit_descriptor_limit(cfg)
        # Forked now: once the sandbox is applied, no process can be created.
        self.renderer = RenderWorker(cfg.sandbox, cfg.sandbox_on_deny)
        self.renderer.start()
        self.sock, self.how, self.tcp = open_socket(cfg)
        if self.tcp and not self.api_keys:  # read now: after the sandbox, /etc is out of reach
            self.api_keys = apikeys.load(cfg.api_keys_file)
        self._sandbox()
        self.start_threads()
        for sig, what in ((signal.SIGTERM, "stop"), (signal.SIGINT, "stop"), (signal.SIGHUP, "reload")):
            loop.add_signal_handler(sig, self.events.put_nowait, what)
        # Connection deadlines are the Listener's (header_timeout, keepalive_timeout), the same
        # with every aiohttp version; aiohttp's own keep-alive (75 s) is only a backstop.
        # Compressed bodies are inflated by transport.inflate (bounded, off the event loop).
        runner = web.AppRunner(make_app(self), handle_signals=False, access_log=None,
                               shutdown_timeout=1.0, auto_decompress=False)
        await runner.setup()
        self.listener = Listener(self, self.sock, runner.server, tcp=self.tcp)
        self.listener.start()
        for i, s in enumerate(self.tcp):
            log.info("also listening on TCP %s (%s; API key required)", s.getsockname()[:2],
                     "config key 'listen'" if i < len(cfg.listen) else "from systemd")
        where = self.sock.getsockname() or "(socket from systemd)"
        log.info("listening on %s (%s); models in %s; n_parallel=%d max_queue=%d", where, self.how,
                 cfg.models_dir, cfg.n_parallel, cfg.max_queue)
        if cfg.default_model:
            try:
                await self.registry.ensure_loaded(cfg.default_model)
            except EdgedError as e:
                # Stay up: other models may still be served, /health says why (503).
                log.error("default model %s failed to load: %s", cfg.default_model, e)
        loaded = ", ".join(self.registry.models) or "no model loaded"
        systemd.notify("READY=1", f"STATUS=serving ({loaded})")
        tasks = [loop.create_task(self._watchdog()), loop.create_task(self._idle())]
        try:
            while True:
                what = await self.events.get()
                if what == "reload":
                    await self.reload()
                elif what == "stop":
                    break
        finally:
            await self._stop(runner)
            for t in tasks:
                t.cancel()
        return 0

    def _sandbox(self):
        if self.cfg.sandbox == "off":
            return
        cfg = self.cfg
        # The config and revocation list are re-read on SIGHUP, possibly after being replaced
        # by rename: grant their directory where that is safe (sandbox.reloadable). The default
        # revocation list may not exist yet: its directory is granted when that exists, so a
        # list created for a key rotation is read on the next SIGHUP.
        reread = [sandbox.reloadable(p) for p in (cfg.revoked_keys, self.config_path) if p]
        read_only = [cfg.models_dir, cfg.trusted_keys] + [p for p in reread if os.path.exists(p)]
        read_only += [d for d in cfg.image_dirs if os.path.isdir(d)]      # file:// images
        sock_dir = os.path.dirname(cfg.socket) if self.how == "bound" else None
        others = sandbox.other_threads()
        if others and cfg.sandbox == "enforce" and sandbox.landlock_abi() < 8:
            raise ConfigError(
                f"sandbox = 'enforce': {len(others)} thread(s) started before the sandbox "
                f"({', '.join(others)}) would stay outside Landlock and keep their capabilities "
                "(both are per thread before Landlock ABI 8); start the daemon with `edged serve`, "
                "which sets " + ", ".join(f"{k}=1" for k in sandbox.LIBRARY_THREAD_ENV) +
                " before numpy starts its pools")
        read_write = [sock_dir] if sock_dir else []
        # the prompt cache: the one data directory written (--check-sandbox: no loader, and
        # the check makes no directory or key)
        if self.loader is None:
            cache = PromptStore.directory(cfg)
        else:
            cache = self.loader.store and self.loader.store.dir
        if cache:
            read_write.append(cache)
        sandbox.apply(cfg.sandbox, read_only=read_only, read_write=read_write,
                      on_deny=cfg.sandbox_on_deny)

    def _status(self, what=None):
        if what is None:
            what = "serving (" + (", ".join(self.registry.models) or "no model loaded") + ")"
        systemd.notify(f"STATUS={what}")

    # --- reload -----------------------------------------------------------------------
    async def reload(self):
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                       "STATUS=reloading configuration")
        try:
            cfg = config_mod.load(self.config_path, self.overrides)
            trust = load_trust(cfg)
            cfg.resolve_names()
        except EdgedError as e:
            log.error("reload failed, keeping the running configuration: %s", e)
        else:
            for key in RESTART_KEYS:
                if getattr(cfg, key) != getattr(self.cfg, key):
                    log.warning("config key %r changed; takes effect after a restart", key)
            cfg.values.update({k: getattr(self.cfg, k) for k in RESTART_KEYS})
            self.cfg = cfg
            self.loader.cfg, self.loader.trust = cfg, trust
            self.registry.reconfigure(cfg)
            self.slots.resize(cfg.n_parallel, cfg.max_queue)
            if self.decoder is not None:
                self.decoder.configure(cfg.decode_latency_budget, cfg.decode_latency_budget_ms,
                                       cfg.prompt_chunk_max, cfg.prompt_slowdown_max)
            setup_log(cfg.log_level)
            log.info("reloaded configuration%s and trust store", f" from {self.config_path}" if self.config_path else "")
        loaded = ", ".join(self.registry.models) or "no model loaded"
        systemd.notify("READY=1", f"STATUS=serving ({loaded})")

    # --- background -------------------------------------------------------------------
    async def _watchdog(self):
        interval = systemd.watchdog_interval()
        if interval is None:
            return
        while True:
            if self.decoder._thread.is_alive():
                systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _idle(self):
        while True:
            ka = self.cfg.keep_alive
            await asyncio.sleep(min(max(ka / 4, 0.5), 10) if ka > 0 else 5)
            try:
                await self.registry.idle_sweep()
            except Exception as e:  # noqa: BLE001
                log.error("idle unload failed: %s", e)

    # --- stop -------------------------------------------------------------------------
    async def _stop(self, runner):
        self.stopping = True
        systemd.notify("STOPPING=1", "STATUS=stopping: draining requests")
        busy = self.slots.busy + self.slots.waiting
        log.info("stopping: draining %d request(s) (drain_timeout %gs)", busy, self.cfg.drain_timeout)
        deadline = time.monotonic() + self.cfg.drain_timeout
        while (self.slots.busy or self.slots.waiting) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.slots.busy or self.slots.waiting:
            log.warning("drain timeout: aborting %d request(s)", self.slots.busy + self.slots.waiting)
        self.decoder.stop()
        self.listener.stop()
        await runner.cleanup()
        if self.how == "bound":
            try:
                os.unlink(self.cfg.socket)
            except OSError:
                pass
        await self.registry.close_all()
        self.renderer.close()
        self.executor.shutdown(wait=False)
        log.info("stopped")


def serve(cfg, config_path=None, overrides=None):
    setup_log(cfg.log_level)
    return asyncio.run(Daemon(cfg, config_path, overrides).run())
