"""OpenAI's wire protocol: chat completions, (legacy) completions and embeddings.

Parses a request body (validated by the pydantic models of service/openai_schema.py) into the
one internal request (service/request.py), and renders a generation's events (service/jobs.py)
back in OpenAI's shapes: chat.completion(.chunk), text_completion, server-sent events ending in
`data: [DONE]`, logprobs objects, embedding lists. Errors are {"error": {"message", "type",
"param", "code"}} (service/wire.py).
"""
import base64
import dataclasses
import json
import secrets
import time

import numpy as np

from ..errors import RequestError
from ..text.infill import Infill
from ..text.sampling import SamplingParams
from . import images, openai_schema as schema
from .log import log
from .request import MAX_N, ConstraintSpec, GenerateRequest, Output, ToolUse
from .wire import Reply, StreamReply, error_for, serialised, sse


# --- request bodies -> GenerateRequest -----------------------------------------------------

# Other servers' names for our fields: body field -> the field it sets (SamplingParams', or
# "max_tokens")
SYNONYMS = {"max_completion_tokens": "max_tokens", "n_predict": "max_tokens",
            "repetition_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n"}
# Ollama's `options` keys -> ours; the others (num_ctx, num_thread, ...) are ignored, logged
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k",
           "top_p": "top_p", "min_p": "min_p", "seed": "seed", "stop": "stop",
           "repeat_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}


def parse(body, chat):
    """A chat (chat=True) or completions body -> GenerateRequest; RequestError naming the field."""
    r = schema.validate(body, chat)
    knobs, names = _knobs(r)
    stop = schema.check_stop(knobs.pop("stop"), names.get("stop", "stop"))
    max_tokens = knobs.pop("max_tokens")
    try:
        sampling = SamplingParams(**knobs)
    except RequestError as e:           # name the field as the body did
        theirs = names.get(e.param, e.param)
        raise RequestError(str(e).replace(f"'{e.param}'", f"'{theirs}'", 1), param=theirs) from None
    common = dict(model=r.model, sampling=sampling, constraint=_constraint(r), speculative=r.speculative)
    include_usage = bool(r.stream_options and r.stream_options.include_usage)
    if r.keep_alive is not None:
        log.info("keep_alive ignored: the daemon's keep_alive setting decides when a model unloads "
                 "(Ollama's /api routes take a request's, from an admin peer)")
    if chat:
        legacy = r.functions is not None
        tools = tuple(_tool(t) for t in r.tools or [schema.Tool(type="function", function=f)
                                                    for f in r.functions or ()])
        tc = r.function_call if legacy or r.function_call is not None else r.tool_choice
        if tc is not None and not tools:
            log.info("%s ignored: no tools given (as llama-server does)",
                     "tool_choice" if r.tool_choice is not None else "function_call")
            tc = None
        choice = tc.function.name if isinstance(tc, schema.NamedToolChoice) else \
            tc.name if isinstance(tc, schema.NamedFunction) else tc or ("auto" if tools else "none")
        kwargs = dict(r.chat_template_kwargs or {})
        refs = []                       # the images of the messages, in order
        if r.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", r.reasoning_effort)
        output = Output(max_tokens=max_tokens, n=r.n, stop=stop,
                        logprobs=(r.top_logprobs or 0) if r.logprobs else None,
                        reasoning=r.reasoning_format != "none", stream=r.stream,
                        include_usage=include_usage)
        return GenerateRequest(**common, output=output,
                               tools=ToolUse(tools, choice, r.parallel_tool_calls and not legacy, legacy),
                               messages=tuple(_message(m, i, refs) for i, m in enumerate(r.messages)),
                               template_kwargs=kwargs, images=tuple(refs))
    prompts = r.prompt
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    prompts = tuple(list(x) if isinstance(x, list) else x for x in prompts)
    if len(prompts) * r.n > MAX_N:
        raise RequestError(f"{len(prompts)} prompts x n={r.n} choices exceed {MAX_N} "
                           "choices per request", param="prompt")
    output = Output(max_tokens=max_tokens, n=r.n, stop=stop, logprobs=r.logprobs,
                    stream=r.stream, include_usage=include_usage)
    # a suffix: fill in between the prompt and it (llama-server's /infill layout, text/infill.py)
    fill = Infill(prefix=r.prompt, suffix=r.suffix) if r.suffix else None
    return GenerateRequest(**common, output=output, prompts=prompts, infill=fill)


def _knobs(r):
    """({SamplingParams field: value, "max_tokens": .., "stop": ..}, {our field: the body's
    name for it}) of a validated body, other servers' names mapped (SYNONYMS, Ollama's
    `options`). A field set under two names must have one value."""
    values = {f.name: getattr(r, f.name) for f in dataclasses.fields(SamplingParams)}
    values.update(max_tokens=r.max_tokens, stop=r.stop)
    names = {k: k for k in values if k in r.model_fields_set}

    def put(ours, value, theirs):
        if ours in names and values[ours] != value:
            raise RequestError(f"'{theirs}' and '{names[ours]}' both set {ours}: give one",
                               param=theirs)
        values[ours], names[ours] = value, theirs

    for theirs, ours in SYNONYMS.items():
        v = getattr(r, theirs)
        if v is not None and not (theirs == "n_predict" and v < 0):      # -1: no limit
            put(ours, v, theirs)
    if r.options is not None:
        o = schema.validate_options(r.options)
        ignored = sorted(set(o.model_extra or ()) | ({"num_ctx"} if o.num_ctx is not None else set()))
        if ignored:
            log.info("options ignored (no meaning here): %s", ", ".join(ignored))
        for theirs, ours in OPTIONS.items():
            v = getattr(o, theirs)
            if v is None or (theirs in ("num_predict", "seed", "repeat_last_n") and v < 0):
                continue            # Ollama's -1: no limit, a random seed, the whole context
            put(ours, list(v) if theirs == "stop" else v, f"options.{theirs}")
    return values, names


def _tool(t):
    """A request's tool as chat templates see it: `description` and `parameters` are optional
    in OpenAI's API but templates read them unguarded (gpt-oss's `tool.description`), so absent
    ones become "" and {} (what llama-server hands its templates)."""
    d = t.model_dump(exclude_none=True)
    d["function"].setdefault("description", "")
    d["function"].setdefault("parameters", {})
    return d


def _constraint(r):
    """The ConstraintSpec of response_format, grammar, json_schema or vLLM's guided_* fields
    (validation allowed one)."""
    rf = r.response_format
    if rf is not None and rf.type == "json_object":
        return ConstraintSpec("json_schema", rf.schema_ or {"type": "object"}, "response_format")
    if rf is not None and rf.type == "json_schema":
        return ConstraintSpec("json_schema", rf.json_schema.schema_, "response_format.json_schema.schema")
    if r.json_schema is not None:
        return ConstraintSpec("json_schema", r.json_schema, "json_schema")
    if r.grammar is not None:
        return ConstraintSpec("grammar", r.grammar, "grammar")
    if r.guided_json is not None:
        source = r.guided_json
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except (ValueError, RecursionError):
                raise RequestError("'guided_json' is a string that is not a JSON schema",
                                   param="guided_json") from None
        return ConstraintSpec("json_schema", source, "guided_json")
    if r.guided_regex is not None:
        return ConstraintSpec("regex", r.guided_regex, "guided_regex")
    if r.guided_grammar is not None:
        return ConstraintSpec("grammar", r.guided_grammar, "guided_grammar")
    if r.guided_choice is not None:
        return ConstraintSpec("grammar", "start: " + " | ".join(json.dumps(c) for c in r.guided_choice),
                              "guided_choice")
    return None


def _message(m, i, refs):
    """A validated message (the i-th) as the chat template gets it: text and refusal parts
    joined, each image part as the image marker (its ImageRef appended to `refs`), a legacy
    `function` message as a tool message, a legacy `function_call` as a tool call."""
    content = m.content
    if isinstance(content, list):
        content = "".join(_part(p, f"messages[{i}].content[{j}]", refs) for j, p in enumerate(content))
    role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
    out = {"role": role, "content": "" if content is None else content}
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
    elif m.function_call is not None:
        out["tool_calls"] = [{"type": "function", "function": m.function_call.model_dump()}]
    return out


def _part(p, where, refs):
    if isinstance(p, schema.ImagePart):
        refs.append(images.url_ref(p.image_url.url, where + ".image_url.url"))
        return images.MARKER
    return p.text if isinstance(p, schema.TextPart) else p.refusal


# --- generation events -> OpenAI replies ---------------------------------------------------

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


def _delta(reasoning_text, content, calls=(), legacy=False):
    """A chat stream delta with what is non-empty: reasoning, content, tool calls (indexed; the
    first as a legacy `function_call` when the request gave `functions`)."""
    delta = {}
    if reasoning_text:
        delta["reasoning_content"] = reasoning_text
    if content:
        delta["content"] = content
    if calls and legacy:
        delta["function_call"] = calls[0]["function"]
    elif calls:
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(calls)]
    return delta


class _Render:
    """One generation in OpenAI's shapes (chat or completions)."""

    def __init__(self, gen):
        self.gen, self.chat = gen, gen.request.chat
        self.legacy = gen.request.tools.legacy
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = gen.lm.name

    def _logprobs(self, records, offset=0):
        if self.gen.request.output.logprobs is None:
            return None
        tok = self.gen.lm.tokenizer
        return chat_logprobs(tok, records) if self.chat else completion_logprobs(tok, records, offset)

    def _usage(self):
        u = self.gen.usage()
        out = {"prompt_tokens": u["prompt"], "completion_tokens": u["completion"],
               "total_tokens": u["prompt"] + u["completion"],
               "completion_tokens_details": {"reasoning_tokens": u["reasoning"]}}
        if "cached" in u:
            # prompt tokens found in the slot's KV cache (a follow-up turn evaluates only the new ones)
            out["prompt_tokens_details"] = {"cached_tokens": u["cached"]}
        return out

    def _finish(self, choice, calls):
        fin = choice.finish_reason(calls)
        return "function_call" if self.legacy and fin == "tool_calls" else fin

    async def whole(self, req):
        await self.gen.drain(req)
        # logprobs of thousands of tokens make megabytes of JSON: built off the event loop
        return await serialised(self._whole, self.gen.st.cfg.max_reply_bytes)

    def _whole(self):
        choices = []
        for c in self.gen.choices:
            r, content, calls = c.result()
            fin = self._finish(c, calls)
            if self.chat:
                msg = {"role": "assistant", "content": content if content or not calls else None}
                if r is not None:
                    msg["reasoning_content"] = r
                if calls and self.legacy:
                    msg["function_call"] = calls[0]["function"]
                elif calls:
                    msg["tool_calls"] = calls
                choices.append({"index": c.index, "message": msg, "logprobs": self._logprobs(c.records),
                                "finish_reason": fin})
            else:
                choices.append({"index": c.index, "text": content, "logprobs": self._logprobs(c.records),
                                "finish_reason": fin})
        return Reply(200, {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                           "created": self.created, "model": self.model, "choices": choices,
                           "usage": self._usage(), "system_fingerprint": None})

    async def events(self, req):
        chat = self.chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage = self.gen.request.output.include_usage
        offsets = {}

        def chunk(c, delta=None, text=None, finish=None):
            lp = None
            if c.unsent and (delta or text or finish):
                off = offsets.get(c.index, 0)
                lp = self._logprobs(c.unsent, off)
                if lp is not None and not chat:
                    offsets[c.index] = off + sum(len(s) for s in lp["tokens"])
                c.unsent = []
            if chat:
                choice = {"index": c.index, "delta": delta or {}, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": c.index, "text": text or "", "logprobs": lp, "finish_reason": finish}
            out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                   "system_fingerprint": None, "choices": [choice]}
            if usage:
                out["usage"] = None
            return sse(out)

        if chat:
            for c in self.gen.choices:
                yield chunk(c, {"role": "assistant", "content": ""})
        try:
            async for c, text, fin in self.gen.events(req):
                if fin is None:
                    if not chat:
                        if text:
                            yield chunk(c, text=text)
                        continue
                    delta = _delta(*c.stream_delta(text))
                    if delta:
                        yield chunk(c, delta)
                elif fin != "cancelled":
                    if not chat:
                        yield chunk(c, text="", finish=fin)
                        continue
                    r, content, calls = c.stream_end()
                    delta = _delta(r, content, calls, self.legacy)
                    if delta:
                        yield chunk(c, delta)
                    yield chunk(c, {}, finish=self._finish(c, calls))
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            yield sse(error_for(e).body)
        if usage:
            yield sse({"id": self.id, "object": obj, "created": self.created, "model": self.model,
                       "system_fingerprint": None, "choices": [], "usage": self._usage()})
        yield b"data: [DONE]\n\n"


async def reply(gen, req, render=None):
    """The started generation `gen` as OpenAI's reply (or as `render`'s, another protocol's
    renderer with the same whole() and events()): a stream of chunks or one object."""
    render = render or _Render(gen)
    if gen.request.output.stream:
        return StreamReply(render.events(req), gen.close)
    try:
        return await render.whole(req)
    finally:
        await gen.close()


# --- embeddings ----------------------------------------------------------------------------

def embeddings_reply(name, vecs, n_tokens, dimensions=None, encoding_format="float"):
    """POST /v1/embeddings: pooled, L2-normalised vectors, float or base64."""
    if isinstance(vecs, list):      # the model's own pooling type is none (llama-server too)
        raise RequestError(f"model {name!r} has no pooling type (<arch>.pooling_type): "
                           "ask for one with 'pooling' (mean, cls or last)", param="pooling")
    if dimensions is not None:
        if dimensions > vecs.shape[1]:
            raise RequestError(f"'dimensions' {dimensions} is more than the model's "
                               f"{vecs.shape[1]}", param="dimensions")
        # OpenAI's text-embedding-3 shortening: the first values, normalised again
        vecs = vecs[:, :dimensions]
        vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-30)
    vecs = vecs.astype("<f4")
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.tobytes()).decode() if encoding_format == "base64"
             else v.tolist()} for i, v in enumerate(vecs)]
    return Reply(200, {"object": "list", "data": data, "model": name,
                       "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


def llama_embedding_reply(vecs):
    """POST /embedding (llama-server): [{"index", "embedding": [vector]}], one vector per token
    (not normalised) when the pooling is none."""
    return Reply(200, [{"index": i, "embedding": v.tolist() if v.ndim == 2 else [v.tolist()]}
                       for i, v in enumerate(vecs)])
