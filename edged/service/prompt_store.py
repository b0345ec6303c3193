"""The prompt cache on disk: idle sessions' KV caches spilled to `cache_dir`, restored on use.

A model's idle sessions are its prompt cache in memory (service/loader.py). When one is about
to be overwritten by an unrelated prompt (eviction), when its model is unloaded, and at
shutdown (SIGTERM, after the drain), a session holding at least SPILL_MIN_TOKENS tokens is
written to a prompt-cache file (engine/statefile.py: header bound to the model, cache types,
context size, kernel path and build; HMAC with the key in cache_dir). A request whose prompt
starts with a saved prefix longer than what memory holds gets that prefix restored from disk
instead of evaluated again, after a restart too. A file that fails any check is logged in one
line naming why, deleted, and its prefix recomputed.

The directory holds at most cache_max_bytes of files: the least recently used ones go first
(named prefixes, saved by the admin route, only by POST .../prefixes/NAME?action=erase). A
full disk fails one write (nothing partial is left: files are written to a temporary name and
renamed) and serving goes on. Files are named by a digest of (model, context size, cache
types, tokens), so a prefix is written once.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..engine import statefile
from ..errors import ConfigError, RequestError, StateFileError

log = logging.getLogger("edged.service.prompt_store")

SPILL_MIN_TOKENS = 64       # shorter prefixes are cheap to evaluate again: not worth a file
RESTORE_MIN_GAIN = 16       # restore when the file gives this many more tokens than memory
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAMED = "named-"


@dataclass
class Entry:
    path: str
    model: bytes            # model file SHA-256
    n_ctx: int
    tokens: np.ndarray      # uint32 (n_tokens,)
    size: int
    used: float             # time of last write or restore (mtime): the eviction order

    @property
    def named(self):
        return os.path.basename(self.path).startswith(NAMED)


def common_prefix(a, b):
    """Leading tokens the uint32 arrays a and b share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PromptStore:
    """The files of one daemon's cache_dir, with an index of their headers (thread-safe)."""

    def __init__(self, directory, max_bytes, key, metrics=None):
        self.dir, self.max_bytes, self.key = directory, max_bytes, key
        self.counts = metrics.prompt_cache if metrics is not None else {}
        self._index = {}            # path -> Entry
        self._lock = threading.RLock()

    @staticmethod
    def directory(cfg):
        """The cache's directory: cfg.cache_dir, else systemd's $STATE_DIRECTORY; None when the
        cache on disk is off (cache_max_bytes 0, or neither directory given)."""
        d = cfg.cache_dir or os.environ.get("STATE_DIRECTORY", "").split(":")[0]
        return os.path.abspath(d) if d and cfg.cache_max_bytes else None

    @classmethod
    def open(cls, cfg, metrics=None):
        """The store of directory(cfg) (made 0700 when missing, with its key), or None when the
        cache on disk is off or the directory is unusable (logged: the daemon serves without
        it). Runs before the sandbox is applied."""
        d = cls.directory(cfg)
        if d is None:
            return None
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            key = statefile.load_key(d)
        except (OSError, ConfigError) as e:
            log.warning("prompt cache on disk off: cache_dir %s: %s", d,
                        getattr(e, "strerror", None) or e)
            return None
        store = cls(d, cfg.cache_max_bytes, key, metrics)
        store.scan()
        return store

    # --- index --------------------------------------------------------------------------
    def scan(self):
        """Index every file of the directory; remove temporaries a crash left (kill -9 during a
        write) and files whose header is unreadable."""
        n = 0
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.startswith(".") and name.endswith(".tmp"):
                self._unlink(path, "a temporary file left by an interrupted write")
            elif name.endswith(statefile.SUFFIX):
                try:
                    self._add(path)
                    n += 1
                except (StateFileError, OSError) as e:
                    self._refuse(path, e)
        self._bound()
        log.info("prompt cache: %d file(s), %d bytes in %s (cache_max_bytes %d)", n,
                 self.total_bytes(), self.dir, self.max_bytes)

    def _add(self, path):
        h, tokens, size = statefile.read_header(path)
        e = Entry(path, h["model_sha256"], h["n_ctx"], np.asarray(tokens, np.uint32), size,
                  os.stat(path).st_mtime)
        with self._lock:
            self._index[path] = e
        return e

    def total_bytes(self):
        with self._lock:
            return sum(e.size for e in self._index.values())

    def entries(self):
        with self._lock:
            return list(self._index.values())

    def _count(self, what, n=1):
        self.counts[what] = self.counts.get(what, 0) + n

    def _unlink(self, path, why):
        try:
            os.unlink(path)
            log.info("prompt cache: removed %s (%s)", os.path.basename(path), why)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("prompt cache: cannot remove %s: %s", os.path.basename(path), e.strerror)
        with self._lock:
            self._index.pop(path, None)

    def _refuse(self, path, e):
        log.warning("prompt cache: %s refused (%s): deleted, its prefix will be recomputed",
                    os.path.basename(path), e)
        self._count("refused")
        self._unlink(path, "refused")

    def _bound(self, keep=None):
        """Remove the least recently used files (named ones last) until the directory holds at
        most max_bytes; `keep` (just written) is never the one removed."""
        with self._lock:
            order = sorted(self._index.values(), key=lambda e: (e.named, e.used))
            total = sum(e.size for e in order)
            for e in order:
                if total <= self.max_bytes:
                    break
                if e.path != keep:
                    self._unlink(e.path, f"over cache_max_bytes {self.max_bytes}")
                    self._count("evicted")
                    total -= e.size

    # --- use ----------------------------------------------------------------------------
    def file_name(self, model, n_ctx, tokens):
        h = hashlib.sha256(statefile.model_digest(model))
        h.update(f"{n_ctx} {model.cache} ".encode())
        h.update(np.asarray(tokens, "<u4").tobytes())
        return h.hexdigest()[:32] + statefile.SUFFIX

    def lookup(self, model, n_ctx, ids):
        """(Entry, n): the file holding the longest prefix of `ids` for this model and context
        size, n its length (0: none)."""
        digest = statefile.model_digest(model)
        ids = np.asarray(ids, np.uint32)
        best, n = None, 0
        with self._lock:
            for e in self._index.values():
                if e.model == digest and e.n_ctx == n_ctx:
                    k = common_prefix(ids, e.tokens)
                    if k > n:
                        best, n = e, k
        return best, n

    def restore(self, session, entry, n):
        """Put the file's first n tokens into `session`; returns the tokens restored (0 when
        the file was refused: logged, deleted, the session left empty)."""
        t0 = time.perf_counter()
        try:
            got = statefile.restore(session, entry.path, self.key, n)
        except StateFileError as e:
            self._refuse(entry.path, e)
            return 0
        except OSError as e:
            log.warning("prompt cache: cannot read %s: %s", os.path.basename(entry.path), e.strerror)
            with self._lock:
                self._index.pop(entry.path, None)
            return 0
        self._touch(entry)
        self._count("disk_hits")
        self._count("bytes_read", entry.size)
        self._count("load_seconds", time.perf_counter() - t0)
        log.info("prompt cache: %d tokens of %s restored in %.0f ms", got,
                 os.path.basename(entry.path), (time.perf_counter() - t0) * 1000)
        return got

    def _touch(self, entry):
        entry.used = time.time()
        try:
            os.utime(entry.path, (entry.used, entry.used))
        except OSError:
            pass

    def spill(self, session, n_ctx=None, name=None):
        """Write `session` to the directory (under `name` for a named prefix) unless it holds
        fewer than SPILL_MIN_TOKENS tokens (a named one: any) or that file exists. A write
        that fails (a full disk) is logged and leaves no file. Returns the path or None."""
        if session.n_past < (1 if name else SPILL_MIN_TOKENS):
            return None
        m = session.model
        fname = NAMED + name + statefile.SUFFIX if name else \
            self.file_name(m, session.n_ctx, session.tokens)
        path = os.path.join(self.dir, fname)
        with self._lock:
            e = self._index.get(path)
            if e is not None and not name:
                self._touch(e)
                return path
            try:
                size = statefile.save(session, path, self.key)
            except OSError as err:
                log.warning("prompt cache: cannot write %s (%d tokens): %s; nothing written, "
                            "serving continues", fname, session.n_past, err.strerror or err)
                self._count("write_failed")
                return None
            self._index[path] = Entry(path, statefile.model_digest(m), session.n_ctx,
                                      np.asarray(session.tokens, np.uint32), size, time.time())
            self._count("spilled")
            self._count("bytes_written", size)
            self._bound(keep=path)
        return path

    # --- named prefixes (the admin route) -----------------------------------------------
    def named_path(self, name):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RequestError(f"prefix name {name!r}: 1 to 64 of A-Z a-z 0-9 . _ -, not "
                               "starting with . _ or -")
        return os.path.join(self.dir, NAMED + name + statefile.SUFFIX)

    def named(self, name):
        with self._lock:
            return self._index.get(self.named_path(name))

    def erase(self, name):
        path = self.named_path(name)
        with self._lock:
            if path not in self._index:
                return False
        self._unlink(path, "erased by an admin")
        return True


def metric_families(counts):
    """(name, kind, help, samples) of the prompt cache's counters for /metrics."""
    c = counts.get
    return [
        ("edged_prompt_cache_disk_hits_total", "counter",
         "Prompt prefixes restored from prompt-cache files instead of evaluated again.",
         [({}, c("disk_hits", 0))]),
        ("edged_prompt_cache_files_total", "counter",
         "Prompt-cache files by event: spilled (written), evicted (over cache_max_bytes), "
         "refused (failed a check, deleted), write_failed (a full disk: nothing written).",
         [({"event": k}, c(k, 0)) for k in ("spilled", "evicted", "refused", "write_failed")]),
        ("edged_prompt_cache_bytes_total", "counter", "Bytes of prompt-cache files read and written.",
         [({"direction": "read"}, c("bytes_read", 0)), ({"direction": "written"}, c("bytes_written", 0))]),
        ("edged_prompt_cache_load_seconds_total", "counter",
         "Seconds spent restoring prompt prefixes from disk.", [({}, c("load_seconds", 0.0))]),
    ]
