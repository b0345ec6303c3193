"""A client of a running daemon: HTTP over its Unix socket through httpx's transport,
JSON replies, OpenAI-shaped errors turned into EdgedError, and SSE streams parsed by httpx-sse.
Used by `edged chat`, `edged models`, `edged ps`, `edged load` and `edged unload`, which import
it when they run: httpx would cost `edged --help` and every other command its import time."""
import errno
import json

import httpx
import httpx_sse

from ..errors import EdgedError

CONNECT_SECONDS = 10.0
READ_SECONDS = 600.0           # a load verifies and maps a model; a reply may be long


def _os_error(e):
    """The OSError under an httpx connection error (httpx -> httpcore -> OSError)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


class Daemon:
    """A connection to the daemon at `socket_path`; use as a context manager."""

    def __init__(self, socket_path):
        self.path = socket_path
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://edged",
                                 timeout=httpx.Timeout(READ_SECONDS, connect=CONNECT_SECONDS))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.http.close()

    def _connect_error(self, e):
        err = _os_error(e)
        code = getattr(err, "errno", None)
        if code in (errno.ENOENT, errno.ENOTDIR):
            return EdgedError(f"no daemon socket at {self.path} (is `edged serve` running? --socket?)")
        if code in (errno.EACCES, errno.EPERM):
            return EdgedError(f"permission denied on {self.path} (are you in the socket's group?)")
        if code == errno.ECONNREFUSED:
            return EdgedError(f"nothing listening on {self.path}")
        return EdgedError(f"cannot reach the daemon at {self.path}: {err or e}")

    @staticmethod
    def _error(r):
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text.strip()
        return EdgedError(f"daemon answered {r.status_code}: {msg}")

    def request(self, method, path, body=None):
        """The JSON reply of one request; EdgedError for a non-2xx status or no daemon."""
        try:
            r = self.http.request(method, path, json=body)
        except httpx.TransportError as e:
            raise self._connect_error(e) from None
        if r.status_code // 100 != 2:
            raise self._error(r)
        return r.json()

    def stream(self, path, body):
        """POST a streaming request; yields each event's JSON until `data: [DONE]`."""
        try:
            with httpx_sse.connect_sse(self.http, "POST", path, json={**body, "stream": True}) as source:
                if source.response.status_code != 200:
                    source.response.read()
                    raise self._error(source.response)
                for event in source.iter_sse():
                    if event.data == "[DONE]":
                        return
                    data = json.loads(event.data)
                    if "error" in data:
                        raise EdgedError(f"daemon: {data['error'].get('message')}")
                    yield data
        except httpx.TransportError as e:
            raise self._connect_error(e) from None
