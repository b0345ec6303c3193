"""What the transport hands a handler and gets back, whatever the wire protocol.

No socket here: the transport (service/transport.py) turns an aiohttp request into an
ApiRequest (method, path, body bytes, peer credentials, a "client gone?" probe) and writes back
the Reply or StreamReply a handler returns, so tests drive every route with plain objects.
Errors become replies in one place (error_for: the status from edged/errors.py); each wire
protocol shapes the body (OpenAI's {"error": {...}} by default).
"""
import dataclasses
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
