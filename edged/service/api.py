"""Routing and handlers: pure coroutines from an ApiRequest to a Reply or a StreamReply.

No socket here: the transport turns an aiohttp request into an ApiRequest (method, path, body
bytes, peer credentials, a "client gone?" probe) and writes back what the handler returns, so
tests drive every route with plain objects. OpenAI's wire shapes: chat.completion(.chunk),
text_completion, errors as {"error": {"message", "type", "code"}}.
"""
import asyncio
import dataclasses
import json
import secrets
import time

from ..errors import (EdgedError, HTTPError, ModelNotFound, NotReady, QueueTimeout, RequestError,
                      http_error)
from ..text.sampling import REQUEST_BOUNDS, greedy_temperature
from .log import log
from .names import check_model_name
from .scheduler import Job


@dataclasses.dataclass
class Peer:
    pid: int
    uid: int
    gid: int
    groups: tuple = ()


@dataclasses.dataclass
class ApiRequest:
    method: str
    path: str
    body: bytes = b""
    peer: Peer | None = None                  # None: not a Unix-socket peer (tests may leave it out)
    disconnected: object = lambda: False      # () -> bool, True once the client has gone
    info: dict = dataclasses.field(default_factory=dict)   # filled by handlers for the request log line


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


def error_reply(status, message, type_="invalid_request_error", code=None, headers=None):
    return Reply(status, {"error": {"message": message, "type": type_, "param": None, "code": code}},
                 headers=dict(headers or {}))


def error_for(e):
    """Map an exception to an OpenAI-shaped error reply."""
    status, type_, code, headers = http_error(e)
    if not isinstance(e, EdgedError):
        log.exception("internal error: %s", e)
        return error_reply(status, f"internal error: {type(e).__name__}", type_, code)
    return error_reply(status, str(e), type_, code, headers)


# --- request validation --------------------------------------------------------------------

_COMMON = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
           "seed", "stop", "presence_penalty", "frequency_penalty", "repeat_penalty", "logit_bias",
           "stream", "stream_options", "n", "user", "metadata", "store", "service_tier",
           "logprobs", "top_logprobs", "response_format", "parallel_tool_calls", "tools",
           "tool_choice", "cache_prompt"}
CHAT_FIELDS = _COMMON | {"messages"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}


def _num(body, key):
    b = REQUEST_BOUNDS[key]
    v = body.get(key)
    if v is None:
        return b.default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (b.integer and not isinstance(v, int)):
        raise RequestError(f"'{key}' must be {'an integer' if b.integer else 'a number'} (got {v!r})")
    if v != v or not b.lo <= v <= b.hi:
        raise RequestError(f"'{key}' must be between {b.lo} and {b.hi} (got {v!r})")
    return int(v) if b.integer else float(v)


def parse_params(body, chat):
    """Validate an OpenAI request body; returns a dict of generation parameters."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unsupported field(s): {', '.join(unknown)}")
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(f"'n' must be 1 (got {n!r}): one choice per request")
    if body.get("best_of") not in (None, 1):
        raise RequestError("'best_of' must be 1")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise RequestError("logprobs are not supported")
    if body.get("echo") not in (None, False):
        raise RequestError("'echo' is not supported")
    if body.get("suffix") not in (None, ""):
        raise RequestError("'suffix' is not supported")
    if body.get("tools") not in (None, []) or body.get("tool_choice") not in (None, "none", "auto"):
        raise RequestError("tools are not supported")
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise RequestError(f"'response_format' {rf!r} is not supported (only {{\"type\": \"text\"}})")
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise RequestError("'model' must be a string")
        check_model_name(model)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict) or set(so) - {"include_usage", "continuous_usage_stats"}:
            raise RequestError("'stream_options' must be an object with 'include_usage'")
        include_usage = bool(so.get("include_usage", False))
    p = {"model": model, "stream": stream, "include_usage": include_usage}
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise RequestError(f"'max_tokens' must be a positive integer (got {mt!r})")
    p["max_tokens"] = mt
    for key in REQUEST_BOUNDS:
        p[key] = _num(body, key)
    p["temperature"] = greedy_temperature(p["temperature"])
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -(1 << 63) <= seed < 1 << 64):
        raise RequestError(f"'seed' must be an integer (got {seed!r})")
    p["seed"] = seed
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a non-empty string or a list of up to 4 of them")
    p["stop"] = stop
    lb = body.get("logit_bias")
    bias = {}
    if lb is not None:
        if not isinstance(lb, dict):
            raise RequestError("'logit_bias' must be an object of token id -> bias")
        for k, v in lb.items():
            try:
                tok = int(k)
            except ValueError:
                raise RequestError(f"'logit_bias' key {k!r} is not a token id") from None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                raise RequestError(f"'logit_bias' value for {k} must be a number in [-100, 100]")
            bias[tok] = float(v)
    p["logit_bias"] = bias
    if chat:
        p["messages"] = _messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            p["prompt_ids"] = list(prompt)
        elif isinstance(prompt, str):
            p["prompt"] = prompt
        else:
            raise RequestError("'prompt' must be a string or a list of token ids (one prompt per request)")
    return p


def _messages(msgs):
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise RequestError(f"messages[{i}]: unsupported field(s) {', '.join(sorted(extra))}")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise RequestError(f"messages[{i}].role must be system, user or assistant (got {role!r})")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"messages[{i}].content: only text parts are supported")
                parts.append(part["text"])
            content = "".join(parts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string")
        out.append({"role": role, "content": content})
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

    def __init__(self, state):
        self.state = state
        self.routes = {
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/v1/completions"): self.completions,
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
        text = st.metrics.render(st.slots.waiting, st.slots.busy,
                                 [n for n, m in st.registry.models.items() if not m.draining], st.slots.n)
        return Reply(200, text, content_type="text/plain; version=0.0.4")

    async def models(self, req):
        return Reply(200, {"object": "list", "data": self.state.registry.listing()})

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
        lm = await self._acquire(name, self.state.cfg.queue_timeout, req.peer)
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
        lm = await self._acquire(name, self.state.cfg.queue_timeout, req.peer)
        try:
            bad = [t for t in toks if not 0 <= t < lm.n_vocab]
            if bad:
                raise RequestError(f"token id {bad[0]} out of range (vocabulary of {lm.n_vocab})")
            text = await asyncio.get_running_loop().run_in_executor(None, lm.tokenizer.decode, toks)
        finally:
            self.state.registry.release(lm)
        return Reply(200, {"content": text, "model": name})

    async def _acquire(self, name, timeout, peer=None):
        """The loaded model `name`; a request's `peer` must be allowed to cause its load."""
        if self.state.stopping:
            raise NotReady("shutting down")
        if peer is not None:
            self.state.policy.check(self.state.cfg, self.state.registry, peer, name)
        try:
            return await asyncio.wait_for(self.state.registry.acquire(name), timeout)
        except asyncio.TimeoutError:
            raise QueueTimeout(f"timed out after {timeout:g}s waiting for model {name!r} to load") from None

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
            lm = await self._acquire(name, max(cfg.queue_timeout - (time.monotonic() - t0), 0.001), req.peer)
            try:
                ids = await asyncio.get_running_loop().run_in_executor(None, self._prompt_ids, lm, p, chat)
                n_prompt = len(ids)
                limit = cfg.prompt_limit()
                if n_prompt > min(limit, lm.n_ctx - 1):
                    raise RequestError(f"prompt of {n_prompt} tokens exceeds the limit of "
                                       f"{min(limit, lm.n_ctx - 1)} (max_prompt_tokens / ctx_size)")
                bad = [t for t in list(p["logit_bias"]) + list(p.get("prompt_ids", ())) if not 0 <= t < lm.n_vocab]
                if bad:
                    raise RequestError(f"token id {bad[0]} out of range (vocabulary of {lm.n_vocab})")
                room = lm.n_ctx - n_prompt
                max_tokens = min(p["max_tokens"] or cfg.max_output_tokens, cfg.max_output_tokens, room)
                info["queue_ms"] = (time.monotonic() - t0) * 1e3
                gen = _Generation(self, lm, ids, p, max_tokens, chat)
            except BaseException:
                st.registry.release(lm)
                raise
        except BaseException:
            st.slots.release()
            raise
        info["prompt_tokens"] = n_prompt
        if cfg.log_prompts:
            info["prompt"] = p["messages"] if chat else p.get("prompt", p.get("prompt_ids"))
        gen.start(req)
        if p["stream"]:
            return StreamReply(gen.sse(req), gen.close)
        try:
            return await gen.collect(req)
        finally:
            await gen.close()

    @staticmethod
    def _prompt_ids(lm, p, chat):
        if chat:
            return lm.encode_chat(p["messages"])
        if "prompt_ids" in p:
            return p["prompt_ids"]
        return lm.encode_text(p["prompt"], add_special=True, parse_special=False)


class _Generation:
    """One admitted request: owns a slot and a model lease until the decode thread lets go."""

    def __init__(self, api, lm, ids, p, max_tokens, chat):
        self.api, self.lm, self.ids, self.p, self.max_tokens, self.chat = api, lm, ids, p, max_tokens, chat
        st = api.state
        self.st = st
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.job = None
        self._released = False
        self.text = []
        self.n_gen = 0
        self.finish = None
        self.t_start = time.monotonic()
        self.t_first = None
        self.prefill = {}               # "cached": prompt tokens found in the slot's KV cache

    def start(self, req):
        loop = asyncio.get_running_loop()
        lm, p, ids = self.lm, self.p, self.ids
        session_box = []

        def make_gen():
            s = lm.take_session(ids)
            session_box.append(s)
            self.job.session = s         # the decode loop batches it with the other streams
            return lm.steps(s, ids, self.prefill, max_tokens=self.max_tokens, temperature=p["temperature"],
                            top_k=p["top_k"], top_p=p["top_p"], min_p=p["min_p"], seed=p["seed"], stop=p["stop"],
                            repeat_penalty=p["repeat_penalty"], presence_penalty=p["presence_penalty"],
                            frequency_penalty=p["frequency_penalty"], logit_bias=p["logit_bias"] or None)

        def finish():      # decode thread: the session is free again
            for s in session_box:
                lm.give_back(s)
            loop.call_soon_threadsafe(self._release)

        deadline = time.monotonic() + self.st.cfg.request_timeout
        self.job = Job(loop, make_gen, finish, deadline)
        self.req = req
        self.st.decoder.submit(self.job)

    def _release(self):
        if not self._released:
            self._released = True
            self.st.registry.release(self.lm)
            self.st.slots.release()

    async def close(self):
        """Stop generating (if still running) and wait until the decode thread let go."""
        if self.job is None:
            self._release()
            return
        if self.finish is None:
            self.job.cancel.set()
            while True:
                kind, _ = await self.job.events.get()
                if kind in ("done", "error"):
                    break
        info = self.req.info
        info.update(completion_tokens=self.n_gen, finish=self.finish or "cancelled")
        if "cached" in self.prefill:
            info["cached_tokens"] = self.prefill["cached"]
        if "evaluated" in self.prefill:
            info["prompt_eval"] = self.prefill["evaluated"]
        elapsed = time.monotonic() - self.t_start
        if self.t_first is not None:
            info["ttft_ms"] = (self.t_first - self.t_start) * 1e3
        info["gen_ms"] = elapsed * 1e3
        self.st.metrics.tokens(len(self.ids), self.n_gen, elapsed)
        if self.st.cfg.log_prompts:
            info["reply"] = "".join(self.text)

    async def events(self, req):
        """(text, finish_reason) pairs until the end; cancels the job if the client goes away."""
        while True:
            kind, value = await self.job.events.get()
            if kind == "token":
                if self.t_first is None:
                    self.t_first = time.monotonic()
                if getattr(value, "token", None) is not None:
                    self.n_gen += 1
                text = getattr(value, "text", "") or ""
                self.text.append(text)
                if req.disconnected():
                    self.job.cancel.set()
                yield text, None
            elif kind == "done":
                # engine: "stop"/"length"; decoder: "cancelled" (client gone), "abort" (shutdown
                # drain timed out), None (generator ended without a reason)
                self.finish = {"stop": "stop", "length": "length", "cancelled": "cancelled",
                               "abort": "length"}.get(value, "stop")
                yield "", self.finish
                return
            else:
                self.finish = "error"
                raise value

    def usage(self):
        n = len(self.ids)
        u = {"prompt_tokens": n, "completion_tokens": self.n_gen, "total_tokens": n + self.n_gen}
        if "cached" in self.prefill:
            # prompt tokens found in the slot's KV cache (a follow-up turn evaluates only the new ones)
            u["prompt_tokens_details"] = {"cached_tokens": self.prefill["cached"]}
        return u

    async def collect(self, req):
        async for _text, _fin in self.events(req):
            pass
        text = "".join(self.text)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": self.finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish}
        return Reply(200, {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                           "created": self.created, "model": self.lm.name, "choices": [choice],
                           "usage": self.usage(), "system_fingerprint": None})

    async def sse(self, req):
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        usage = self.p["include_usage"]

        def chunk(text=None, finish=None, role=False):
            if self.chat:
                delta = {}
                if role:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            c = {"id": self.id, "object": obj, "created": self.created, "model": self.lm.name,
                 "system_fingerprint": None, "choices": [choice]}
            if usage:
                c["usage"] = None
            return _sse(c)

        if self.chat:
            yield chunk("", role=True)
        try:
            async for text, fin in self.events(req):
                if fin is None:
                    if text:
                        yield chunk(text)
                elif fin != "cancelled":
                    yield chunk(None if self.chat else "", finish=fin)
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            err = error_for(e).body
            yield _sse(err)
        if usage:
            yield _sse({"id": self.id, "object": obj, "created": self.created, "model": self.lm.name,
                        "system_fingerprint": None, "choices": [], "usage": self.usage()})
        yield b"data: [DONE]\n\n"
