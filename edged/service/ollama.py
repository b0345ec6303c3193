"""Ollama's wire protocol: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
/api/show, /api/ps, /api/version and `GET /`, as Ollama answers them.

Parses a body (the pydantic models of service/ollama_schema.py) into the one internal request
(service/request.py) and renders a generation's events (service/jobs.py) back in Ollama's
shape: JSON objects one a line (application/x-ndjson), the last with "done": true, done_reason
and the timings in nanoseconds; with "stream": false that last object alone, carrying the whole
message. Errors are {"error": MESSAGE}, on every Ollama path (reshaped(): Api.handle's own 404,
405 and 403 too). The routes that manage model files (pull, create, push, copy, delete) are
refused: models arrive signed through the deployment pipeline. Admission, authorization and
scheduling are the Api's (service/api.py), as for every protocol.
"""
import asyncio
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import os
import time

import numpy as np

from ..errors import HTTPError, ModelNotFound, RequestError, TemplateError
from ..format.gguf import FileType, Key
from ..text import harmony, reasoning
from ..text.infill import Infill
from ..text.sampling import SamplingParams
from . import images, ollama_schema as schema
from .log import log
from .names import model_path
from .openai import _tool, chat_logprobs
from .registry import _identity as file_version
from .request import ConstraintSpec, GenerateRequest, Output, ToolUse
from .wire import Reply, StreamReply, error_for, errors_as, json_body, serialised

# The Ollama release whose API these routes follow: clients gate features (tools, think) on it.
OLLAMA_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"
FOREVER = datetime.timedelta(seconds=(2 ** 63 - 1) / 1e9)   # Ollama's expiry of a model kept forever
REFUSED = ("/api/pull", "/api/create", "/api/push", "/api/copy", "/api/delete", "/api/blobs")


def routes(api):
    """(method, path) -> handler of every Ollama route, for Api's table."""
    o = Ollama(api)
    table = {("POST", "/api/chat"): o.chat, ("POST", "/api/generate"): o.generate,
             ("POST", "/api/embed"): o.embed, ("POST", "/api/embeddings"): o.embeddings,
             ("GET", "/api/tags"): o.tags, ("POST", "/api/show"): o.show, ("GET", "/api/ps"): o.ps,
             ("GET", "/api/version"): o.version, ("GET", "/"): o.root, ("HEAD", "/"): o.root}
    for path in REFUSED:
        table[("DELETE" if path == "/api/delete" else "POST", path)] = o.refused
    return table


def error_reply(e):
    return reshaped(error_for(e))


def owns(path):
    """Is `path` one of Ollama's (its errors then come in Ollama's shape, the route known or not)?"""
    return path == "/" or path.startswith("/api/")


def reshaped(reply):
    """An OpenAI-shaped error reply ({"error": {"message", ...}}: what Api.handle answers
    before a route runs, 403, 404, 405) as Ollama's {"error": MESSAGE}; other replies as they are."""
    body = getattr(reply, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return Reply(reply.status, {"error": body["error"]["message"]}, headers=reply.headers)
    return reply


_ollama_errors = errors_as(error_reply)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds):
    return max(int(seconds * 1e9), 0)


def _line(obj):
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


# --- request bodies -> GenerateRequest -----------------------------------------------------

# Ollama's defaults for what a request leaves out (its api.DefaultOptions)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1, "penalty_last_n": 64}
# SamplingParams field <- options key
SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "penalty_last_n": "repeat_last_n", "seed": "seed"}


def _options(o, what):
    """(SamplingParams, Output keywords) of a request's `options`; options edged has no use
    for (num_thread, num_gpu, mirostat, ...) are ignored with a log line, as Ollama ignores
    the ones it does not know."""
    o = o or schema.Options()
    if o.model_extra:
        log.info("%s: ignored options %s (no meaning here)", what, ", ".join(sorted(o.model_extra)))
    values = dict(DEFAULTS)
    values.update({ours: getattr(o, theirs) for ours, theirs in SAMPLING.items()
                   if getattr(o, theirs) is not None})
    if values.get("seed") is not None and values["seed"] < 0:
        values["seed"] = None                       # -1: a random seed
    if values["penalty_last_n"] < 0:                # -1: the whole context
        values["penalty_last_n"] = min(o.num_ctx or 1 << 16, 1 << 16)
    try:
        sampling = SamplingParams(**values)
    except RequestError as e:
        ours = e.param or ""
        raise RequestError(str(e).replace(ours, f"options.{SAMPLING.get(ours, ours)}", 1),
                           param=f"options.{SAMPLING.get(ours, ours)}") from None
    stop = tuple(o.stop or ())
    if len(stop) > schema.MAX_STOP or not all(stop):
        raise RequestError(f"'options.stop' must be a list of up to {schema.MAX_STOP} non-empty strings",
                           param="options.stop")
    max_tokens = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    return sampling, dict(max_tokens=max_tokens, stop=stop, context=o.num_ctx)


def _constraint(fmt):
    if fmt in (None, ""):
        return None
    return ConstraintSpec("json_schema", {"type": "object"} if fmt == "json" else fmt, "format")


def _think(think):
    """(template kwargs, split reasoning out?) of `think`: true or a level asks the template to
    think, false asks it not to (and leaves any reasoning in the content, as Ollama does)."""
    if think is None:
        return {}, True
    kwargs = {"enable_thinking": think is not False}
    if isinstance(think, str):
        kwargs["reasoning_effort"] = think
    return kwargs, think is not False


def _logprobs(r):
    """Output.logprobs of `logprobs` / `top_logprobs` (the alternatives only with logprobs on, as Ollama)."""
    return r.top_logprobs if r.logprobs else None


def _images(given, where, refs):
    """Ollama's `images` (base64) as ImageRefs appended to refs; the markers that stand for them
    before the text, as Ollama puts them."""
    refs.extend(images.base64_ref(b, f"{where}[{j}]") for j, b in enumerate(given or ()))
    return images.MARKER * len(given or ())


def _message(m, i, refs):
    out = {"role": m.role, "content": _images(m.images, f"messages[{i}].images", refs) + m.content}
    if m.thinking:
        out["reasoning_content"] = m.thinking
    if m.tool_name:
        out["name"] = m.tool_name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [{"type": "function", **({"id": c.id} if c.id else {}),
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in m.tool_calls]
    return out


def parse_chat(body):
    """A /api/chat body -> (GenerateRequest, keep_alive seconds or None, no messages?);
    RequestError naming the field."""
    r = schema.validate(schema.ChatBody, body)
    sampling, out = _options(r.options, "/api/chat")
    kwargs, split = _think(r.think)
    tools = tuple(_tool(t) for t in r.tools or ())
    refs = []
    request = GenerateRequest(
        model=r.model, sampling=sampling, constraint=_constraint(r.format),
        output=Output(**out, reasoning=split, stream=r.stream, logprobs=_logprobs(r)),
        tools=ToolUse(tools, "auto" if tools else "none"),
        messages=tuple(_message(m, i, refs) for i, m in enumerate(r.messages)), template_kwargs=kwargs,
        images=tuple(refs))
    return request, schema.keep_alive(r.keep_alive), not r.messages


def parse_generate(body):
    """A /api/generate body -> (GenerateRequest, keep_alive, no prompt?): the prompt through the model's
    chat template (with `system`), as it is with "raw": true, or with a `suffix` the middle
    between the two (llama-server's infill layout, text/infill.py)."""
    r = schema.validate(schema.GenerateBody, body)
    sampling, out = _options(r.options, "/api/generate")
    kwargs, split = _think(r.think)
    common = dict(model=r.model, sampling=sampling, constraint=_constraint(r.format))
    out["logprobs"] = _logprobs(r)
    if r.images and (r.suffix or r.raw):
        raise RequestError("'images' go through the chat template: not with 'raw' or 'suffix'", param="images")
    if r.suffix:    # fill-in-the-middle with the file's FIM tokens, as Ollama's code models
        request = GenerateRequest(**common, output=Output(**out, reasoning=False, stream=r.stream),
                                  prompts=(r.prompt,), infill=Infill(prefix=r.prompt, suffix=r.suffix))
    elif r.raw:
        request = GenerateRequest(**common, output=Output(**out, reasoning=False, stream=r.stream),
                                  prompts=(r.prompt,))
    else:
        refs = []
        messages = ([{"role": "system", "content": r.system}] if r.system else []) + \
            [{"role": "user", "content": _images(r.images, "images", refs) + r.prompt}]
        request = GenerateRequest(**common, output=Output(**out, reasoning=split, stream=r.stream),
                                  messages=tuple(messages), template_kwargs=kwargs, images=tuple(refs))
    return request, schema.keep_alive(r.keep_alive), not r.prompt


# --- generation events -> Ollama replies ---------------------------------------------------

def _call(call):
    """An OpenAI-shaped tool call (text/tools.py make_call) in Ollama's: arguments an object."""
    fn = call["function"]
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        args = fn["arguments"]
    return {"function": {"name": fn["name"], "arguments": args}}


class _Render:
    """One generation as /api/chat (message) or /api/generate (response) objects."""

    def __init__(self, gen, t0, chat):
        self.gen, self.t0, self.chat = gen, t0, chat
        self.model = gen.lm.name

    def logprobs(self, records):
        """Ollama's `logprobs` of (token, logprob, top) records: OpenAI's entries (token,
        logprob, bytes, top_logprobs), top_logprobs left out when none were asked for."""
        if self.gen.request.output.logprobs is None:
            return None
        out = chat_logprobs(self.gen.lm.tokenizer, records)["content"]
        for e in out:
            if not e["top_logprobs"]:
                del e["top_logprobs"]
        return out

    def part(self, r, content, calls=(), c=None):
        """One object; `c`: the choice whose logprob records not yet sent go with it."""
        out = {"model": self.model, "created_at": _now()}
        if self.chat:
            msg = {"role": "assistant", "content": content}
            if r:
                msg["thinking"] = r
            if calls:
                msg["tool_calls"] = [_call(c) for c in calls]
            out["message"] = msg
        else:
            out["response"] = content
            if r:
                out["thinking"] = r
        if c is not None:
            lp = self.logprobs(c.unsent)
            c.unsent = []
            if lp is not None:
                out["logprobs"] = lp
        out["done"] = False
        return out

    def final(self, choice, r="", content="", calls=()):
        g, end = self.gen, time.monotonic()
        first = g.t_first or end
        u = g.usage()
        out = self.part(r, content, calls, choice)
        out.update(done=True, done_reason="length" if choice.finish == "length" else "stop",
                   total_duration=_ns(end - self.t0), load_duration=_ns(g.t_start - self.t0),
                   prompt_eval_count=u["prompt"], prompt_eval_duration=_ns(first - g.t_start),
                   eval_count=u["completion"], eval_duration=_ns(end - first))
        return out

    async def whole(self, req):
        await self.gen.drain(req)
        c = self.gen.choices[0]
        r, content, calls = c.result()
        c.unsent = c.records
        # logprobs of thousands of tokens make megabytes of JSON: built off the event loop
        return await serialised(lambda: Reply(200, self.final(c, r or "", content, calls)),
                                self.gen.st.cfg.max_reply_bytes)

    async def events(self, req):
        try:
            async for c, text, fin in self.gen.events(req):
                if fin is None:
                    r, content = c.stream_delta(text)
                    if r or content:
                        yield _line(self.part(r, content, c=c))
                elif fin != "cancelled":
                    r, content, calls = c.stream_end()
                    if r or content or calls:
                        yield _line(self.part(r, content, calls, c))
                    yield _line(self.final(c))
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            yield _line(error_reply(e).body)


async def reply(gen, req, t0, chat):
    """The started generation `gen` as Ollama's reply (chat: /api/chat's `message`, else
    /api/generate's `response`): NDJSON objects or one object."""
    render = _Render(gen, t0, chat)
    if gen.request.output.stream:
        return StreamReply(render.events(req), gen.close, content_type=NDJSON)
    try:
        return await render.whole(req)
    finally:
        await gen.close()


# --- model descriptions ------------------------------------------------------------------

def _parameter_size(n):
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def details(lm):
    """Ollama's `details` of a loaded model (from its verified GGUF metadata); of a model not
    loaded only the format (its file is not parsed before its signature is checked)."""
    if lm is None:
        return {"parent_model": "", "format": "gguf", "family": "", "families": None,
                "parameter_size": "", "quantization_level": ""}
    f = lm.model.file
    arch = f.get(Key.ARCHITECTURE, "")
    try:
        quant = FileType(f.get(Key.FILE_TYPE)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        quant = ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": _parameter_size(_n_params(f)), "quantization_level": quant}


def _n_params(f):
    return sum(t.n_elements for t in f.tensors.values())


def model_info(lm):
    """GGUF metadata as Ollama's `model_info`: scalars as they are, arrays (vocabulary, merges)
    empty, as Ollama shows them without `verbose`."""
    out = {}
    for k, v in lm.model.file.metadata.items():
        if isinstance(v, (list, tuple, np.ndarray)):
            v = []
        elif isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        out[k] = v
    out.setdefault("general.parameter_count", _n_params(lm.model.file))
    return dict(sorted(out.items()))


def _template(lm):
    """The chat template of a decoder, "" when it has none (chat is then refused, raw prompts work)."""
    try:
        return lm.template_source() if lm.model.encoder is None else ""
    except TemplateError:
        return ""


def capabilities(lm):
    m, caps = lm.model, []
    decoder = m.encoder is None
    if decoder:
        caps += ["completion", "tools"]
        template = _template(lm)
        if reasoning.OPEN in template or harmony.is_harmony(template):
            caps.append("thinking")
        if lm.projector is not None:            # its mmproj: takes images
            caps.append("vision")
    if not decoder or m.pooling not in (None, "none"):
        caps.append("embedding")
    return caps


def _tagged(name):
    return name if ":" in name else name + ":latest"


def _rfc3339(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class Ollama:
    """The Ollama routes over an Api (service/api.py): its admission, leases and state."""

    def __init__(self, api):
        self.api = api
        self.digests = Digests()

    @property
    def st(self):
        return self.api.state

    def _name(self, name):
        """A model name as Ollama clients send it: "NAME:latest" is NAME unless a file has the
        tagged name."""
        if name.endswith(":latest") and not os.path.exists(model_path(self.st.cfg.models_dir, name)):
            return name[:-len(":latest")]
        return name

    def _keep_alive(self, req, lm, keep_alive):
        """Map a request's keep_alive to the model's unload timer (an embedding's applies from
        the next idle sweep): when a model unloads is the operator's business, so only peers
        allowed the admin routes set it."""
        if keep_alive is None or lm is None:
            return
        if not self.api.admitted(req.peer, "/v1/models/unload"):
            log.info("%s: ignored keep_alive from a peer without admin rights", req.path)
            return
        lm.keep_alive = keep_alive

    async def _load_or_unload(self, req, request, keep_alive, chat):
        """An empty prompt or message list: load the model, or unload it with keep_alive 0."""
        name = self.st.registry.resolve(request.model)
        req.info["model"] = name
        reason = "load"
        if keep_alive == 0:
            if not self.api.admitted(req.peer, "/v1/models/unload"):
                raise HTTPError(403, f"uid {req.peer.uid} may not unload models (admin_uids/admin_gids)",
                                "permission_error", "forbidden")
            if name in self.st.registry.models:
                await self.st.registry.unload(name)
            reason = "unload"
        else:
            lm = await self.api._acquire(name, self.st.cfg.queue_timeout, req)
            self._keep_alive(req, lm, keep_alive)
            self.st.registry.release(lm)
        out = {"model": name, "created_at": _now()}
        out.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
        out.update(done=True, done_reason=reason)
        return Reply(200, out)

    async def _generate(self, req, parse, chat):
        t0 = time.monotonic()
        request, keep_alive, empty = parse(json_body(req, self.st.cfg.max_body_bytes))
        request = dataclasses.replace(request, model=self._name(request.model))
        if empty:
            return await self._load_or_unload(req, request, keep_alive, chat)
        gen = await self.api.generate(req, request)
        self._keep_alive(req, gen.lm, keep_alive)
        return await reply(gen, req, t0, chat)

    @_ollama_errors
    async def chat(self, req):
        return await self._generate(req, parse_chat, chat=True)

    @_ollama_errors
    async def generate(self, req):
        return await self._generate(req, parse_generate, chat=False)

    # --- embeddings -----------------------------------------------------------------------
    @_ollama_errors
    async def embed(self, req):
        t0 = time.monotonic()
        r = schema.validate(schema.EmbedBody, json_body(req, self.st.cfg.max_body_bytes))
        inputs = [r.input] if isinstance(r.input, str) else r.input
        if not inputs or not all(inputs):
            raise RequestError("'input' must be a non-empty string or list of them", param="input")

        def build(name, vecs, n):
            vecs = _pooled(name, vecs)
            if r.dimensions is not None and r.dimensions < vecs.shape[1]:
                vecs = vecs[:, :r.dimensions]
                vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-30)
            return Reply(200, {"model": name, "embeddings": vecs.astype("<f4").tolist(),
                               "total_duration": _ns(time.monotonic() - t0), "load_duration": 0,
                               "prompt_eval_count": n})
        name = self._name(r.model)
        if r.truncate:
            inputs = await self._truncated(req, name, inputs)
        reply = await self.api._embed(req, name, inputs, None, build)
        self._keep_alive(req, self.st.registry.models.get(req.info["model"]), schema.keep_alive(r.keep_alive))
        return reply

    async def _truncated(self, req, name, inputs):
        """`inputs` as token-id lists, each cut to what the model embeds (its limit and ctx_size),
        as Ollama's `truncate` does: the end of the text goes, the separator or end token the
        tokenizer appends stays."""
        def cut(m):
            most, out = min(self.st.cfg.ctx_size, m.embed_limit), []
            for text in inputs:
                ids = m.tokenizer.encode(text)
                if len(ids) > most:
                    tail = ids[-1:] if m.tokenizer.is_control(ids[-1]) else []
                    ids = ids[:most - len(tail)] + tail
                out.append(ids)
            return out
        async with self.api._slot(req):     # tokenizing a megabyte is work: queued like the rest
            lm = await self.api._acquire(self.st.registry.resolve(name), self.st.cfg.queue_timeout, req)
            try:
                return await asyncio.get_running_loop().run_in_executor(None, cut, lm.model)
            finally:
                self.st.registry.release(lm)

    @_ollama_errors
    async def embeddings(self, req):
        """The legacy /api/embeddings: one prompt, {"embedding": [...]}."""
        r = schema.validate(schema.EmbeddingsBody, json_body(req, self.st.cfg.max_body_bytes))
        if not r.prompt:
            raise RequestError("'prompt' must be a non-empty string", param="prompt")
        reply = await self.api._embed(req, self._name(r.model), [r.prompt], None, lambda name, vecs, n: Reply(
            200, {"embedding": _pooled(name, vecs)[0].astype("<f4").tolist()}))
        self._keep_alive(req, self.st.registry.models.get(req.info["model"]), schema.keep_alive(r.keep_alive))
        return reply

    # --- models ---------------------------------------------------------------------------
    @_ollama_errors
    async def tags(self, req):
        reg = self.st.registry
        listing = reg.listing()
        digests = await self.digests.of([reg.path(e["id"]) for e in listing])
        models = []
        for e, digest in zip(listing, digests):
            lm = reg.models.get(e["id"])
            name = _tagged(e["id"])
            models.append({"name": name, "model": name, "modified_at": _rfc3339(e["created"]),
                           "size": e["size"], "digest": digest, "details": details(lm)})
        return Reply(200, {"models": models})

    @_ollama_errors
    async def ps(self, req):
        cfg, out = self.st.cfg, []
        loaded = [(n, lm) for n, lm in sorted(self.st.registry.models.items()) if not lm.draining]
        digests = await self.digests.of([lm.path for _, lm in loaded])
        for (name, lm), digest in zip(loaded, digests):
            ka = self.st.registry.keep_alive(lm)
            now = datetime.datetime.now(datetime.timezone.utc)
            if ka < 0 or lm.pinned or name == cfg.default_model:
                expires = now + FOREVER
            else:
                expires = now + datetime.timedelta(seconds=max(ka - (time.monotonic() - lm.last_used), 0))
            tagged = _tagged(name)
            out.append({"name": tagged, "model": tagged, "size": lm.size, "digest": digest, "size_vram": 0,
                        "details": details(lm), "expires_at": expires.isoformat().replace("+00:00", "Z"),
                        "context_length": lm.n_ctx})
        return Reply(200, {"models": out})

    @_ollama_errors
    async def show(self, req):
        r = schema.validate(schema.ShowBody, json_body(req, self.st.cfg.max_body_bytes))
        given = r.model or r.name
        if not given:
            raise RequestError("'model' is required", param="model")
        name = self.st.registry.resolve(self._name(given))
        req.info["model"] = name
        if not os.path.exists(self.st.registry.path(name)) and name not in self.st.registry.models:
            raise ModelNotFound(f"model {given!r} not found")
        lm = await self.api._acquire(name, self.st.cfg.queue_timeout, req)
        try:
            return await serialised(lambda: self._show(lm), self.st.cfg.max_reply_bytes)
        finally:
            self.st.registry.release(lm)

    def _show(self, lm):
        caps = capabilities(lm)
        params = {SAMPLING[k]: v for k, v in DEFAULTS.items()}     # what a request without options gets
        params["num_ctx"] = lm.n_ctx
        return Reply(200, {
            "license": "", "modelfile": f"# {lm.name}.gguf, signed, served by edged\nFROM {lm.name}.gguf\n",
            "parameters": "\n".join(f"{k:<30} {v}" for k, v in params.items()),
            "template": _template(lm),
            "details": details(lm), "model_info": model_info(lm), "capabilities": caps,
            "modified_at": _rfc3339(os.stat(lm.path).st_mtime)})

    async def version(self, req):
        return Reply(200, {"version": OLLAMA_VERSION})

    async def root(self, req):
        return Reply(200, "Ollama is running", content_type="text/plain; charset=utf-8")

    async def refused(self, req):
        return error_reply(HTTPError(
            403, f"{req.path.rsplit('/', 1)[-1]} is not available: models arrive signed through the "
            "deployment pipeline (a signed NAME.gguf in the model directory; see docs/signing.md)",
            "permission_error", "model_management_refused"))


class Digests:
    """The SHA-256 of model files (hex), Ollama's `digest`, cached by file version (device,
    inode, size, modification and change times). A file is hashed once per version, in a
    thread of its own (about a second a gigabyte); a listing waits up to `wait` seconds for
    the hashes it lacks and gives "" for those still running (they are there the next time)."""

    def __init__(self, wait=2.0):
        self.wait = wait
        self.known = {}         # path -> (file version, hex digest)
        self.running = {}       # (path, file version) -> future
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edged-digest")

    def _hash(self, path, version):
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as e:
            log.warning("digest of %s: %s", path, e)
            digest = ""
        if file_version(path) == version:      # not replaced while it was read
            self.known[path] = (version, digest)
        return digest

    async def of(self, paths):
        """The digest of each path ("" for a file not there, or not hashed within `wait`)."""
        loop = asyncio.get_running_loop()
        out, waiting = [], {}
        for path in paths:
            version = file_version(path)
            if version is None:
                out.append("")
                continue
            hit = self.known.get(path)
            if hit is not None and hit[0] == version:
                out.append(hit[1])
                continue
            key = (path, version)
            if key not in self.running:
                fut = loop.run_in_executor(self.pool, self._hash, path, version)
                fut.add_done_callback(lambda _, key=key: self.running.pop(key, None))
                self.running[key] = fut
            waiting[len(out)] = self.running[key]
            out.append("")
        if waiting:
            await asyncio.wait(set(waiting.values()), timeout=self.wait)
            for i, fut in waiting.items():
                if fut.done() and not fut.cancelled():
                    out[i] = fut.result()
        return out


def _pooled(name, vecs):
    if isinstance(vecs, list):      # the model's own pooling type is none
        raise RequestError(f"model {name!r} has no pooling type (<arch>.pooling_type): it gives "
                           "no embedding per input")
    return vecs
