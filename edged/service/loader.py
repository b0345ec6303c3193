"""Turning a model file into something the daemon can serve: verify -> map/validate -> warm up.

The only module of the service that touches the engine, the text layer and signing. Each
phase is timed separately (the swap-latency split the README records). Everything here runs
in worker threads, never on the event loop.
"""
import os
import threading
import time

from ..engine.model import Model
from ..errors import EdgedError, RequestError
from ..text.chat import template_for
from ..trust import verify


class LoadedModel:
    """A verified, mapped engine Model plus the per-daemon state the registry keeps for it."""

    def __init__(self, name, path, model, signer, size, timings, n_ctx, content_specials=False):
        self.name, self.path, self.model = name, path, model
        # config content_special_tokens lists this model: control-token text in messages counts
        self.content_specials = content_specials
        self.signer = signer            # fingerprint of the key that signed it, None if unsigned
        self.size = size                # bytes it needs: the engine's memory plan (weights, KV, scratch)
        self.timings = dict(timings)    # phase -> seconds
        self.n_ctx = n_ctx
        self.tokenizer = model.tokenizer
        # An operator's chat template beside the model (MODELS_DIR/NAME.jinja) replaces the
        # model's own, or gives one to a model that has none.
        jinja = os.path.splitext(path)[0] + ".jinja"
        self.template_file = jinja if os.path.isfile(jinja) else None
        self.loaded_at = time.time()
        self.last_used = time.monotonic()
        self.refs = 0                   # requests holding this model (registry, event loop only)
        self.draining = False           # being unloaded: new requests wait for the next load
        self.pinned = False
        self._sessions = []             # idle Sessions (KV caches), reused for prefix caching
        self._template = None           # chat template source, read on first use
        self._lock = threading.Lock()

    def kv_cache(self):
        """The KV cache of one generation slot: its K/V storage types and bytes (memory plan)."""
        k, v = self.model.cache.names
        return {"type_k": k, "type_v": v, "bytes_per_slot": self.model.memory_plan.kv_cache}

    # --- text ---------------------------------------------------------------------------
    @property
    def n_vocab(self):
        return self.tokenizer.n_vocab

    def template_source(self):
        """The chat template requests to this model render (operator's file or the model's)."""
        if self._template is None:
            self._template = template_for(self.model.file, template_file=self.template_file)
        return self._template

    def encode_chat(self, messages, **template_vars):
        """Chat messages -> prompt token ids, through the model's own (sandboxed) template;
        template_vars: `tools` and a request's chat_template_kwargs. Control-token text in
        them stays plain text unless the model is listed in content_special_tokens."""
        return self.model.encode_chat(messages, template_file=self.template_file,
                                      content_specials=self.content_specials, **template_vars)

    def encode_text(self, text, add_special=True, parse_special=False):
        return list(self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special))

    # --- sessions -----------------------------------------------------------------------
    def take_session(self, ids):
        """An idle session sharing the longest prefix with `ids` (prompt cache), or a new one."""
        with self._lock:
            best = max(self._sessions, key=lambda s: s.common_prefix(ids), default=None)
            if best is not None:
                self._sessions.remove(best)
                return best
        return self.model.session(n_ctx=self.n_ctx)

    def steps(self, session, ids, info, max_tokens, stop=(), sampler=None):
        """The request as steps for the decode loop: the engine Generation on `session` (its
        prompt, then one token per step; service/scheduler.py drives it). The prompt prefix
        already in the session's KV cache is not evaluated again: info["cached"] gets its
        length, info["evaluated"] the prompt tokens to evaluate."""
        g = session.start(ids, max_tokens=max_tokens, stop=stop, sampler=sampler)
        info["cached"] = g.n_cached
        info["evaluated"] = g.n_pending
        return g

    def give_back(self, session):
        with self._lock:
            self._sessions.append(session)

    def close(self):
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
        close = getattr(self.model, "close", None)
        if close:
            close()


class Loader:
    """Verifies and loads models for the registry. `trust` is swapped on SIGHUP."""

    def __init__(self, cfg, trust):
        self.cfg = cfg
        self.trust = trust

    def load(self, name, path):
        """verify + map/validate; returns a LoadedModel (not yet warm). Raises EdgedError.

        The signature check is timed on its own (open_verified hashes the file); the engine then
        opens the model through open_verified again, which the verification cache answers
        without re-hashing an unchanged file (a replaced file misses the cache and is verified
        afresh), and maps that very descriptor up to the signed length."""

        cfg = self.cfg
        t0 = time.monotonic()
        try:
            verify.open_verified(path, self.trust, cfg.require_signature).close()
        except FileNotFoundError:
            raise RequestError(f"model {name!r} not found ({path})") from None
        except OSError as e:        # unreadable (mode, ownership, Landlock), I/O error
            raise EdgedError(f"model {name!r} cannot be opened ({path}): {e.strerror}") from None
        t1 = time.monotonic()
        checked = self.trust is not None or cfg.require_signature
        model = Model.load(path, n_threads=cfg.threads or None, numa=cfg.numa, mlock=cfg.mlock,
                           trusted_keys=self.trust if checked else None, require_signature=cfg.require_signature,
                           max_memory=cfg.memory_budget or None, n_ctx_plan=cfg.ctx_size,
                           cache_type_k=cfg.cache_type_k, cache_type_v=cfg.cache_type_v)
        t2 = time.monotonic()
        plan = model.memory_plan
        # weights once, a KV cache and scratch per slot
        size = plan.weights + cfg.n_parallel * (plan.kv_cache + plan.scratch)
        return LoadedModel(name, path, model, model.signer, size, {"verify": t1 - t0, "map": t2 - t1},
                           cfg.ctx_size, content_specials=bool({name, "*"} & set(cfg.content_special_tokens)))

    def warm(self, lm):
        """One forward pass so the first request does not pay for page faults and allocation."""
        t0 = time.monotonic()
        if lm.model.encoder is not None:        # an embedding model: no sessions
            if self.cfg.warmup:
                lm.model.embed([[lm.tokenizer.bos_id or 0]], pooling="cls")
            lm.timings["warmup"] = time.monotonic() - t0
            return
        s = lm.model.session(n_ctx=lm.n_ctx)
        if self.cfg.warmup:
            tok = lm.tokenizer.bos_id
            if tok is None or tok < 0:
                tok = 0
            s.eval([tok])
            s.reset()
        lm.give_back(s)
        lm.timings["warmup"] = time.monotonic() - t0

