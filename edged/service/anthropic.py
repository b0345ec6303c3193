"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

Parses a body (the pydantic models of service/anthropic_schema.py) into the one internal
request (service/request.py): `system` and the messages' text blocks become chat turns,
`tool_use` blocks an assistant's tool calls, `tool_result` blocks tool turns, `thinking`
blocks the reasoning the template is given back. A generation's events (service/jobs.py) are
rendered back as a `message` with content blocks (thinking, text, tool_use), or as Anthropic's
server-sent events in its order: message_start, per block content_block_start (a ping after
the first), content_block_delta (thinking_delta, text_delta, input_json_delta),
content_block_stop, then message_delta (stop_reason, usage) and message_stop. Errors are
{"type": "error", "error": {"type", "message"}}. Admission, authorization and scheduling are
the Api's (service/api.py), as for every protocol.
"""
import asyncio
import dataclasses
import json
import secrets

from ..text.sampling import SamplingParams
from . import anthropic_schema as schema, images, openai
from .prepare import prepare
from .request import ConstraintSpec, GenerateRequest, Output, ToolUse
from .wire import Reply, error_for, errors_as, json_body

JOIN = "\n\n"       # between the text blocks of one turn

# Anthropic's error types by HTTP status; 5xx other than overload are api_error
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def routes(api):
    """(method, path) -> handler of the Messages routes, for Api's table."""
    a = Anthropic(api)
    return {("POST", "/v1/messages"): a.messages, ("POST", "/v1/messages/count_tokens"): a.count_tokens}


def error_reply(e):
    """An exception as Anthropic's error reply, with the status edged/errors.py gives."""
    r = error_for(e)
    kind = ERROR_TYPES.get(r.status, "api_error" if r.status >= 500 else "invalid_request_error")
    return Reply(r.status, {"type": "error", "error": {"type": kind, "message": r.body["error"]["message"]}},
                 headers=r.headers)


_anthropic_errors = errors_as(error_reply)


def owns(path):
    """Is `path` one of the Messages API's (its errors then come in Anthropic's shape)?"""
    return path.startswith("/v1/messages")


def reshaped(reply):
    """An OpenAI-shaped error reply (what the transport and Api.handle answer before a route
    runs: 401, 403, 404, 405, 408, 413, 503) in Anthropic's shape; other replies as they are."""
    body = getattr(reply, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and "type" not in body:
        kind = ERROR_TYPES.get(reply.status, "api_error" if reply.status >= 500 else "invalid_request_error")
        return Reply(reply.status, {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}},
                     headers=reply.headers)
    return reply


# --- request bodies -> GenerateRequest -----------------------------------------------------

def _joined(content):
    return content if isinstance(content, str) else JOIN.join(b.text for b in content)


def _messages(r):
    """(The chat turns (OpenAI-shaped, as templates see them) of a validated body, the
    ImageRefs of its image blocks: each an image marker in its turn's text)."""
    out = [{"role": "system", "content": _joined(r.system)}] if r.system else []
    refs = []
    names = {}                  # tool_use id -> tool name, for the tool turns that answer it
    for i, m in enumerate(r.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            msg = {"role": "assistant", "content": JOIN.join(b.text for b in m.content
                                                             if isinstance(b, schema.TextBlock))}
            thinking = "".join(b.thinking for b in m.content if isinstance(b, schema.ThinkingBlock))
            if thinking:
                msg["reasoning_content"] = thinking
            uses = [b for b in m.content if isinstance(b, schema.ToolUseBlock)]
            if uses:
                names.update((b.id, b.name) for b in uses)
                msg["tool_calls"] = [{"id": b.id, "type": "function", "function": {
                    "name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}} for b in uses]
            out.append(msg)
        else:                   # user (or system) blocks in order: text runs and tool results
            texts = []
            for j, b in enumerate(m.content + [None]):
                if isinstance(b, schema.TextBlock):
                    texts.append(b.text)
                    continue
                if isinstance(b, schema.ImageBlock):
                    refs.append(images.base64_ref(b.source.data, f"messages[{i}].content[{j}].source.data"))
                    texts.append(images.MARKER)
                    continue
                if texts:
                    out.append({"role": m.role, "content": JOIN.join(texts)})
                    texts = []
                if isinstance(b, schema.ToolResultBlock):
                    msg = {"role": "tool", "tool_call_id": b.tool_use_id, "content": _joined(b.content)}
                    if b.tool_use_id in names:
                        msg["name"] = names[b.tool_use_id]
                    out.append(msg)
    return tuple(out), tuple(refs)


def _tools(r):
    """ToolUse of `tools` and `tool_choice` (none of them: auto when tools are given)."""
    tools = tuple({"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                    "parameters": t.input_schema}} for t in r.tools or ())
    tc = r.tool_choice
    if tc is None:
        return ToolUse(tools, "auto" if tools else "none")
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(tc.type) or tc.name
    return ToolUse(tools, choice, not getattr(tc, "disable_parallel_tool_use", False))


def parse(body, count=False):
    """A /v1/messages body (count: /v1/messages/count_tokens) -> GenerateRequest; RequestError
    naming the field."""
    r = schema.validate(body, count)
    t = r.thinking
    # enabled / disabled ask the chat template to think or not; adaptive leaves it its default.
    # Whatever the model thinks comes back as thinking blocks.
    kwargs = {"enable_thinking": t.type == "enabled"} if t is not None and t.type in ("enabled", "disabled") else {}
    fmt = r.output_config.format if r.output_config else None
    messages, refs = _messages(r)
    common = dict(model=r.model, messages=messages, images=refs, tools=_tools(r), template_kwargs=kwargs,
                  constraint=None if fmt is None else ConstraintSpec("json_schema", fmt.schema_,
                                                                     "output_config.format.schema"))
    if count:
        return GenerateRequest(**common)
    return GenerateRequest(
        **common, sampling=SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k),
        output=Output(max_tokens=r.max_tokens, stop=tuple(r.stop_sequences or ()), stream=r.stream))


# --- generation events -> Anthropic replies ------------------------------------------------

def _event(kind, data):
    """One server-sent event as Anthropic's API sends it: named, with its type in the data."""
    return (f"event: {kind}\ndata: ".encode() + json.dumps(dict(type=kind, **data), ensure_ascii=False).encode()
            + b"\n\n")


def _tool_use(call):
    """An OpenAI-shaped tool call (text/tools.py make_call) as a tool_use block: `input` is an
    object ({} when the model wrote something else)."""
    fn = call["function"]
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        args = None
    return {"type": "tool_use", "id": "toolu_" + secrets.token_hex(12), "name": fn["name"],
            "input": args if isinstance(args, dict) else {}}


class _Blocks:
    """The content blocks of a stream, as events: a block opens when its first delta comes and
    closes when one of another kind does. What the streamed blocks add up to equals the blocks
    of the whole reply: a text block opens at its first non-blank text, thinking is stripped at
    both ends (its trailing blanks are held back)."""

    def __init__(self):
        self.index, self.kind, self.pinged = -1, None, False
        self.lead = ""          # blank text before a text block opens
        self.tail = ""          # blank thinking held back
        self.out = []

    def _open(self, block):
        self.close()
        self.index += 1
        self.kind = block["type"]
        self.out.append(_event("content_block_start", {"index": self.index, "content_block": block}))
        if not self.pinged:
            self.ping()

    def ping(self):
        self.pinged = True
        self.out.append(_event("ping", {}))

    def _delta(self, delta):
        self.out.append(_event("content_block_delta", {"index": self.index, "delta": delta}))

    def close(self):
        if self.kind is not None:
            self.out.append(_event("content_block_stop", {"index": self.index}))
        self.kind, self.tail = None, ""

    def thinking(self, text):
        if self.kind != "thinking":
            text = text.lstrip()
            if not text:
                return
            self._open({"type": "thinking", "thinking": "", "signature": ""})
        text = self.tail + text
        body = text.rstrip()
        self.tail = text[len(body):]
        if body:
            self._delta({"type": "thinking_delta", "thinking": body})

    def text(self, text):
        if self.kind != "text":
            text, self.lead = self.lead + text, ""
            if not text.strip():
                self.lead = text
                return
            self._open({"type": "text", "text": ""})
        self._delta({"type": "text_delta", "text": text})

    def tool_use(self, block):
        self._open(dict(block, input={}))
        self._delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)})

    def take(self):
        out, self.out = self.out, []
        return out


class _Render:
    """One generation as an Anthropic message, whole or streamed."""

    def __init__(self, gen):
        self.gen = gen
        self.id = "msg_" + secrets.token_hex(12)
        self.model = gen.lm.name

    def _usage(self):
        """Anthropic's usage: input_tokens are the prompt tokens evaluated, the rest were read
        from the slot's KV cache (cache_read_input_tokens)."""
        u = self.gen.usage()
        cached = u.get("cached", 0)
        return {"input_tokens": u["prompt"] - cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached, "output_tokens": u["completion"]}

    @staticmethod
    def _stop(c, calls):
        """(stop_reason, stop_sequence) of a finished choice."""
        if c.finish == "length":
            return "max_tokens", None
        if calls:
            return "tool_use", None
        return ("stop_sequence", c.stop) if c.stop else ("end_turn", None)

    def _message(self, content, stop_reason=None, stop_sequence=None):
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": self._usage()}

    async def whole(self, req):
        await self.gen.drain(req)
        c = self.gen.choices[0]
        r, content, calls = c.result()
        blocks = [{"type": "thinking", "thinking": r.strip(), "signature": ""}] if r and r.strip() else []
        if content.strip():
            blocks.append({"type": "text", "text": content})
        blocks += [_tool_use(call) for call in calls]
        return Reply(200, self._message(blocks, *self._stop(c, calls)))

    async def events(self, req):
        blocks = _Blocks()
        yield _event("message_start", {"message": self._message([])})
        try:
            async for c, text, fin in self.gen.events(req):
                if fin is None:
                    r, content = c.stream_delta(text)
                    calls = ()
                elif fin == "cancelled":
                    return
                else:
                    r, content, calls = c.stream_end()
                if r:
                    blocks.thinking(r)
                if content:
                    blocks.text(content)
                for call in calls:
                    blocks.tool_use(_tool_use(call))
                if fin is not None:
                    blocks.close()
                    if not blocks.pinged:
                        blocks.ping()
                    reason, seq = self._stop(c, calls)
                    usage = self._usage()
                    blocks.out.append(_event("message_delta", {
                        "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage}))
                    blocks.out.append(_event("message_stop", {}))
                for chunk in blocks.take():
                    yield chunk
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            yield _event("error", {"error": error_reply(e).body["error"]})


async def reply(gen, req):
    """The started generation `gen` as Anthropic's reply: a stream of events or one message."""
    return await openai.reply(gen, req, _Render(gen))


class Anthropic:
    """The Messages routes over an Api (service/api.py): its admission, leases and state."""

    def __init__(self, api):
        self.api = api

    @_anthropic_errors
    async def messages(self, req):
        request = parse(json_body(req, self.api.state.cfg.max_body_bytes))
        return await reply(await self.api.generate(req, request), req)

    @_anthropic_errors
    async def count_tokens(self, req):
        """The prompt's tokens after the chat template (tools and system included), as
        {"input_tokens": N}; queued like a generation, nothing generated."""
        st = self.api.state
        request = parse(json_body(req, st.cfg.max_body_bytes), count=True)
        request = dataclasses.replace(request, constraint=None)     # no grammar to compile for a count
        name = st.registry.resolve(request.model)
        req.info.update(model=name, prompt_tokens=0)
        async with self.api._slot(req):
            lm = await self.api._acquire(name, st.cfg.queue_timeout, req)
            try:
                lm.model.require_decoder()
                prep = await asyncio.get_running_loop().run_in_executor(None, prepare, lm, request)
            finally:
                st.registry.release(lm)
        req.info["prompt_tokens"] = len(prep.prompts[0])
        return Reply(200, {"input_tokens": len(prep.prompts[0])})
