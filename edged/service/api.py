"""Routes and dispatch: pure coroutines from an ApiRequest to a Reply or a StreamReply.

The route table maps each (method, path) to its handler; a handler checks the peer's rights,
parses the body with its wire protocol's module (service/openai.py), admits the request (a
generation slot, then a lease on the loaded model: service/scheduler.py, service/registry.py),
prepares the prompt in a worker thread (service/prepare.py), runs it as a generation job
(service/jobs.py) and hands the job to the protocol to render. No socket here (service/wire.py).
"""
import asyncio
import contextlib
import json
import time
import urllib.parse

from ..errors import ModelNotFound, NotReady, QueueTimeout, RequestError
from . import anthropic, infill, jobs, ollama, openai, openai_schema, prefix_routes, rerank, responses
from .jobs import Generation
from .log import log
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .names import check_model_name
from .prepare import prepare
from .wire import TCP_PEER, Reply, error_for, error_reply, json_body, reply_too_large, serialised


class Api:
    """Routes. `state` is the daemon: .cfg, .registry, .slots, .decoder, .metrics, .stopping."""

    ADMIN = {"/v1/models/load", "/v1/models/unload", *prefix_routes.PATHS}
    MODEL_PREFIX = "/v1/models/"

    def __init__(self, state):
        self.state = state
        self.routes = {
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/embeddings"): self.embeddings,
            ("POST", "/embedding"): self.llama_embedding,
            ("GET", "/v1/models"): self.models,
            ("GET", "/health"): self.health,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/tokenize"): self.tokenize,
            ("POST", "/detokenize"): self.detokenize,
            ("POST", "/v1/models/load"): self.load,
            ("POST", "/v1/models/unload"): self.unload,
        }
        self.routes.update(ollama.routes(self))
        self.routes.update(anthropic.routes(self))
        self.routes.update(prefix_routes.routes(self))
        routes, self.prefixes = responses.routes(self)    # prefixes: (method, PREFIX) -> handler of PREFIX{id}
        self.routes.update(routes)
        self.routes.update(rerank.routes(self))
        self.routes.update(infill.routes(self))

    def admitted(self, peer, path):
        """Peer-credential policy: allow_uids/allow_gids; admin routes admin_uids/admin_gids."""
        if peer is None:
            return True
        cfg = self.state.cfg
        keys = ("admin_uids", "admin_gids") if path in self.ADMIN else ("allow_uids", "allow_gids")
        if peer.uid in cfg.uids(keys[0]):
            return True
        gids = cfg.gids(keys[1])
        return peer.gid in gids or any(g in gids for g in peer.groups)

    async def handle(self, req):
        return self.shaped(req.path, await self._dispatch(req))

    @staticmethod
    def shaped(path, reply):
        """An error reply made before a route ran (404, 405, 403; the transport's 401, 408,
        413, 503) in the shape of the protocol `path` belongs to: Ollama's, Anthropic's, else
        OpenAI's as it is."""
        if ollama.owns(path):
            return ollama.reshaped(reply)
        if anthropic.owns(path):
            return anthropic.reshaped(reply)
        return reply

    async def _dispatch(self, req):
        handler = self.routes.get((req.method, req.path))
        if handler is None and req.method == "GET" and req.path.startswith(self.MODEL_PREFIX) \
                and req.path not in self.ADMIN:
            handler = self.model_info
        if handler is None:
            handler = self.prefixes.get((req.method, req.path[:req.path.rfind("/") + 1]))
        if handler is None:                     # PREFIX*/NAME: a route under one id
            head, _, name = req.path.rpartition("/")
            handler = self.prefixes.get((req.method, head[:head.rfind("/") + 1] + "*/" + name))
        if handler is None:
            if any(path == req.path for _, path in self.routes):
                return error_reply(405, f"method {req.method} not allowed on {req.path}", code="method_not_allowed")
            return error_reply(404, f"no route {req.method} {req.path}", code="not_found")
        if not self.admitted(req.peer, req.path):
            p = req.peer
            self.state.metrics.peer_refused += 1
            log.warning("refused %s %s from uid %d gid %d pid %d: not in %s", req.method, req.path, p.uid,
                        p.gid, p.pid, "admin_uids/admin_gids" if req.path in self.ADMIN else "allow_uids/allow_gids")
            return error_reply(403, f"uid {p.uid} may not use {req.path}", "permission_error", "forbidden")
        try:
            return await handler(req)
        except Exception as e:  # noqa: BLE001 - every error becomes an OpenAI-shaped reply
            return error_for(e)

    # --- info routes ------------------------------------------------------------------
    async def health(self, req):
        st = self.state
        if st.stopping:
            return error_reply(503, "shutting down", "server_error", "stopping")
        reg = st.registry
        loaded = [n for n, m in reg.models.items() if not m.draining]
        if not loaded:
            reason = f"loading model {reg.loading}" if reg.loading else "no model loaded"
            return error_reply(503, reason, "server_error", "not_ready")
        return Reply(200, {"status": "ok", "models": loaded, "loading": reg.loading,
                           "queue": st.slots.waiting, "in_flight": st.slots.busy})

    async def metrics(self, req):
        st = self.state
        live = {n: m for n, m in st.registry.models.items() if not m.draining}
        text = st.metrics.render(st.slots.waiting, st.slots.busy, live, st.slots.n)
        return Reply(200, text, content_type=METRICS_CONTENT_TYPE)

    async def models(self, req):
        return Reply(200, {"object": "list", "data": self.state.registry.listing()})

    async def model_info(self, req):
        """GET /v1/models/{id}: the model's entry of /v1/models."""
        name = check_model_name(urllib.parse.unquote(req.path[len(self.MODEL_PREFIX):]))
        for entry in self.state.registry.listing():
            if entry["id"] == name:
                return Reply(200, entry)
        raise ModelNotFound(f"model {name!r} not found in {self.state.cfg.models_dir}")

    # --- admin ------------------------------------------------------------------------
    async def load(self, req):
        body = json_body(req, self.state.cfg.max_body_bytes)
        name = self.state.registry.resolve(body.get("model") if isinstance(body, dict) else None)
        req.info["model"] = name
        lm = await self._acquire(name, self.state.cfg.queue_timeout)
        self.state.registry.release(lm)
        return Reply(200, {"model": name, "loaded": True, "signer": lm.signer,
                           "load_seconds": {k: round(v, 4) for k, v in lm.timings.items()}})

    async def unload(self, req):
        body = json_body(req, self.state.cfg.max_body_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise RequestError("expected {\"model\": NAME}")
        name = check_model_name(body["model"])
        req.info["model"] = name
        if name not in self.state.registry.models:
            raise ModelNotFound(f"model {name!r} is not loaded")
        await self.state.registry.unload(name)
        return Reply(200, {"model": name, "unloaded": True})

    # --- tokenizer routes -------------------------------------------------------------
    async def tokenize(self, req):
        body = json_body(req, self.state.cfg.max_body_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            raise RequestError("expected {\"content\": TEXT}")
        add_special = body.get("add_special", False)
        parse_special = body.get("parse_special", True)
        with_pieces = body.get("with_pieces", False)
        if not all(isinstance(x, bool) for x in (add_special, parse_special, with_pieces)):
            raise RequestError("'add_special', 'parse_special' and 'with_pieces' must be booleans")
        name = self.state.registry.resolve(body.get("model"))
        req.info["model"] = name
        cfg = self.state.cfg
        content = body["content"]
        if with_pieces and len(content) * 16 > cfg.max_reply_bytes:
            # a token is at least a byte of text and takes ~16+ bytes of reply with its piece
            raise reply_too_large(f"pieces of up to {len(content)} tokens", cfg.max_reply_bytes)
        async with self._slot(req):     # tokenizing a megabyte is work: queued like the rest
            lm = await self._acquire(name, cfg.queue_timeout, req)
            try:
                return await serialised(lambda: self._tokens(lm, name, content, add_special, parse_special,
                                                             with_pieces), cfg.max_reply_bytes)
            finally:
                self.state.registry.release(lm)

    @staticmethod
    def _tokens(lm, name, content, add_special, parse_special, with_pieces):
        ids = lm.encode_text(content, add_special, parse_special)
        if not with_pieces:
            return Reply(200, {"tokens": ids, "model": name})
        # each token's {"id", "piece"} as JSON, made once per model: a reply of 10^5 pieces is
        # then a join, not 10^5 dicts to build and serialise
        pieces = lm.piece_json()
        data = ('{"tokens": [' + ", ".join([pieces[t] for t in ids]) + '], "model": ' + json.dumps(name) + "}")
        return Reply(200, None, data=data.encode())

    async def detokenize(self, req):
        body = json_body(req, self.state.cfg.max_body_bytes)
        toks = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise RequestError("expected {\"tokens\": [ids]}")
        name = self.state.registry.resolve(body.get("model"))
        req.info["model"] = name
        async with self._slot(req):
            lm = await self._acquire(name, self.state.cfg.queue_timeout, req)
            try:
                bad = [t for t in toks if not 0 <= t < lm.n_vocab]
                if bad:
                    raise RequestError(f"token id {bad[0]} out of range (vocabulary of {lm.n_vocab})")
                return await serialised(lambda: Reply(200, {"content": lm.tokenizer.decode(toks), "model": name}),
                                        self.state.cfg.max_reply_bytes)
            finally:
                self.state.registry.release(lm)

    @contextlib.asynccontextmanager
    async def _slot(self, req):
        """A generation slot for the request's duration (first come, first served)."""
        await self.state.slots.acquire(self.state.cfg.queue_timeout, req.disconnected)
        try:
            yield
        finally:
            self.state.slots.release()

    async def _acquire(self, name, timeout, req=None):
        """The loaded model `name`; the peer of `req` must be allowed to cause its load (a TCP
        client counts as a peer with no uid or group: never admin, never in auto_load_allow)."""
        if self.state.stopping:
            raise NotReady("shutting down")
        peer = None if req is None else TCP_PEER if req.tcp and req.peer is None else req.peer
        if peer is not None:
            self.state.policy.check(self.state.cfg, self.state.registry, peer, name)
        try:
            return await asyncio.wait_for(self.state.registry.acquire(name), timeout)
        except asyncio.TimeoutError:
            raise QueueTimeout(f"timed out after {timeout:g}s waiting for model {name!r} to load") from None

    # --- embeddings -------------------------------------------------------------------
    async def embeddings(self, req):
        """POST /v1/embeddings (OpenAI): pooled, L2-normalised vectors, float or base64."""
        r, inputs = openai_schema.validate_embeddings(json_body(req, self.state.cfg.max_body_bytes))
        if r.pooling == "none":
            raise RequestError("pooling 'none' gives one vector per token, which is not "
                               "OpenAI-compatible: use POST /embedding", param="pooling")
        return await self._embed(req, r.model, inputs, r.pooling, lambda name, vecs, n: openai.embeddings_reply(
            name, vecs, n, r.dimensions, r.encoding_format))

    async def llama_embedding(self, req):
        """POST /embedding (llama-server): one vector per input, or per token when the pooling
        is none."""
        r, inputs = openai_schema.validate_embeddings(json_body(req, self.state.cfg.max_body_bytes),
                                                      llama=True)
        return await self._embed(req, r.model, inputs, r.pooling,
                                 lambda name, vecs, n: openai.llama_embedding_reply(vecs))

    async def _embed(self, req, model, inputs, pooling, reply, check=None):
        """The reply to an embeddings request: `reply(name, vectors, prompt tokens)` built and
        serialised off the event loop; queued like a completion, computed on the decode thread
        beside the generations (jobs.embed), each input bounded by ctx_size (and `check` of the
        token-id lists). Pooling "rank": a reranker's head outputs (service/rerank.py)."""
        st, cfg = self.state, self.state.cfg
        if st.stopping:
            raise NotReady("shutting down")
        name = st.registry.resolve(model)
        req.info.update(model=name, prompt_tokens=0, completion_tokens=0)
        t0 = time.monotonic()
        async with self._slot(req):
            lm = await self._acquire(name, max(cfg.queue_timeout - (time.monotonic() - t0), 0.001), req)
            try:
                m = lm.model
                pool = pooling or m.pooling
                if pool == "rank" and pooling is None:
                    raise RequestError(f"model {name!r} is a reranker: POST /v1/rerank, or ask "
                                       "for a 'pooling'", param="model")
                loop = asyncio.get_running_loop()
                seqs = await loop.run_in_executor(None, lambda: m.tokenize_inputs(inputs, limit=cfg.ctx_size))
                if check:
                    check(seqs)
                n = sum(len(s) for s in seqs)
                # what the reply's JSON will take, foreseen: ~12 bytes a value
                values = (n if pool == "none" else len(seqs)) * m.hp.n_embd
                if values * 12 > cfg.max_reply_bytes:
                    raise reply_too_large(f"{values} embedding values", cfg.max_reply_bytes)
                req.info["queue_ms"] = (time.monotonic() - t0) * 1e3
                vecs = await jobs.embed(st, lm, seqs, pool, req)
            finally:
                st.registry.release(lm)
        req.info["prompt_tokens"] = n
        return await serialised(lambda: reply(name, vecs, n), cfg.max_reply_bytes)

    # --- completions ------------------------------------------------------------------
    async def chat_completions(self, req):
        request = openai.parse(json_body(req, self.state.cfg.max_body_bytes), chat=True)
        return await openai.reply(await self.generate(req, request), req)

    async def completions(self, req):
        request = openai.parse(json_body(req, self.state.cfg.max_body_bytes), chat=False)
        return await openai.reply(await self.generate(req, request), req)

    async def generate(self, req, request):
        """Admit a GenerateRequest (slot, then model lease), prepare its prompts and start its
        generation job: a started Generation that the caller renders and closes."""
        st, cfg = self.state, self.state.cfg
        if st.stopping:
            raise NotReady("shutting down")
        name = st.registry.resolve(request.model)
        info = req.info
        info.update(model=name, prompt_tokens=0, completion_tokens=0)
        t0 = time.monotonic()
        await st.slots.acquire(cfg.queue_timeout, req.disconnected)
        gen = None
        try:
            lm = await self._acquire(name, max(cfg.queue_timeout - (time.monotonic() - t0), 0.001), req)
            try:
                lm.model.require_decoder()
                prep = await asyncio.get_running_loop().run_in_executor(None, prepare, lm, request)
                n_ctx = min(lm.n_ctx, request.output.context or lm.n_ctx)
                limit = min(cfg.prompt_limit(), n_ctx - 1)
                for ids in prep.prompts:
                    if len(ids) > limit:
                        raise RequestError(f"prompt of {len(ids)} tokens exceeds the limit of "
                                           f"{limit} (max_prompt_tokens / ctx_size / num_ctx)")
                bad = [t for t in [k for k, _ in request.sampling.logit_bias] +
                       [t for ids in prep.prompts for t in ids]
                       if not 0 <= t < lm.n_vocab and t not in prep.image_ids]
                if bad:
                    raise RequestError(f"token id {bad[0]} out of range (vocabulary of {lm.n_vocab})")
                room = n_ctx - max(len(ids) for ids in prep.prompts)
                asked = request.output.max_tokens
                max_tokens = min(asked or cfg.max_output_tokens, cfg.max_output_tokens, room)
                info["queue_ms"] = (time.monotonic() - t0) * 1e3
                gen = Generation(st, lm, prep, request, max_tokens)
            except BaseException:
                st.registry.release(lm)
                raise
        except BaseException:
            st.slots.release()
            raise
        info["prompt_tokens"] = sum(len(ids) for ids in prep.prompts)
        if cfg.log_prompts:
            prompts = request.prompts
            info["prompt"] = list(request.messages) if request.chat else (
                list(prompts) if len(prompts) > 1 else prompts[0])
        try:
            await gen.start(req)
        except BaseException:
            await gen.close()
            raise
        return gen
