"""Admin routes over named prompt prefixes, as llama-server's /slots/{id}?action=save|restore|erase
(service/prompt_store.py keeps the files):

    POST /v1/prefixes/save     {"model", "name", "prompt": TEXT | "messages": [...] | "tokens": [ids]}
        evaluates the prompt (what a session already holds is reused) and writes it to
        cache_dir as the named prefix, kept until erased (never evicted for cache_max_bytes
        before unnamed files)
    POST /v1/prefixes/restore  {"model", "name"}: puts the named prefix into an idle session
        now, so the next request starting with it does not wait for the disk
    POST /v1/prefixes/erase    {"name"}: deletes it
    GET  /v1/prefixes          the named prefixes: name, tokens, bytes

Requests whose prompt starts with a named prefix get it from disk anyway (the store's lookup);
these routes choose what is kept. They are admin routes (admin_uids/admin_gids). "messages" are
rendered by the model's chat template without the generation prompt (a system prompt as the
conversations that follow it begin).
"""
import asyncio
import os

from ..engine import statefile
from ..errors import HTTPError, RequestError
from .prompt_store import NAMED
from .scheduler import Busy
from .wire import Reply, json_body

PATHS = ("/v1/prefixes/save", "/v1/prefixes/restore", "/v1/prefixes/erase", "/v1/prefixes")


def routes(api):
    r = PrefixRoutes(api)
    return {("POST", "/v1/prefixes/save"): r.save, ("POST", "/v1/prefixes/restore"): r.restore,
            ("POST", "/v1/prefixes/erase"): r.erase, ("GET", "/v1/prefixes"): r.listing}


class PrefixRoutes:
    def __init__(self, api):
        self.api = api

    def _store(self):
        store = self.api.state.loader.store
        if store is None:
            raise HTTPError(409, "the prompt cache on disk is off (config cache_dir, cache_max_bytes)",
                            code="prompt_cache_off")
        return store

    def _body(self, req):
        body = json_body(req, self.api.state.cfg.max_body_bytes)
        if not isinstance(body, dict):
            raise RequestError("expected a JSON object")
        return body

    async def _with_session(self, req, name, ids, work):
        """work(lm, session) in a worker thread on a session of model `name` taken for `ids`."""
        api = self.api
        async with api._slot(req):
            lm = await api._acquire(name, api.state.cfg.queue_timeout, req)
            try:
                def run():
                    try:
                        s = lm.take_session(ids)
                    except Busy as e:
                        raise HTTPError(503, str(e), "server_error", "busy") from None
                    try:
                        return work(lm, s)
                    finally:
                        lm.give_back(s)
                return await asyncio.get_running_loop().run_in_executor(None, run)
            finally:
                api.state.registry.release(lm)

    async def save(self, req):
        store, body = self._store(), self._body(req)
        store.named_path(body.get("name"))      # a bad name: 400 before any work
        model = self.api.state.registry.resolve(body.get("model"))
        req.info["model"] = model
        given = [k for k in ("prompt", "messages", "tokens") if k in body]
        if len(given) != 1:
            raise RequestError("expected one of \"prompt\" (text), \"messages\" or \"tokens\"")

        def ids_of(lm):
            v = body[given[0]]
            if given[0] == "prompt" and isinstance(v, str):
                return lm.encode_text(v, add_special=True)
            if given[0] == "messages" and isinstance(v, list):
                return lm.encode_chat(v, add_generation_prompt=False)
            if given[0] == "tokens" and isinstance(v, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < lm.n_vocab for t in v):
                return list(v)
            raise RequestError(f"\"{given[0]}\": not a valid {given[0]}")
        lm = await self.api._acquire(model, self.api.state.cfg.queue_timeout, req)
        self.api.state.registry.release(lm)
        ids = await asyncio.get_running_loop().run_in_executor(None, ids_of, lm)
        if not 0 < len(ids) <= lm.n_ctx:
            raise RequestError(f"prompt of {len(ids)} tokens: must be 1..ctx_size ({lm.n_ctx})")

        def work(lm, s):
            s.truncate(s.common_prefix(ids))
            if s.n_past < len(ids):
                s.eval(ids[s.n_past:])
            if store.spill(s, name=body["name"]) is None:
                raise HTTPError(507, "the prefix could not be written (see the log: a full disk?)",
                                "server_error", "prompt_cache_write_failed")
            return Reply(200, {"name": body["name"], "model": model, "tokens": len(ids),
                               "bytes": store.named(body["name"]).size})
        return await self._with_session(req, model, ids, work)

    async def restore(self, req):
        store, body = self._store(), self._body(req)
        store.named_path(body.get("name"))
        entry = store.named(body["name"])
        if entry is None:
            raise HTTPError(404, f"no prefix named {body['name']!r}", code="not_found")
        model = self.api.state.registry.resolve(body.get("model"))
        req.info["model"] = model
        tokens = entry.tokens.tolist()

        def work(lm, s):
            if entry.model != statefile.model_digest(lm.model) or entry.n_ctx != s.n_ctx:
                raise HTTPError(409, f"prefix {body['name']!r} was saved for another model or "
                                f"ctx_size than {model!r}'s", code="prefix_mismatch")
            if s.common_prefix(tokens) < len(tokens) and store.restore(s, entry, len(tokens)) == 0:
                raise HTTPError(422, f"prefix {body['name']!r} was refused (see the log) and deleted",
                                code="cache_file_refused")
            return Reply(200, {"name": body["name"], "model": model, "tokens": len(tokens)})
        return await self._with_session(req, model, tokens, work)

    async def erase(self, req):
        store, body = self._store(), self._body(req)
        if not store.erase(body.get("name")):
            raise HTTPError(404, f"no prefix named {body.get('name')!r}", code="not_found")
        return Reply(200, {"name": body["name"], "erased": True})

    async def listing(self, req):
        store = self._store()
        data = [{"name": os.path.basename(e.path)[len(NAMED):-len(statefile.SUFFIX)], "tokens": len(e.tokens),
                 "bytes": e.size} for e in store.entries() if e.named]
        return Reply(200, {"object": "list", "data": sorted(data, key=lambda d: d["name"])})
