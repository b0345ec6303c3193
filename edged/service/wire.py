"""What the transport hands a handler and gets back, whatever the wire protocol.

No socket here: the transport (service/transport.py) turns an aiohttp request into an
ApiRequest (method, path, body bytes, peer credentials, a "client gone?" probe) and writes back
the Reply or StreamReply a handler returns, so tests drive every route with plain objects.
Errors become replies in one place (error_for: the status from edged/errors.py); each wire
protocol shapes the body (OpenAI's {"error": {...}} by default).
"""
import asyncio
import concurrent.futures
import dataclasses
import functools
import json

from ..errors import EdgedError, HTTPError, RequestError, http_error
from .log import log


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
    api_key: str | None = None                # over TCP: apikeys.key_id of the key that admitted it
    query: dict = dataclasses.field(default_factory=dict)  # the URL's query parameters (last value of each)


@dataclasses.dataclass
class Reply:
    status: int
    body: object                               # dict (JSON) or str (text)
    headers: dict = dataclasses.field(default_factory=dict)
    content_type: str = "application/json"
    data: bytes | None = None                  # the body serialised already (serialised())

    def payload(self):
        if self.data is not None:
            return self.data
        if isinstance(self.body, str):
            return self.body.encode()
        return dumps(self.body)


SLICE = 4096        # values serialised by one call of the C encoder (a few milliseconds)


def dumps(obj):
    """obj as JSON bytes, as json.dumps(obj, ensure_ascii=False) would write them, a few
    thousand values per call of the C encoder: one call holds the interpreter's lock for its
    whole input (a second or more for megabytes), and a worker thread serialising a large
    reply would stall the event loop just the same."""
    return "".join(_parts(obj)).encode()


def _size(obj):
    """Values in obj, estimated: a list counts as len x its first item (replies are uniform)."""
    if isinstance(obj, dict):
        return 1 + sum(_size(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return 1 + (len(obj) * _size(obj[0]) if obj else 0)
    return 1


def _parts(obj):
    if _size(obj) <= SLICE:
        yield json.dumps(obj, ensure_ascii=False)
    elif isinstance(obj, dict):
        yield "{"
        for i, (k, v) in enumerate(obj.items()):
            yield (", " if i else "") + json.dumps(str(k), ensure_ascii=False) + ": "
            yield from _parts(v)
        yield "}"
    else:
        yield "["
        run, n, first = [], 0, True
        for x in obj:
            size = _size(x)
            if run and n + size > SLICE:
                yield ("" if first else ", ") + json.dumps(run, ensure_ascii=False)[1:-1]
                run, n, first = [], 0, False
            if size > SLICE:
                yield "" if first else ", "
                yield from _parts(x)
                first = False
            else:
                run.append(x)
                n += size
        if run:
            yield ("" if first else ", ") + json.dumps(run, ensure_ascii=False)[1:-1]
        yield "]"


def reply_too_large(what, limit):
    return HTTPError(400, f"the reply ({what}) would exceed max_reply_bytes={limit}: ask for less, "
                     "or stream it", code="reply_too_large")


# Bulk work (replies of megabytes, tokenizing a body) runs in this one thread: building JSON is
# Python work that holds the interpreter's lock, and several threads doing it at once keep the
# event loop from it for hundreds of milliseconds; one thread lets it in every switch interval.
BULK = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edged-bulk")


async def serialised(build, limit):
    """The Reply that `build()` makes, built and serialised in the bulk thread (a reply of
    megabytes would stall the event loop, and every other client with it); 400
    reply_too_large past `limit` bytes."""
    def run():
        reply = build()
        reply.data = reply.payload()
        if len(reply.data) > limit:
            raise reply_too_large(f"{len(reply.data)} bytes", limit)
        return reply
    return await asyncio.get_running_loop().run_in_executor(BULK, run)


class StreamReply:
    """A streamed body (server-sent events by default). Iterate `chunks()` for the bytes;
    `close()` always (idempotent)."""
    status = 200

    def __init__(self, chunks, close, content_type="text/event-stream"):
        self.headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        self.content_type = content_type
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


def errors_as(shape):
    """A decorator for a wire protocol's handlers (methods taking an ApiRequest): an exception
    becomes `shape(e)`, the protocol's own error reply."""
    def decorate(handler):
        @functools.wraps(handler)
        async def run(self, req):
            try:
                return await handler(self, req)
            except Exception as e:  # noqa: BLE001 - every error becomes the protocol's reply
                return shape(e)
        return run
    return decorate


def json_body(req, limit):
    """The request's body parsed as JSON (413 past `limit` bytes, 400 when it is not JSON)."""
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


def sse(obj):
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
