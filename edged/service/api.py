"""Routing and handlers: pure coroutines from an ApiRequest to a Reply or a StreamReply.

No socket here: the transport turns an aiohttp request into an ApiRequest (method, path, body
bytes, peer credentials, a "client gone?" probe) and writes back what the handler returns, so
tests drive every route with plain objects. OpenAI's wire shapes: chat.completion(.chunk),
text_completion, errors as {"error": {"message", "type", "code"}}.
"""
import asyncio
import base64
import dataclasses
import json
import secrets
import threading
import time
import urllib.parse

import numpy as np

from ..errors import (EdgedError, HTTPError, ModelNotFound, NotReady, QueueTimeout, RequestError,
                      http_error)
from ..text import grammar, harmony, reasoning, tools
from ..text.sampling import Sampler, greedy_temperature
from . import requests
from .log import log
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .names import check_model_name
from .scheduler import Job


@dataclasses.dataclass
class Peer:
    pid: int
    uid: int
    gid: int
    groups: tuple = ()


TCP_PEER = Peer(0, -1, -1)      # what the load policy sees of a TCP client


@dataclasses.dataclass
class ApiRequest:
    method: str
    path: str
    body: bytes = b""
    peer: Peer | None = None                  # None: not a Unix-socket peer (tests may leave it out)
    disconnected: object = lambda: False      # () -> bool, True once the client has gone
    info: dict = dataclasses.field(default_factory=dict)   # filled by handlers for the request log line
    tcp: bool = False                         # over the opt-in TCP listener (an API key admitted it)


@dataclasses.dataclass
class Reply:
    status: int
    body: object                               # dict (JSON) or str (text)
    headers: dict = dataclasses.field(default_factory=dict)
    content_type: str = "application/json"

    def payload(self):
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body, ensure_ascii=False).encode()


class StreamReply:
    """Server-sent events. Iterate `chunks()` for the bytes; `close()` always (idempotent)."""
    status = 200
    content_type = "text/event-stream"

    def __init__(self, chunks, close):
        self.headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        self._chunks, self._close = chunks, close

    def chunks(self):
        return self._chunks

    async def close(self):
        await self._close()


def error_reply(status, message, type_="invalid_request_error", code=None, headers=None, param=None):
    return Reply(status, {"error": {"message": message, "type": type_, "param": param, "code": code}},
                 headers=dict(headers or {}))


def error_for(e):
    """Map an exception to an OpenAI-shaped error reply."""
    status, type_, code, headers = http_error(e)
    if not isinstance(e, EdgedError):
        log.exception("internal error: %s", e)
        return error_reply(status, f"internal error: {type(e).__name__}", type_, code)
    return error_reply(status, str(e), type_, code, headers, param=getattr(e, "param", None))


# --- request validation --------------------------------------------------------------------

def _tool(t):
    """A request's tool as chat templates see it: `description` and `parameters` are optional
    in OpenAI's API but templates read them unguarded (gpt-oss's `tool.description`), so absent
    ones become "" and {} (what llama-server hands its templates)."""
    d = t.model_dump(exclude_none=True)
    d["function"].setdefault("description", "")
    d["function"].setdefault("parameters", {})
    return d


def parse_params(body, chat):
    """Validate an OpenAI request body (requests.py); returns a dict of generation parameters."""
    r = requests.validate(body, chat)
    p = {"model": r.model, "stream": r.stream,
         "include_usage": bool(r.stream_options and r.stream_options.include_usage),
         "max_tokens": r.max_completion_tokens or r.max_tokens,
         "temperature": greedy_temperature(float(r.temperature)), "top_p": float(r.top_p), "top_k": r.top_k,
         "min_p": float(r.min_p), "presence_penalty": float(r.presence_penalty),
         "frequency_penalty": float(r.frequency_penalty), "repeat_penalty": float(r.repeat_penalty),
         "penalty_last_n": r.penalty_last_n, "seed": r.seed, "n": r.n,
         "stop": [r.stop] if isinstance(r.stop, str) else list(r.stop or []),
         "logit_bias": {int(k): float(v) for k, v in (r.logit_bias or {}).items()},
         "constraint": _constraint_source(r)}
    if chat:
        p["messages"] = [_message(m) for m in r.messages]
        p["logprobs"] = (r.top_logprobs or 0) if r.logprobs else None
        p["tools"] = [_tool(t) for t in r.tools or ()]
        tc = r.tool_choice
        p["tool_choice"] = tc.function.name if isinstance(tc, requests.NamedToolChoice) else (
            tc or ("auto" if p["tools"] else "none"))
        p["parallel_tool_calls"] = r.parallel_tool_calls
        p["template_kwargs"] = dict(r.chat_template_kwargs or {})
        if r.reasoning_effort is not None:
            p["template_kwargs"].setdefault("reasoning_effort", r.reasoning_effort)
        p["reasoning"] = r.reasoning_format != "none"
    else:
        p["logprobs"] = r.logprobs
        prompts = r.prompt
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        p["prompts"] = [list(x) if isinstance(x, list) else x for x in prompts]
        if len(p["prompts"]) * r.n > requests.MAX_N:
            raise RequestError(f"{len(p['prompts'])} prompts x n={r.n} choices exceed {requests.MAX_N} "
                               "choices per request", param="prompt")
    return p


def _constraint_source(r):
    """("json_schema", schema) / ("grammar", text) from response_format, grammar or json_schema."""
    rf = r.response_format
    if rf is not None and rf.type == "json_object":
        return ("json_schema", rf.schema_ or {"type": "object"}, "response_format")
    if rf is not None and rf.type == "json_schema":
        return ("json_schema", rf.json_schema.schema_, "response_format.json_schema.schema")
    if r.json_schema is not None:
        return ("json_schema", r.json_schema, "json_schema")
    if r.grammar is not None:
        return ("grammar", r.grammar, "grammar")
    return None


def _message(m):
    """A validated message as the chat template gets it."""
    content = m.content
    if isinstance(content, list):
        content = "".join(part.text for part in content)
    out = {"role": "system" if m.role == "developer" else m.role,
           "content": "" if content is None else content}
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
    return out


def _json_body(req, limit):
    if len(req.body) > limit:
        raise HTTPError(413, f"request body of {len(req.body)} bytes exceeds max_body_bytes={limit}",
                        code="body_too_large")
    if not req.body:
        raise RequestError("request body is empty: expected a JSON object")
    try:
        return json.loads(req.body)
    except (UnicodeDecodeError, ValueError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    except RecursionError:      # "[[[[..." deeper than the interpreter's stack
        raise RequestError("request body is not valid JSON: nested too deeply") from None


def _sse(obj):
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


# --- the API -------------------------------------------------------------------------------

class Api:
    """Routes. `state` is the daemon: .cfg, .registry, .slots, .decoder, .metrics, .stopping."""

    ADMIN = {"/v1/models/load", "/v1/models/unload"}
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
        handler = self.routes.get((req.method, req.path))
        if handler is None and req.method == "GET" and req.path.startswith(self.MODEL_PREFIX) \
                and req.path not in self.ADMIN:
            handler = self.model_info
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
        text = st.metrics.render(st.slots.waiting, st.slots.busy, list(live), st.slots.n,
                                 {n: m.kv_cache() for n, m in live.items()})
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
        body = _json_body(req, self.state.cfg.max_body_bytes)
        name = self.state.registry.resolve(body.get("model") if isinstance(body, dict) else None)
        req.info["model"] = name
        lm = await self._acquire(name, self.state.cfg.queue_timeout)
        self.state.registry.release(lm)
        return Reply(200, {"model": name, "loaded": True, "signer": lm.signer,
                           "load_seconds": {k: round(v, 4) for k, v in lm.timings.items()}})

    async def unload(self, req):
        body = _json_body(req, self.state.cfg.max_body_bytes)
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
        body = _json_body(req, self.state.cfg.max_body_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            raise RequestError("expected {\"content\": TEXT}")
        add_special = body.get("add_special", False)
        parse_special = body.get("parse_special", True)
        with_pieces = body.get("with_pieces", False)
        if not all(isinstance(x, bool) for x in (add_special, parse_special, with_pieces)):
            raise RequestError("'add_special', 'parse_special' and 'with_pieces' must be booleans")
        name = self.state.registry.resolve(body.get("model"))
        req.info["model"] = name
        lm = await self._acquire(name, self.state.cfg.queue_timeout, req)
        try:
            ids = await asyncio.get_running_loop().run_in_executor(
                None, lambda: lm.encode_text(body["content"], add_special, parse_special))
            if with_pieces:
                tokens = [{"id": t, "piece": lm.tokenizer.token_piece(t).decode("utf-8", "replace")} for t in ids]
            else:
                tokens = ids
        finally:
            self.state.registry.release(lm)
        return Reply(200, {"tokens": tokens, "model": name})

    async def detokenize(self, req):
        body = _json_body(req, self.state.cfg.max_body_bytes)
        toks = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise RequestError("expected {\"tokens\": [ids]}")
        name = self.state.registry.resolve(body.get("model"))
        req.info["model"] = name
        lm = await self._acquire(name, self.state.cfg.queue_timeout, req)
        try:
            bad = [t for t in toks if not 0 <= t < lm.n_vocab]
            if bad:
                raise RequestError(f"token id {bad[0]} out of range (vocabulary of {lm.n_vocab})")
            text = await asyncio.get_running_loop().run_in_executor(None, lm.tokenizer.decode, toks)
        finally:
            self.state.registry.release(lm)
        return Reply(200, {"content": text, "model": name})

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
        r, inputs = requests.validate_embeddings(_json_body(req, self.state.cfg.max_body_bytes))
        if r.pooling == "none":
            raise RequestError("pooling 'none' gives one vector per token, which is not "
                               "OpenAI-compatible: use POST /embedding", param="pooling")
        name, vecs, n_tokens = await self._embed(req, r.model, inputs, r.pooling)
        if isinstance(vecs, list):      # the model's own pooling type is none (llama-server too)
            raise RequestError(f"model {name!r} has no pooling type (<arch>.pooling_type): "
                               "ask for one with 'pooling' (mean, cls or last)", param="pooling")
        if r.dimensions is not None:
            if r.dimensions > vecs.shape[1]:
                raise RequestError(f"'dimensions' {r.dimensions} is more than the model's "
                                   f"{vecs.shape[1]}", param="dimensions")
            # OpenAI's text-embedding-3 shortening: the first values, normalised again
            vecs = vecs[:, :r.dimensions]
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-30)
        vecs = vecs.astype("<f4")
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if r.encoding_format == "base64"
                 else v.tolist()} for i, v in enumerate(vecs)]
        return Reply(200, {"object": "list", "data": data, "model": name,
                           "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    async def llama_embedding(self, req):
        """POST /embedding (llama-server): [{"index", "embedding": [vector]}], one vector per
        token (not normalised) when the pooling is none."""
        r, inputs = requests.validate_embeddings(_json_body(req, self.state.cfg.max_body_bytes),
                                                 llama=True)
        _, vecs, _ = await self._embed(req, r.model, inputs, r.pooling)
        return Reply(200, [{"index": i, "embedding": v.tolist() if v.ndim == 2 else [v.tolist()]}
                           for i, v in enumerate(vecs)])

    async def _embed(self, req, model, inputs, pooling):
        """(name, vectors, prompt tokens) of `inputs` on the model; queued like a completion."""
        st, cfg = self.state, self.state.cfg
        if st.stopping:
            raise NotReady("shutting down")
        name = st.registry.resolve(model)
        req.info.update(model=name, prompt_tokens=0, completion_tokens=0)
        t0 = time.monotonic()
        await st.slots.acquire(cfg.queue_timeout, req.disconnected)
        try:
            lm = await self._acquire(name, max(cfg.queue_timeout - (time.monotonic() - t0), 0.001), req)
            try:
                m = lm.model
                pool = pooling or m.pooling

                def run():
                    seqs = m.tokenize_inputs(inputs)
                    return seqs, m.embed(seqs, pooling=pool, normalize=pool != "none")
                req.info["queue_ms"] = (time.monotonic() - t0) * 1e3
                seqs, vecs = await asyncio.get_running_loop().run_in_executor(None, run)
            finally:
                st.registry.release(lm)
        finally:
            st.slots.release()
        req.info["prompt_tokens"] = n = sum(len(s) for s in seqs)
        return name, vecs, n

    # --- completions ------------------------------------------------------------------
    async def chat_completions(self, req):
        return await self._complete(req, chat=True)

    async def completions(self, req):
        return await self._complete(req, chat=False)

    async def _complete(self, req, chat):
        st, cfg = self.state, self.state.cfg
        p = parse_params(_json_body(req, cfg.max_body_bytes), chat)
        if st.stopping:
            raise NotReady("shutting down")
        name = st.registry.resolve(p["model"])
        info = req.info
        info.update(model=name, prompt_tokens=0, completion_tokens=0)
        t0 = time.monotonic()
        await st.slots.acquire(cfg.queue_timeout, req.disconnected)
        gen = None
        try:
            lm = await self._acquire(name, max(cfg.queue_timeout - (time.monotonic() - t0), 0.001), req)
            try:
                lm.model.require_decoder()
                prep = await asyncio.get_running_loop().run_in_executor(None, _prepare, lm, p, chat)
                limit = min(cfg.prompt_limit(), lm.n_ctx - 1)
                for ids in prep.prompts:
                    if len(ids) > limit:
                        raise RequestError(f"prompt of {len(ids)} tokens exceeds the limit of "
                                           f"{limit} (max_prompt_tokens / ctx_size)")
                bad = [t for t in list(p["logit_bias"]) + [t for ids in prep.prompts for t in ids]
                       if not 0 <= t < lm.n_vocab]
                if bad:
                    raise RequestError(f"token id {bad[0]} out of range (vocabulary of {lm.n_vocab})")
                room = lm.n_ctx - max(len(ids) for ids in prep.prompts)
                max_tokens = min(p["max_tokens"] or cfg.max_output_tokens, cfg.max_output_tokens, room)
                info["queue_ms"] = (time.monotonic() - t0) * 1e3
                gen = _Generation(self, lm, prep, p, max_tokens, chat)
            except BaseException:
                st.registry.release(lm)
                raise
        except BaseException:
            st.slots.release()
            raise
        info["prompt_tokens"] = sum(len(ids) for ids in prep.prompts)
        if cfg.log_prompts:
            info["prompt"] = p["messages"] if chat else (p["prompts"] if len(p["prompts"]) > 1 else p["prompts"][0])
        try:
            await gen.start(req)
        except BaseException:
            await gen.close()
            raise
        if p["stream"]:
            return StreamReply(gen.sse(req), gen.close)
        try:
            return await gen.collect(req)
        finally:
            await gen.close()


# --- preparing a generation (worker thread) -------------------------------------------------

@dataclasses.dataclass
class _Prepared:
    prompts: list                   # token ids per prompt
    family: str | None = None       # tool-call family when tools are on
    tools: list = dataclasses.field(default_factory=list)   # the tools offered (their schemas)
    think: bool = False             # split <think> reasoning out
    think_inside: bool = False      # the prompt opened the think block
    harmony: bool = False           # gpt-oss's channels: analysis / final / calls (text/harmony.py)
    constraint: object = None       # grammar.Constraint in its start state (each choice a copy)
    what: str = ""                  # the field the grammar came from (errors name it)


_RESERVED_TEMPLATE_VARS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                           "max_chars", "max_seconds", "template_file", "template_name"}


def _prepare(lm, p, chat):
    """Prompt ids, tool-call family, reasoning split and grammar of a request (worker thread:
    template rendering and grammar compilation take milliseconds to a second)."""
    tok = lm.tokenizer
    prep = _Prepared([])
    constraint = p["constraint"]
    if chat:
        template = lm.template_source()
        messages = tools.messages_for_template(p["messages"])
        prep.harmony = harmony.is_harmony(template)
        if prep.harmony:
            messages = harmony.messages_for_template(messages)
        kwargs = p["template_kwargs"]
        bad = sorted(k for k in kwargs if k in _RESERVED_TEMPLATE_VARS or not k.isidentifier())
        if bad:
            raise RequestError(f"'chat_template_kwargs' may not set {', '.join(bad)}",
                               param="chat_template_kwargs")
        use = p["tools"] if p["tool_choice"] != "none" else []
        if p["tool_choice"] not in ("none", "auto", "required"):
            use = [t for t in use if t["function"]["name"] == p["tool_choice"]]
        if use:
            prep.family = tools.family_of(template)
            prep.tools = use
            if tools.template_takes_tools(template):
                kwargs = dict(kwargs, tools=use)
            else:
                note = tools.generic_system_prompt(use, required=p["tool_choice"] != "auto")
                if messages[0]["role"] == "system":
                    messages = [dict(messages[0], content=messages[0]["content"] + "\n\n" + note)] + messages[1:]
                else:
                    messages = [{"role": "system", "content": note}] + messages
            if p["tool_choice"] != "auto":
                # a named function is called once; "required" may call several unless told not to
                parallel = p["parallel_tool_calls"] and p["tool_choice"] == "required"
                constraint = ("lark", tools.call_grammar(
                    prep.family, use, parallel=parallel,
                    args_style=tools.mistral_args_style(template), token=_special_token(tok)), "tools")
        ids = lm.encode_chat(messages, **kwargs)
        prep.prompts.append(ids)
        prep.think = p["reasoning"] and (prep.harmony or reasoning.OPEN in template)
        if prep.think and not prep.harmony:
            prep.think_inside = reasoning.starts_inside(tok.decode(ids[-8:], special=True))
    else:
        for prompt in p["prompts"]:
            prep.prompts.append(prompt if isinstance(prompt, list)
                                else lm.encode_text(prompt, add_special=True, parse_special=False))
    if constraint is not None:
        kind, source, prep.what = constraint
        g = (grammar.from_json_schema(source, prep.what) if kind == "json_schema" else
             grammar.from_grammar(source, prep.what) if kind == "grammar" else
             grammar.from_lark(source, prep.what))
        grammar.check(g, tok, lm.model.n_vocab, prep.what)
        prep.constraint = grammar.Constraint(g, tok, lm.model.n_vocab, prep.what)
    return prep


def _special_token(tok):
    """text -> `<[id]>` (llguidance's token syntax) when text is one control token."""
    def token(text):
        ids = tok.encode(text, add_special=False, parse_special=True)
        return f"<[{ids[0]}]>" if len(ids) == 1 and tok.is_control(ids[0]) else None
    return token


# --- one request's choices on the decode thread ---------------------------------------------

class _Steps:
    """A choice's engine Generation as the decode thread steps it (service/scheduler.py):
    session, prefilling, n_pending and entry() pass through; accept() also takes the logprob records of
    the token just drawn, so they ride along with it."""
    __slots__ = ("gen", "sampler")

    def __init__(self, gen, sampler):
        self.gen, self.sampler = gen, sampler

    @property
    def session(self):
        return self.gen.session

    @property
    def prefilling(self):
        return self.gen.prefilling

    @property
    def n_pending(self):
        return self.gen.n_pending

    def entry(self, budget=None):
        return self.gen.entry(budget)

    def accept(self, logits):
        out = self.gen.accept(logits)
        return None if out is None else _Out(out, self.sampler.take_records())


class _Out:
    """What a choice's generator posts: the engine's output plus the logprob records of its
    token (taken on the decode thread, right after the draw)."""
    __slots__ = ("text", "token", "finish_reason", "records")

    def __init__(self, out, records):
        self.text, self.token, self.finish_reason = out.text, out.token, out.finish_reason
        self.records = records


class _Choice:
    """One choice: its sampler, job, text so far and the streaming splitters."""

    def __init__(self, index, prompt, sampler, prep, tok):
        self.index, self.prompt, self.sampler, self.tok = index, prompt, sampler, tok
        self.job = None
        self.pieces = []
        self.n_gen = 0
        self.finish = None
        self.records = []           # (token, logprob, top) of every generated token
        self.unsent = []            # records not yet in a stream chunk
        self.done = False
        self.prep = prep
        self.harmony = harmony.HarmonyStream(prep.think, bool(prep.family)) if prep.harmony else None
        self.think = reasoning.ThinkSplitter(prep.think_inside) if prep.think and not self.harmony else None
        self.calls = tools.StreamSplitter(prep.family, prep.tools) if prep.family and not self.harmony else None

    def add(self, out):
        eog = self.tok.eog_ids
        recs = [r for r in (out.records or ()) if r[0] not in eog]
        self.records += recs
        self.unsent += recs
        if out.token is not None:
            self.n_gen += 1
        self.pieces.append(out.text or "")

    def stream_delta(self, text):
        """(reasoning delta, content delta) of newly generated text."""
        if self.harmony:
            return self.harmony.push(text)
        r, c = self.think.push(text) if self.think else ("", text)
        if self.calls:
            c = self.calls.push(c)
        return r, c

    def stream_end(self):
        """(reasoning, content, calls) left at the end of a stream."""
        if self.harmony:
            r, c, pairs = self.harmony.finish()
            return r, c, [tools.make_call(name, args) for name, args in pairs]
        r, c = self.think.flush() if self.think else ("", "")
        calls = []
        if self.calls:
            c = self.calls.push(c)
            rest, calls = self.calls.finish()
            c += rest
        return r, c, calls

    def result(self):
        """(reasoning or None, content, calls) of the whole reply."""
        text = "".join(self.pieces)
        if self.harmony:
            r, c, pairs = harmony.parse(text, self.prep.think, bool(self.prep.family))
            return r, c, [tools.make_call(name, args) for name, args in pairs]
        r, c = reasoning.split(text, self.prep.think_inside) if self.think else (None, text)
        calls = []
        if self.calls:
            c, calls = tools.parse(self.prep.family, c, self.prep.tools)
        return r, c, calls

    def finish_reason(self, calls):
        return "tool_calls" if calls and self.finish == "stop" else self.finish


def _delta(reasoning_text, content, calls=()):
    """A chat stream delta with what is non-empty: reasoning, content, tool calls (indexed)."""
    delta = {}
    if reasoning_text:
        delta["reasoning_content"] = reasoning_text
    if content:
        delta["content"] = content
    if calls:
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(calls)]
    return delta


def _piece(tok, t):
    b = tok.token_piece(t)
    return b.decode("utf-8", "replace"), list(b)


def chat_logprobs(tok, records):
    """OpenAI's chat `logprobs` object for (token, logprob, top) records."""
    content = []
    for t, lp, top in records:
        text, raw = _piece(tok, t)
        alts = []
        for i, l in top:
            s, b = _piece(tok, i)
            alts.append({"token": s, "logprob": l, "bytes": b})
        content.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": alts})
    return {"content": content, "refusal": None}


def completion_logprobs(tok, records, offset=0):
    """OpenAI's (legacy) completions `logprobs` object; text_offset counts from `offset`."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, lp, top in records:
        text, _ = _piece(tok, t)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({_piece(tok, i)[0]: l for i, l in top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


class _Generation:
    """One admitted request: owns a slot and a model lease until the decode thread let go of
    every choice. Choices of one prompt share its evaluation (n > 1: the KV cache is copied)."""

    def __init__(self, api, lm, prep, p, max_tokens, chat):
        self.api, self.lm, self.prep, self.p, self.max_tokens, self.chat = api, lm, prep, p, max_tokens, chat
        self.st = api.state
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self._released = False
        self._jobs_left = 1             # start() holds the slot and lease until its jobs are in
        self._pumps = []
        self._merged = asyncio.Queue()
        self.t_start = time.monotonic()
        self.t_first = None
        self.prefill = {}               # "cached": prompt tokens found in the slot's KV cache
        self.req = None
        tok, nv = lm.tokenizer, lm.model.n_vocab
        self.choices = []
        n = p["n"]
        for pi, ids in enumerate(prep.prompts):
            for j in range(n):
                seed = None if p["seed"] is None else (p["seed"] + j) & 0xFFFFFFFFFFFFFFFF
                constraint = prep.constraint.copy() if prep.constraint is not None else None
                sampler = Sampler(nv, temperature=p["temperature"], top_k=p["top_k"], top_p=p["top_p"],
                                  min_p=p["min_p"], seed=seed, repeat_penalty=p["repeat_penalty"],
                                  presence_penalty=p["presence_penalty"],
                                  frequency_penalty=p["frequency_penalty"],
                                  penalty_last_n=p["penalty_last_n"], logit_bias=p["logit_bias"] or None,
                                  constraint=constraint, logprobs=p["logprobs"])
                self.choices.append(_Choice(pi * n + j, pi, sampler, prep, tok))

    # --- jobs --------------------------------------------------------------------------
    def _submit(self, make_gen, finish):
        loop = asyncio.get_running_loop()

        def done():        # decode thread: the job's sessions are free again
            try:
                finish()
            finally:
                loop.call_soon_threadsafe(self._job_ended)

        job = Job(loop, make_gen, done, time.monotonic() + self.st.cfg.request_timeout)
        self._jobs_left += 1
        self.st.decoder.submit(job)
        return job

    def _job_ended(self):
        self._jobs_left -= 1
        if self._jobs_left == 0:        # every job let go of its sessions
            self._release()

    def _steps(self, choice, session, info):
        job = choice.job
        job.session = session           # the decode loop batches it with the other streams
        gen = self.lm.steps(session, self.prep.prompts[choice.prompt], info,
                            max_tokens=self.max_tokens, stop=self.p["stop"], sampler=choice.sampler)
        return _Steps(gen, choice.sampler)

    async def start(self, req):
        self.req = req
        n = self.p["n"]
        try:
            for pi, ids in enumerate(self.prep.prompts):
                group = self.choices[pi * n:(pi + 1) * n]
                info = self.prefill if pi == 0 else {}
                if n == 1:
                    self._start_single(group[0], ids, info)
                else:
                    sessions = await self._fork(ids, n, info)
                    for j, (c, s) in enumerate(zip(group, sessions)):
                        self._start_on(c, s, {}, keep=j == 0)     # fork() filled `info`
        finally:
            for c in self.choices:
                if c.job is not None:
                    self._pumps.append(asyncio.get_running_loop().create_task(self._pump(c)))
            self._job_ended()           # start()'s own hold

    def _start_single(self, choice, ids, info):
        lm, box = self.lm, []

        def make_gen():
            s = lm.take_session(ids)
            box.append(s)
            return self._steps(choice, s, info)

        def finish():
            for s in box:
                lm.give_back(s)

        choice.job = self._submit(make_gen, finish)

    def _start_on(self, choice, session, info, keep):
        lm = self.lm
        choice.job = self._submit(lambda: self._steps(choice, session, info),
                                  lambda: lm.give_back(session) if keep else session.close())

    async def _fork(self, ids, n, info):
        """Evaluate the prompt once (a job of its own), then fork its session n - 1 times (a
        worker thread copies the KV cache): n sessions that each hold the prompt."""
        lm, box, gens, lock = self.lm, [], [], threading.Lock()
        state = {"ended": False, "abandoned": False}

        def make_gen():
            s = lm.take_session(ids)
            box.append(s)
            gens.append(lm.steps(s, ids, info, max_tokens=0))
            return gens[0]

        def finish():           # decode thread: the job let go of box[0]
            with lock:
                state["ended"] = True
                if state["abandoned"]:
                    for s in box:
                        lm.give_back(s)

        job = self._submit(make_gen, finish)
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "error":
                    raise value
                if kind == "done":
                    break
            if not gens or gens[0].finish_reason != "length":   # max_tokens=0: the prompt is in
                raise NotReady(f"prompt evaluation ended early ({value})")
            s0 = box[0]
            forks = await asyncio.get_running_loop().run_in_executor(
                None, lambda: [s0.fork() for _ in range(n - 1)])
        except BaseException:
            job.cancel.set()
            with lock:
                state["abandoned"] = True
                if state["ended"]:
                    for s in box:
                        lm.give_back(s)
            raise
        return [s0] + forks

    async def _pump(self, choice):
        while True:
            kind, value = await choice.job.events.get()
            await self._merged.put((choice, kind, value))
            if kind in ("done", "error"):
                return

    def _release(self):
        if not self._released:
            self._released = True
            self.st.registry.release(self.lm)
            self.st.slots.release()

    async def close(self):
        """Stop generating (if still running) and wait until the decode thread let go."""
        for c in self.choices:
            if c.job is not None and not c.done:
                c.job.cancel.set()
        if self._pumps:
            await asyncio.gather(*self._pumps, return_exceptions=True)
        if self.req is None:            # never started
            self._release()
            return
        info = self.req.info
        n_gen = sum(c.n_gen for c in self.choices)
        finishes = {c.finish or "cancelled" for c in self.choices}
        info.update(completion_tokens=n_gen, finish=",".join(sorted(finishes)))
        if "cached" in self.prefill:
            info["cached_tokens"] = self.prefill["cached"]
        if "evaluated" in self.prefill:
            info["prompt_eval"] = self.prefill["evaluated"]
        elapsed = time.monotonic() - self.t_start
        if self.t_first is not None:
            info["ttft_ms"] = (self.t_first - self.t_start) * 1e3
        info["gen_ms"] = elapsed * 1e3
        self.st.metrics.tokens(info.get("prompt_tokens", 0), n_gen, elapsed)
        if self.st.cfg.log_prompts:
            replies = ["".join(c.pieces) for c in self.choices]
            info["reply"] = replies if len(replies) > 1 else replies[0]

    async def events(self, req):
        """(choice, text, finish_reason) until every choice ended; cancels the jobs if the
        client goes away."""
        left = len(self.choices)
        while left:
            choice, kind, value = await self._merged.get()
            if kind == "token":
                if self.t_first is None:
                    self.t_first = time.monotonic()
                choice.add(value)
                if req.disconnected():
                    for c in self.choices:
                        c.job.cancel.set()
                yield choice, value.text or "", None
            elif kind == "done":
                # engine: "stop"/"length"; decoder: "cancelled" (client gone), "abort" (shutdown
                # drain timed out), None (generator ended without a reason)
                choice.done = True
                left -= 1
                choice.finish = {"stop": "stop", "length": "length", "cancelled": "cancelled",
                                 "abort": "length"}.get(value, "stop")
                yield choice, "", choice.finish
            else:
                choice.done = True
                choice.finish = "error"
                raise value

    def usage(self):
        n = sum(len(ids) for ids in self.prep.prompts)
        g = sum(c.n_gen for c in self.choices)
        u = {"prompt_tokens": n, "completion_tokens": g, "total_tokens": n + g}
        if "cached" in self.prefill:
            # prompt tokens found in the slot's KV cache (a follow-up turn evaluates only the new ones)
            u["prompt_tokens_details"] = {"cached_tokens": self.prefill["cached"]}
        return u

    def _logprobs(self, records, offset=0):
        if self.p["logprobs"] is None:
            return None
        tok = self.lm.tokenizer
        return chat_logprobs(tok, records) if self.chat else completion_logprobs(tok, records, offset)

    async def collect(self, req):
        async for _ in self.events(req):
            pass
        choices = []
        for c in self.choices:
            r, content, calls = c.result()
            fin = c.finish_reason(calls)
            if self.chat:
                msg = {"role": "assistant", "content": content if content or not calls else None}
                if r is not None:
                    msg["reasoning_content"] = r
                if calls:
                    msg["tool_calls"] = calls
                choices.append({"index": c.index, "message": msg, "logprobs": self._logprobs(c.records),
                                "finish_reason": fin})
            else:
                choices.append({"index": c.index, "text": content, "logprobs": self._logprobs(c.records),
                                "finish_reason": fin})
        return Reply(200, {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                           "created": self.created, "model": self.lm.name, "choices": choices,
                           "usage": self.usage(), "system_fingerprint": None})

    async def sse(self, req):
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        usage = self.p["include_usage"]
        offsets = {}

        def chunk(c, delta=None, text=None, finish=None):
            lp = None
            if c.unsent and (delta or text or finish):
                off = offsets.get(c.index, 0)
                lp = self._logprobs(c.unsent, off)
                if lp is not None and not self.chat:
                    offsets[c.index] = off + sum(len(s) for s in lp["tokens"])
                c.unsent = []
            if self.chat:
                choice = {"index": c.index, "delta": delta or {}, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": c.index, "text": text or "", "logprobs": lp, "finish_reason": finish}
            out = {"id": self.id, "object": obj, "created": self.created, "model": self.lm.name,
                   "system_fingerprint": None, "choices": [choice]}
            if usage:
                out["usage"] = None
            return _sse(out)

        if self.chat:
            for c in self.choices:
                yield chunk(c, {"role": "assistant", "content": ""})
        try:
            async for c, text, fin in self.events(req):
                if fin is None:
                    if not self.chat:
                        if text:
                            yield chunk(c, text=text)
                        continue
                    delta = _delta(*c.stream_delta(text))
                    if delta:
                        yield chunk(c, delta)
                elif fin != "cancelled":
                    if not self.chat:
                        yield chunk(c, text="", finish=fin)
                        continue
                    r, content, calls = c.stream_end()
                    delta = _delta(r, content, calls)
                    if delta:
                        yield chunk(c, delta)
                    yield chunk(c, {}, finish=c.finish_reason(calls))
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            err = error_for(e).body
            yield _sse(err)
        if usage:
            yield _sse({"id": self.id, "object": obj, "created": self.created, "model": self.lm.name,
                        "system_fingerprint": None, "choices": [], "usage": self.usage()})
        yield b"data: [DONE]\n\n"
