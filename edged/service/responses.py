"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Parses a body (the pydantic models of service/responses_schema.py) into the one internal
request (service/request.py): `instructions` and the `input` items become chat messages
(function_call / function_call_output items become tool calls and tool messages, reasoning
items the assistant's reasoning_content), `text.format` the constraint, function tools the
ToolUse. It runs through Api.generate like every protocol, and the generation's events come
back as a `response` object, or streamed as Responses' semantic server-sent events
(response.created, response.in_progress, response.output_item.added, ...content_part.added,
...output_text.delta, ..., response.completed), each with its sequence_number.

`previous_response_id` continues a stored response: a bounded in-memory store (Store) keeps
each response's conversation (its input and output, not its instructions, as OpenAI) and
object (and the images its messages hold) for at most `responses_store_max_age` seconds, `responses_store_max` of them; a response
made with `store: false` is not kept. An entry belongs to the peer that made it (its uid on the
Unix socket, its API key over TCP): to any other peer it does not exist (404).
"""
import collections
import dataclasses
import json
import secrets
import time

from ..errors import HTTPError, RequestError
from ..text.sampling import SamplingParams
from . import images, openai, responses_schema as schema
from .openai import _tool, chat_logprobs
from .openai_schema import FunctionDef, Tool
from .request import ConstraintSpec, GenerateRequest, Output, ToolUse
from .wire import Reply, error_for, json_body, serialised

PATH = "/v1/responses"
# Chat Completions' defaults for what a request leaves out (openai_schema._Common)
SAMPLING_DEFAULTS = {"temperature": 1.0}


def routes(api):
    """((method, path) -> handler, (method, path prefix) -> handler of PREFIX{id}) for Api."""
    r = Responses(api)
    return {("POST", PATH): r.create}, {("GET", PATH + "/"): r.retrieve, ("DELETE", PATH + "/"): r.delete,
                                        ("GET", PATH + "/*/input_items"): r.input_items}


def owner(req):
    """Who a stored response belongs to: the Unix peer's uid, or the API key over TCP."""
    if req.tcp:
        return ("key", req.api_key)
    return ("uid", req.peer.uid) if req.peer is not None else ("local",)


def _id(prefix):
    return f"{prefix}_{secrets.token_hex(16)}"


# --- the store -----------------------------------------------------------------------------

@dataclasses.dataclass
class Entry:
    owner: tuple
    t: float                    # time.monotonic() when stored
    messages: tuple             # the conversation so far (input and output), without instructions
    response: dict              # the response object, as GET returns it
    input_items: tuple = ()     # this request's input as items with ids (GET .../input_items)
    images: tuple = ()          # the conversation's ImageRefs, in the order of its markers


class Store:
    """Responses kept for previous_response_id and GET/DELETE: at most `responses_store_max`
    (oldest dropped first), none older than `responses_store_max_age` seconds (config keys,
    read at each use so a reload applies). Entries of a chain share their message dicts."""

    def __init__(self):
        self.entries = collections.OrderedDict()

    def _expire(self, cfg):
        now = time.monotonic()
        while self.entries:
            e = next(iter(self.entries.values()))
            if len(self.entries) <= cfg.responses_store_max and now - e.t <= cfg.responses_store_max_age:
                break
            self.entries.popitem(last=False)

    def put(self, cfg, rid, entry):
        if cfg.responses_store_max > 0:
            self.entries[rid] = entry
        self._expire(cfg)

    def get(self, cfg, rid, who):
        self._expire(cfg)
        e = self.entries.get(rid)
        return e if e is not None and e.owner == who else None

    def delete(self, cfg, rid, who):
        if self.get(cfg, rid, who) is None:
            return False
        del self.entries[rid]
        return True


def not_found(rid, param=None):
    e = HTTPError(404, f"no response {rid!r}: unknown, expired (responses_store_max_age), dropped "
                  "(responses_store_max), deleted, made with 'store': false, or made by another client",
                  code="not_found")
    e.param = param
    return e


def input_items(r):
    """The request's input as the items GET /v1/responses/{id}/input_items lists: each with an
    id (the one sent, or a new one) and a status; message content as parts."""
    items = [schema.Message(role="user", content=r.input)] if isinstance(r.input, str) else r.input
    out = []
    for x in items:
        d = x.model_dump(by_alias=True, exclude_none=True)
        d.setdefault("status", "completed")
        if isinstance(x, schema.Message):
            d.pop("phase", None)
            if isinstance(x.content, str):
                d["content"] = [{"type": "output_text" if x.role == "assistant" else "input_text",
                                 "text": x.content}]
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(d["type"], "rs")
        d.setdefault("id", _id(prefix))
        out.append(d)
    return tuple(out)


# --- request bodies -> GenerateRequest -----------------------------------------------------

def _text(content, refs=None, where=""):
    """The text of a message's content: a string, or its parts (text or refusal) joined; an
    input_image part the image marker, its ImageRef appended to `refs`."""
    if isinstance(content, str):
        return content
    out = []
    for j, p in enumerate(content):
        if p.type == "input_image":
            if refs is None:
                raise RequestError(f"'{where}.content[{j}]': images go in input messages", param=where)
            refs.append(images.url_ref(p.image_url, f"{where}.content[{j}].image_url"))
            out.append(images.MARKER)
        else:
            out.append(p.refusal if p.type == "refusal" else p.text)
    return "".join(out)


def messages(items, history=(), refs=None):
    """Input items -> chat messages as templates see them (service/openai.py _message). The
    items of one assistant turn (reasoning, message, function calls, as a response's output
    lists them) become one assistant message. Images of input messages: their markers in the
    text, their ImageRefs appended to `refs`."""
    names = {c["id"]: c["function"]["name"] for m in history for c in m.get("tool_calls", ())}
    out = []

    def turn():
        """The assistant message items may still add to, or None."""
        return out[-1] if out and out[-1]["role"] == "assistant" else None

    for i, x in enumerate(items):
        last = turn()
        if isinstance(x, schema.Message):
            role = "system" if x.role == "developer" else x.role
            if role == "assistant" and last is not None and not last["content"] and "tool_calls" not in last:
                last["content"] = _text(x.content)
            else:
                out.append({"role": role, "content": _text(x.content, refs if role == "user" else None,
                                                           f"input[{i}]")})
        elif isinstance(x, schema.FunctionCallItem):
            names[x.call_id] = x.name
            call = {"id": x.call_id, "type": "function", "function": {"name": x.name, "arguments": x.arguments}}
            if last is None:
                out.append(last := {"role": "assistant", "content": ""})
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(x, schema.FunctionCallOutput):
            m = {"role": "tool", "content": _text(x.output) if isinstance(x.output, list) else x.output,
                 "tool_call_id": x.call_id}
            if x.name or x.call_id in names:
                m["name"] = x.name or names[x.call_id]
            out.append(m)
        else:                                   # reasoning: its text, if it was sent back
            text = "".join(c.text for c in x.content or () if c.type == "reasoning_text")
            if not text:
                continue
            if last is not None and "reasoning_content" not in last and not last["content"]:
                last["reasoning_content"] = text
            else:
                out.append({"role": "assistant", "content": "", "reasoning_content": text})
    return out


def _tools(r):
    """(chat-template tools, ToolUse choice) of `tools` and `tool_choice`."""
    tools = [_tool(Tool(type="function", function=FunctionDef(
        **t.model_dump(exclude_none=True, exclude=schema.FunctionTool.EXTRA)))) for t in r.tools or ()]
    tc = r.tool_choice
    if isinstance(tc, schema.AllowedTools):
        allowed = {t.name for t in tc.tools}
        return [t for t in tools if t["function"]["name"] in allowed], tc.mode
    if isinstance(tc, schema.NamedFunction):
        return tools, tc.name
    return tools, tc or ("auto" if tools else "none")


def _constraint(r):
    fmt = r.text.format if r.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ConstraintSpec("json_schema", {"type": "object"}, "text.format")
    return ConstraintSpec("json_schema", fmt.schema_, "text.format.schema")


def parse(r, history=(), history_images=()):
    """A validated ResponsesRequest (and the stored conversation it continues, with its images)
    -> (GenerateRequest, this request's input as chat messages)."""
    given = {f.name: getattr(r, f.name) for f in dataclasses.fields(SamplingParams)
             if getattr(r, f.name, None) is not None}
    sampling = SamplingParams(**{**SAMPLING_DEFAULTS, **given})
    refs = list(history_images)
    new = messages([schema.Message(role="user", content=r.input)] if isinstance(r.input, str) else r.input,
                   history, refs)
    convo = list(history) + new                 # a stored turn's images go on with it
    if r.instructions:
        convo.insert(0, {"role": "system", "content": r.instructions})
    if not convo:
        raise RequestError("'input' must be a non-empty string or list of items", param="input")
    tools, choice = _tools(r)
    kwargs = dict(r.chat_template_kwargs or {})
    effort = r.reasoning.effort if r.reasoning else None
    if effort == "none":
        kwargs.setdefault("enable_thinking", False)
    elif effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
    stop = (r.stop,) if isinstance(r.stop, str) else tuple(r.stop or ())
    # logprobs when included (or alternatives asked for): each token's and top_logprobs others'
    logprobs = (r.top_logprobs or 0) if schema.LOGPROBS in (r.include or ()) or r.top_logprobs else None
    request = GenerateRequest(
        model=r.model, sampling=sampling, constraint=_constraint(r),
        output=Output(max_tokens=r.max_output_tokens, stop=stop, stream=bool(r.stream), logprobs=logprobs),
        tools=ToolUse(tuple(tools), choice, r.parallel_tool_calls is not False),
        messages=tuple(convo), template_kwargs=kwargs, images=tuple(refs))
    return request, new


# --- generation events -> Responses' shapes ------------------------------------------------

def _event(kind, seq, **fields):
    return (f"event: {kind}\ndata: ".encode() +
            json.dumps({"type": kind, "sequence_number": seq, **fields}, ensure_ascii=False).encode() + b"\n\n")


class _Item:
    """One output item as it streams: a reasoning item or a message (one text part)."""

    def __init__(self, kind, index, text="", logprobs=None):
        self.kind, self.index, self.text = kind, index, text
        self.logprobs = logprobs or []      # a message's: OpenAI's chat logprobs `content`
        self.id = _id("rs" if kind == "reasoning" else "msg")

    @property
    def part_type(self):
        return "reasoning_text" if self.kind == "reasoning" else "output_text"

    def part(self):
        p = {"type": self.part_type, "text": self.text}
        if self.kind == "message":
            p.update(annotations=[], logprobs=self.logprobs)
        return p

    def item(self, status):
        if self.kind == "reasoning":
            return {"type": "reasoning", "id": self.id, "summary": [], "status": status,
                    "content": [self.part()] if status != "in_progress" else []}
        return {"type": "message", "id": self.id, "role": "assistant", "status": status,
                "content": [self.part()] if status != "in_progress" else []}


def _call_item(call, status="completed", arguments=None):
    fn = call["function"]
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": fn["name"], "arguments": fn["arguments"] if arguments is None else arguments,
            "status": status}


class _Render:
    """One generation as a `response` object, whole or as semantic events; stores it at the end
    unless `store` is false."""

    def __init__(self, responses, gen, r, new, history, who, images=()):
        self.r, self.gen, self.new, self.history, self.who = r, gen, new, history, who
        self.images = images
        self.responses = responses
        self.id = _id("resp")
        self.created = int(time.time())
        self.seq = 0

    def response(self, status, output, usage=None):
        r = self.r
        fmt = r.text.format.model_dump(by_alias=True, exclude_none=True) if r.text and r.text.format \
            else {"type": "text"}
        tc = r.tool_choice
        out = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": None, "incomplete_details": None, "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens, "model": self.gen.lm.name, "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": r.reasoning.effort if r.reasoning else None, "summary": None},
            "store": r.store is not False, "temperature": self.gen.request.sampling.temperature,
            "text": {"format": fmt}, "top_p": self.gen.request.sampling.top_p, "truncation": "disabled",
            "tool_choice": tc.model_dump() if hasattr(tc, "model_dump") else tc or "auto",
            "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in r.tools or ()],
            "usage": usage, "user": None, "metadata": r.metadata or {}}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    def usage(self):
        u = self.gen.usage()
        return {"input_tokens": u["prompt"], "input_tokens_details": {"cached_tokens": u.get("cached", 0)},
                "output_tokens": u["completion"], "output_tokens_details": {"reasoning_tokens": u["reasoning"]},
                "total_tokens": u["prompt"] + u["completion"]}

    def final(self, choice, output, reasoning, content, calls):
        """The finished response object; stored (with the conversation it ends) unless store
        is false."""
        status = "incomplete" if choice.finish == "length" else "completed"
        obj = self.response(status, output, self.usage())
        if self.r.store is not False:
            # the model's text never stands for an image of the conversation
            reply = {"role": "assistant", "content": content.replace(images.MARKER, "") if content else content}
            if reasoning:
                reply["reasoning_content"] = reasoning
            if calls:
                reply["tool_calls"] = calls
            convo = tuple(self.history) + tuple(self.new) + (reply,)
            self.responses.store.put(self.responses.cfg, self.id,
                                     Entry(self.who, time.monotonic(), convo, obj, input_items(self.r),
                                           self.images))
        return obj

    async def whole(self, req):
        await self.gen.drain(req)
        c = self.gen.choices[0]
        r, content, calls = c.result()
        status = "incomplete" if c.finish == "length" else "completed"
        output = []
        if r:
            output.append(_Item("reasoning", 0, r).item(status))
        if content or not (calls or r):
            output.append(_Item("message", len(output), content, self._logprobs(c.records)).item(status))
        output += [_call_item(call) for call in calls]
        obj = self.final(c, output, r, content, calls)
        return await serialised(lambda: Reply(200, obj), self.gen.st.cfg.max_reply_bytes)

    # --- streaming ----------------------------------------------------------------------
    def _ev(self, kind, **fields):
        self.seq += 1
        return _event(kind, self.seq - 1, **fields)

    def _open(self, kind, output):
        item = _Item(kind, len(output))
        output.append(None)             # its place; the finished item goes there
        return item, [
            self._ev("response.output_item.added", output_index=item.index, item=item.item("in_progress")),
            self._ev("response.content_part.added", item_id=item.id, output_index=item.index, content_index=0,
                     part=item.part())]

    def _logprobs(self, records):
        if self.gen.request.output.logprobs is None:
            return []
        return chat_logprobs(self.gen.lm.tokenizer, records)["content"]

    def _delta(self, item, delta, choice):
        """A text delta, with the logprobs of the tokens not yet sent (a reasoning delta's are
        dropped)."""
        item.text += delta
        records, choice.unsent = choice.unsent, []
        if item.kind == "reasoning":
            return self._ev("response.reasoning_text.delta", item_id=item.id, output_index=item.index,
                            content_index=0, delta=delta)
        lp = self._logprobs(records)
        item.logprobs += lp
        return self._ev("response.output_text.delta", item_id=item.id, output_index=item.index, content_index=0,
                        delta=delta, logprobs=lp)

    def _close(self, item, output, status):
        where = dict(item_id=item.id, output_index=item.index, content_index=0)
        done = "response.reasoning_text.done" if item.kind == "reasoning" else "response.output_text.done"
        extra = {"logprobs": item.logprobs} if item.kind == "message" else {}
        output[item.index] = item.item(status)
        return [self._ev(done, **where, text=item.text, **extra),
                self._ev("response.content_part.done", **where, part=item.part()),
                self._ev("response.output_item.done", output_index=item.index, item=output[item.index])]

    async def events(self, req):
        output, item, texts = [], None, {"reasoning": "", "message": ""}
        yield self._ev("response.created", response=self.response("in_progress", []))
        yield self._ev("response.in_progress", response=self.response("in_progress", []))
        try:
            async for c, text, fin in self.gen.events(req):
                if fin == "cancelled":
                    return
                calls = []
                if fin is None:
                    deltas = c.stream_delta(text)
                else:
                    reason, content, calls = c.stream_end()
                    deltas = (reason, content)
                for kind, delta in zip(("reasoning", "message"), deltas):
                    if not delta:
                        continue
                    if item is not None and item.kind != kind:
                        for b in self._close(item, output, "completed"):
                            yield b
                        item = None
                    if item is None:
                        item, evs = self._open(kind, output)
                        for b in evs:
                            yield b
                    texts[kind] += delta
                    yield self._delta(item, delta, c)
                if fin is None:
                    continue
                status = "incomplete" if c.finish == "length" else "completed"
                if item is None and not texts["message"] and not calls:
                    item, evs = self._open("message", output)       # an empty reply: an empty message
                    for b in evs:
                        yield b
                if item is not None:
                    for b in self._close(item, output, status):
                        yield b
                for call in calls:
                    index = len(output)
                    output.append(_call_item(call))
                    fc = output[index]
                    yield self._ev("response.output_item.added", output_index=index,
                                   item=_call_item(call, "in_progress", ""))
                    yield self._ev("response.function_call_arguments.delta", item_id=fc["id"], output_index=index,
                                   delta=fc["arguments"])
                    yield self._ev("response.function_call_arguments.done", item_id=fc["id"], output_index=index,
                                   arguments=fc["arguments"])
                    yield self._ev("response.output_item.done", output_index=index, item=fc)
                obj = self.final(c, output, texts["reasoning"] or None, texts["message"], calls)
                yield self._ev(f"response.{status}", response=obj)
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            err = error_for(e).body["error"]
            yield self._ev("error", code=err["code"], message=err["message"], param=err["param"])
            failed = self.response("failed", [x for x in output if x is not None])
            failed["error"] = {"code": err["code"] or "server_error", "message": err["message"]}
            yield self._ev("response.failed", response=failed)


class Responses:
    """The /v1/responses routes over an Api (service/api.py): its admission and state, and
    the store of responses."""

    def __init__(self, api):
        self.api = api
        self.store = Store()

    @property
    def cfg(self):
        return self.api.state.cfg

    async def create(self, req):
        r = schema.validate(json_body(req, self.cfg.max_body_bytes))
        who = owner(req)
        history, history_images = (), ()
        if r.previous_response_id is not None:
            e = self.store.get(self.cfg, r.previous_response_id, who)
            if e is None:
                raise not_found(r.previous_response_id, "previous_response_id")
            history, history_images = e.messages, e.images
        request, new = parse(r, history, history_images)
        gen = await self.api.generate(req, request)
        return await openai.reply(gen, req, _Render(self, gen, r, new, history, who, request.images))

    def _rid(self, req):
        return req.path[len(PATH) + 1:]

    async def retrieve(self, req):
        rid = self._rid(req)
        e = self.store.get(self.cfg, rid, owner(req))
        if e is None:
            raise not_found(rid)
        return Reply(200, e.response)

    async def input_items(self, req):
        """GET /v1/responses/{id}/input_items: the response's input items, a page at a time
        (`limit` 1-100, default 20; `order` asc or desc, default desc; `after` an item id)."""
        rid = self._rid(req).removesuffix("/input_items")
        e = self.store.get(self.cfg, rid, owner(req))
        if e is None:
            raise not_found(rid)
        q = req.query
        try:
            limit = int(q.get("limit", 20))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise RequestError(f"'limit' must be an integer from 1 to 100, got {q.get('limit')!r}", param="limit")
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise RequestError(f"'order' must be 'asc' or 'desc', got {order!r}", param="order")
        items = list(e.input_items if order == "asc" else reversed(e.input_items))
        if "after" in q:
            ids = [x["id"] for x in items]
            if q["after"] not in ids:
                raise RequestError(f"'after' names no input item of {rid!r}: {q['after']!r}", param="after")
            items = items[ids.index(q["after"]) + 1:]
        page = items[:limit]
        return Reply(200, {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                           "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})

    async def delete(self, req):
        rid = self._rid(req)
        if not self.store.delete(self.cfg, rid, owner(req)):
            raise not_found(rid)
        return Reply(200, {"id": rid, "object": "response", "deleted": True})

