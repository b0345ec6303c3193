"""Turning a model file into something the daemon can serve: verify -> map/validate -> warm up.

The only module of the service that touches the engine, the text layer and signing. Each
phase is timed separately (the swap-latency split the README records). Everything here runs
in worker threads, never on the event loop.
"""
import json
import os
import threading
import time

from ..engine import statefile
from ..engine.model import Model
from ..engine.speculative import Speculation, check_vocab
from ..errors import ConfigError, EdgedError, RequestError
from ..text.chat import map_strings, template_for
from ..trust import verify
from . import images, prompt_store
from .scheduler import Busy


KEEP_EMBEDDINGS = 4     # image embeddings a model keeps for follow-up turns (gemma3: 2.6 MB each)


class LoadedModel:
    """A verified, mapped engine Model plus the per-daemon state the registry keeps for it."""

    def __init__(self, name, path, model, signer, size, timings, n_ctx, max_sessions=1,
                 content_specials=False, speculation=None, spm_infill=False):
        self.name, self.path, self.model = name, path, model
        # config speculative / draft_model: how its generations draft (None: off); a draft model
        # is closed with it
        self.speculation = speculation
        # config content_special_tokens lists this model: control-token text in messages counts
        self.content_specials = content_specials
        self.spm_infill = spm_infill    # config spm_infill lists it: FIM prompts suffix first
        self.signer = signer            # fingerprint of the key that signed it, None if unsigned
        self.projector = None           # engine.vision.Projector: its mmproj (config mmproj), None: no images
        self.image_limits = images.Limits()     # config image_max_bytes, image_max_pixels, image_dirs
        self._embeddings = {}           # sha256 of an image's bytes -> its ImageEmbedding (recent few)
        self.size = size                # bytes it needs: the engine's memory plan (weights, KV, scratch)
        self.max_sessions = max_sessions    # the sessions (KV cache + scratch) `size` counts
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
        self.keep_alive = None          # seconds idle before unloading (a request's, Ollama's); None: config's
        self._sessions = []             # idle Sessions (KV caches), reused for prefix caching
        self.store = None               # prompt_store.PromptStore: the prompt cache on disk
        self._open = 0                  # Sessions that exist, idle or in use: at most max_sessions
        self._closed = False
        self._template = None           # chat template source, read on first use
        self._piece_json = None         # piece_json(), made on first use
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

    def piece_json(self):
        """['{"id": ID, "piece": "TEXT"}'] for every token id (the /tokenize reply's items),
        made on first use."""
        if self._piece_json is None:
            piece = self.tokenizer.token_piece
            self._piece_json = [json.dumps({"id": i, "piece": piece(i).decode("utf-8", "replace")},
                                           ensure_ascii=False) for i in range(self.n_vocab)]
        return self._piece_json

    def encode_text(self, text, add_special=True, parse_special=False):
        return list(self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special))

    # --- images -------------------------------------------------------------------------
    def image_embeddings(self, refs):
        """The ImageEmbedding of each images.ImageRef: read within image_limits, decoded in the
        render worker's child, encoded by the projector. The same bytes again (a follow-up turn
        about the same picture) reuse the embedding, and with it the same prompt ids, so the
        KV prefix that holds the image is reused too."""
        if refs and self.projector is None:
            raise RequestError(f"'{refs[0].where}': model {self.name!r} takes no images: no mmproj is paired with it "
                               f"(config mmproj, or mmproj-{self.name}.gguf beside it in models_dir)",
                               param=refs[0].where)
        out = []
        for ref in refs:
            data = ref.read(self.image_limits)
            key = data.sha256
            emb = self._embeddings.get(key)
            if emb is None:
                emb = self.projector.encode(images.decode(data, self.image_limits.max_pixels).rgb)
                with self._lock:
                    self._embeddings[key] = emb
                    while len(self._embeddings) > KEEP_EMBEDDINGS:
                        del self._embeddings[next(iter(self._embeddings))]
            out.append(emb)
        return out

    def encode_chat_images(self, messages, embeddings, **template_vars):
        """encode_chat() of messages whose text holds images.MARKER once per image: each marker
        becomes its embedding's ids (the projector's prompt_ids). Control-token text in the
        messages stays plain text as in encode_chat (unless content_special_tokens lists it)."""
        if not self.content_specials:
            messages, template_vars = map_strings([messages, template_vars], self.tokenizer.defuse)
        text = self.model.chat_prompt(messages, template_file=self.template_file, **template_vars)
        ids = self.projector.prompt_ids(self.model, text, embeddings, marker=images.MARKER,
                                        marked=not self.content_specials)
        if len(ids) >= 2 and self.tokenizer.bos_id is not None and ids[0] == ids[1] == self.tokenizer.bos_id:
            del ids[0]      # the template wrote {{ bos_token }} and the tokenizer added one too
        return ids

    # --- sessions -----------------------------------------------------------------------
    # A model holds at most max_sessions sessions, idle (the prompt cache) or in use, as its
    # memory plan counts: the prompts of a prompt list and the choices of n > 1 that find none
    # free wait for one (the decode loop takes them as sessions come back), never more memory.

    def take_session(self, ids):
        """An idle session sharing the longest prefix with `ids` (prompt cache), a new one while
        fewer than max_sessions exist, else Busy (the decode loop tries again next step)."""
        with self._lock:
            best = max(self._sessions, key=lambda s: s.common_prefix(ids), default=None)
            if best is not None:
                self._sessions.remove(best)
                return self._from_disk(best, ids)
            if self._open >= self.max_sessions:
                raise Busy(f"model {self.name}: all {self.max_sessions} sessions in use")
            self._open += 1
        try:
            return self._from_disk(self.model.session(n_ctx=self.n_ctx), ids)
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def _from_disk(self, s, ids):
        """`s` ready for `ids`: what it holds beyond their common prefix spilled to disk when
        that is long (it is about to be overwritten), and a longer prefix of ids restored from
        disk when the store has one (prompt_store.py)."""
        store = self.store
        if store is None or not ids:
            return s
        cached = s.common_prefix(ids)
        entry, n = store.lookup(self.model, s.n_ctx, ids)
        if s.n_past - cached >= prompt_store.SPILL_MIN_TOKENS:
            store.spill(s)
        if n >= cached + prompt_store.RESTORE_MIN_GAIN:
            store.restore(s, entry, n)
        return s

    def fork_session(self, session, n):
        """Up to n copies of `session` (KV cache and tokens): as many as max_sessions leaves room
        for, after closing idle sessions (least recently used first) for it."""
        with self._lock:
            free = self.max_sessions - self._open
            k = max(min(n, free + len(self._sessions)), 0)
            evict = self._sessions[:max(k - free, 0)]
            del self._sessions[:len(evict)]
            self._open += k - len(evict)
        for s in evict:
            if self.store is not None:
                self.store.spill(s)
            s.close()
        forks = []
        try:
            for _ in range(k):
                forks.append(session.fork())
        finally:
            if len(forks) < k:
                with self._lock:
                    self._open -= k - len(forks)
        return forks

    def steps(self, session, ids, info, max_tokens, stop=(), sampler=None, speculative=True, images=()):
        """The request as steps for the decode loop: the engine Generation on `session` (its
        prompt, then one token per step, or several with the model's speculation unless the
        request opted out; service/scheduler.py drives it). The prompt prefix
        already in the session's KV cache is not evaluated again: info["cached"] gets its
        length, info["evaluated"] the prompt tokens to evaluate."""
        spec = self.speculation if speculative and max_tokens != 0 else None
        for emb in images:              # the rows its prompt's image ids stand for
            session.add_image(emb)
        g = session.start(ids, max_tokens=max_tokens, stop=stop, sampler=sampler, speculative=spec)
        info["cached"] = g.n_cached
        info["evaluated"] = g.n_pending
        return g

    def give_back(self, session):
        """A session its request is done with: kept idle for the prompt cache."""
        with self._lock:
            if not self._closed:
                self._sessions.append(session)
                return
            self._open -= 1
        session.close()

    def close(self):
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
            self._open -= len(sessions)
        for s in sessions:
            if self.store is not None:      # unload and shutdown: the prompt cache survives
                self.store.spill(s)
            s.close()
        close = getattr(self.model, "close", None)
        if close:
            close()
        draft = self.speculation.draft_model if self.speculation else None
        if draft is not None:
            draft.close()
        if self.projector is not None:
            self.projector.close()


class Loader:
    """Verifies and loads models for the registry. `trust` is swapped on SIGHUP."""

    def __init__(self, cfg, trust, store=None):
        self.cfg = cfg
        self.trust = trust
        self.store = store      # prompt_store.PromptStore, None: no prompt cache on disk

    def load(self, name, path):
        """verify + map/validate; returns a LoadedModel (not yet warm). Raises EdgedError.

        The model is opened once: open_verified hashes that descriptor (or answers from its
        cache for an unchanged file) and the engine maps the very same one, up to the signed
        length."""

        cfg = self.cfg
        t0 = time.monotonic()
        model, t_verify = self._open(name, path, cfg.memory_budget or None)
        size = self._size(model)
        speculation = None
        try:
            mode = cfg.speculative.get(name, cfg.speculative.get("*", "off"))
            if mode == "lookup":
                speculation = Speculation("lookup", cfg.draft_max, adapt=cfg.draft_adapt)
            elif mode == "draft" and model.encoder is None:
                speculation = self._draft(name, model, size)
                size += self._size(speculation.draft_model)
            projector = self._projector(name, path, model)
            if projector is not None:
                size += projector.memory_bytes
        except BaseException:
            if speculation is not None and speculation.draft_model is not None:
                speculation.draft_model.close()
            model.close()
            raise
        t2 = time.monotonic()
        lm = LoadedModel(name, path, model, model.signer, size, {"verify": t_verify, "map": t2 - t0 - t_verify},
                         cfg.ctx_size, max_sessions=cfg.n_parallel,
                         content_specials=bool({name, "*"} & set(cfg.content_special_tokens)),
                         speculation=speculation, spm_infill=bool({name, "*"} & set(cfg.spm_infill)))
        lm.projector, lm.image_limits = projector, images.Limits.of(cfg)
        if model.encoder is None and self.store is not None:
            lm.store = self.store
            statefile.model_digest(model)   # here, not on the decode thread (unsigned: hashed)
            statefile.build_id(model.backend)
        return lm

    def _open(self, name, path, max_memory):
        """Verify the signature of `path`, then map and validate it within max_memory bytes:
        (Model, seconds the verification took)."""
        cfg = self.cfg
        t0 = time.monotonic()
        try:
            vf = verify.open_verified(path, self.trust, cfg.require_signature)
        except FileNotFoundError:
            raise RequestError(f"model {name!r} not found ({path})") from None
        except OSError as e:        # unreadable (mode, ownership, Landlock), I/O error
            raise EdgedError(f"model {name!r} cannot be opened ({path}): {e.strerror}") from None
        t1 = time.monotonic()
        model = Model.load(path, n_threads=cfg.threads or None, numa=cfg.numa, mlock=cfg.mlock,
                           verified=vf, max_memory=max_memory, n_ctx_plan=cfg.ctx_size,
                           cache_type_k=cfg.cache_type_k, cache_type_v=cfg.cache_type_v)
        return model, t1 - t0

    def mmproj_path(self, name, path):
        """The mmproj file paired with model `name` (at `path`): config mmproj, else
        mmproj-NAME.gguf beside it when that exists, else None."""
        given = self.cfg.mmproj.get(name)
        return os.path.join(self.cfg.models_dir, given) if given else images.mmproj_beside(path)

    def _projector(self, name, path, model):
        """The Projector of model `name`'s mmproj, verified like a model (same trust store),
        checked against the model; None without one."""
        mmproj = self.mmproj_path(name, path)
        if mmproj is None:
            return None
        try:
            vf = verify.open_verified(mmproj, self.trust, self.cfg.require_signature)
        except FileNotFoundError:
            raise ConfigError(f"model {name!r}: its mmproj {mmproj} does not exist") from None
        except OSError as e:
            raise EdgedError(f"model {name!r}: its mmproj {mmproj} cannot be opened: {e.strerror}") from None
        from ..engine.vision import Projector
        proj = Projector.load(mmproj, n_threads=self.cfg.threads or None, verified=vf,
                              max_memory=self.cfg.memory_budget or None)
        try:
            proj.check_model(model)
        except BaseException:
            proj.close()
            raise
        return proj

    def _size(self, model):
        """Bytes a model needs: its weights once, a session (KV cache and scratch) per slot."""
        plan = model.memory_plan
        return plan.weights + self.cfg.n_parallel * (plan.kv_cache + plan.scratch)

    def _draft(self, name, model, size):
        """The Speculation of model `name` with its draft_model: verified and loaded like any
        model, within what `size` bytes of the target leave of the budget; same vocabulary."""
        cfg = self.cfg
        dname = cfg.draft_model.get(name)
        if not dname:
            raise ConfigError(f"model {name!r}: speculative = \"draft\" needs draft_model.{name}")
        budget = (cfg.memory_budget or model.budget or 0) - size
        if budget <= 0:
            raise ConfigError(f"model {name!r}: no memory budget left for its draft model {dname!r}")
        draft, _ = self._open(dname, os.path.join(cfg.models_dir, dname + ".gguf"), budget)
        try:
            check_vocab(model, draft)
            return Speculation("draft", cfg.draft_max, draft_model=draft, adapt=cfg.draft_adapt)
        except BaseException:
            draft.close()
            raise

    def warm(self, lm):
        """One forward pass so the first request does not pay for page faults and allocation."""
        t0 = time.monotonic()
        if lm.model.encoder is not None:        # an embedding model: no sessions
            if self.cfg.warmup:
                lm.model.embed([[lm.tokenizer.bos_id or 0]], pooling="cls")
            lm.timings["warmup"] = time.monotonic() - t0
            return
        s = lm.take_session(())
        if self.cfg.warmup:
            tok = lm.tokenizer.bos_id
            if tok is None or tok < 0:
                tok = 0
            s.eval([tok])
            s.reset()
        lm.give_back(s)
        lm.timings["warmup"] = time.monotonic() - t0

