"""Chat templates rendered in a bounded process, so that a hostile template costs at most the
stated limits however it is written.

A template is untrusted code. edged/text/chat.py renders it in jinja2's sandbox and checks the
arguments of every filter, global and method that could make a large string or run long; what
no such check can see (a string doubled in a loop, a huge integer, a filter nobody thought of)
is bounded here, by the operating system:

- At start-up, before the daemon confines itself (its seccomp policy then forbids new
  processes), it forks a render worker. The worker closes every descriptor but its socket
  and stderr, dies with the daemon (PR_SET_PDEATHSIG), and applies the daemon's sandbox with
  one difference: it may fork, never exec (edged/service/sandbox.py `allow_fork`). It runs no
  template itself.
- For each render the worker forks a fresh child. The child limits its own address space to
  what it has plus `RENDER_MEMORY` (RLIMIT_AS: an allocation past it fails with MemoryError),
  its CPU time (RLIMIT_CPU), forbids itself new processes and threads (seccomp), renders, and
  writes the result as JSON to a pipe. The worker kills it at the time limit and refuses more
  output than the size limit allows.
- The daemon talks to the worker over a socketpair, JSON both ways (never pickle: a child that
  escaped the jinja2 sandbox must not be able to send code). A child that crashes or is killed
  costs one failed render; the next render gets a new child. If the worker itself is gone the
  daemon keeps serving and chat requests say so (it cannot be re-forked inside the sandbox;
  restart the service).
"""
import json
import os
import resource
import select
import signal
import socket
import struct
import threading
import time

from ..errors import TemplateError, TemplateRaised
from ..text import chat
from . import sandbox
from .log import log

RENDER_MEMORY = 256 << 20       # address space a render may add to the worker's, bytes
_KILL_SLACK = 0.5               # seconds past the render's own deadline before SIGKILL
_LEN = struct.Struct("<Q")
_MAX_REQUEST = 64 << 20


def _send(sock, obj):
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("render worker closed its socket")
        buf += chunk
    return bytes(buf)


def _recv(sock, limit):
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > limit:
        raise ValueError(f"message of {n} bytes over the limit of {limit}")
    return json.loads(_recv_exact(sock, n).decode("utf-8", "surrogatepass"))


def _vm_size():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class RenderWorker:
    """The daemon's side: start() forks the worker (before the sandbox); render() is what
    edged.text.chat.render calls for every template while the worker runs."""

    def __init__(self, mode="enforce", on_deny="eperm", max_memory=RENDER_MEMORY):
        self.mode, self.on_deny, self.max_memory = mode, on_deny, max_memory
        self.sock = None
        self.pid = None
        self._lock = threading.Lock()

    def start(self):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:                                         # the worker
            code = 0
            try:
                parent.close()
                _Worker(child, self.mode, self.on_deny, self.max_memory).serve()
            except BaseException:  # noqa: BLE001 - a forked process must never return to the caller
                code = 1
            finally:
                os._exit(code)
        child.close()
        parent.set_inheritable(False)
        self.sock, self.pid = parent, pid
        chat.use_renderer(self.render)
        log.info("chat templates render in worker process %d (limits: %d MiB, %g s, %d characters)",
                 pid, self.max_memory >> 20, chat.MAX_SECONDS, chat.MAX_OUTPUT_CHARS)

    def render(self, op, source, **kw):
        """Run `op` ("render" or "compile") for `source` in a fresh bounded child."""
        request = dict(kw, op=op, source=source)
        with self._lock:
            if self.sock is None:
                raise TemplateError("the chat-template render worker is not running (restart the "
                                    "daemon); chat requests cannot be served")
            try:
                self.sock.settimeout(kw.get("max_seconds", chat.MAX_SECONDS) + 30)
                _send(self.sock, request)
                reply = _recv(self.sock, 8 * kw.get("max_chars", chat.MAX_OUTPUT_CHARS) + 65536)
            except (TypeError, ValueError) as e:     # not JSON-serialisable, or a bad reply
                raise TemplateError(f"chat template request cannot go to the render worker: {e}") from None
            except (OSError, EOFError) as e:
                log.error("chat-template render worker %s is gone: %s", self.pid, e)
                self._close()
                raise TemplateError("the chat-template render worker stopped (restart the daemon)") from None
        if "text" in reply:
            return reply["text"]
        raise (TemplateRaised if reply.get("raised") else TemplateError)(reply["error"])

    def _close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        chat.use_renderer(None)

    def close(self):
        with self._lock:
            self._close()
        if self.pid is not None:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.02)
            else:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            self.pid = None


class _Worker:
    """The worker process: reads requests, forks one bounded child per request, relays its
    reply. Never renders anything itself."""

    def __init__(self, sock, mode, on_deny, max_memory):
        self.sock, self.mode, self.on_deny, self.max_memory = sock, mode, on_deny, max_memory

    def serve(self):
        sandbox.die_with_parent()
        signal.set_wakeup_fd(-1)                     # the daemon's event loop is not ours
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)       # stop when the daemon closes the socket
        fd = self.sock.fileno()                      # keep it and stderr; close the rest
        os.closerange(3, fd)
        os.closerange(fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.dup2(os.open(os.devnull, os.O_RDWR), 0)
        os.dup2(2, 1)
        if self.mode != "off":
            sandbox.apply(self.mode, on_deny=self.on_deny, allow_fork=True)
        while True:
            try:
                request = _recv(self.sock, _MAX_REQUEST)
            except EOFError:
                return
            _send(self.sock, self._one(request))

    def _one(self, req):
        max_seconds = float(req.get("max_seconds", chat.MAX_SECONDS))
        max_bytes = 8 * int(req.get("max_chars", chat.MAX_OUTPUT_CHARS)) + 4096
        limit = _vm_size() + self.max_memory        # the child cannot read its own /proc entry
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(req, w, limit, max_seconds, self.mode != "off")
        os.close(w)
        chunks, size, killed = [], 0, None
        deadline = time.monotonic() + max_seconds + _KILL_SLACK
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    killed = "time"
                    break
                if not select.select([r], [], [], left)[0]:
                    continue
                data = os.read(r, 1 << 16)
                if not data:
                    break
                size += len(data)
                if size > max_bytes:
                    killed = "size"
                    break
                chunks.append(data)
        finally:
            os.close(r)
            if killed:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        if killed == "time":
            return {"error": f"chat template took longer than {max_seconds:g} s to render "
                             "(render process killed)"}
        if killed == "size":
            return {"error": f"chat template output exceeds {req.get('max_chars')} characters"}
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            how = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit status {os.WEXITSTATUS(status)}")
            return {"error": f"chat template render process failed ({how}); limits "
                             f"{self.max_memory >> 20} MiB, {max_seconds:g} s"}
        try:
            reply = json.loads(b"".join(chunks).decode("utf-8", "surrogatepass"))
        except ValueError:
            reply = None
        if isinstance(reply, dict) and isinstance(reply.get("text"), str):
            return {"text": reply["text"]}
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            return {"error": reply["error"], "raised": reply.get("raised") is True}
        return {"error": "chat template render process sent a malformed reply"}


def _child(req, w, limit, max_seconds, confine):
    """One render, in a fresh process whose address space cannot grow past `limit` bytes.
    Never returns."""
    code = 0
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(max_seconds) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        if confine:
            sandbox.deny_new_tasks()
        try:
            if req["op"] == "compile":
                chat.compile_template(req["source"])
                out = {"text": ""}
            else:
                out = {"text": chat.render_here(
                    req["source"], req["messages"], add_generation_prompt=req["add_generation_prompt"],
                    tools=req["tools"], max_chars=req["max_chars"], max_seconds=req["max_seconds"],
                    **req["extra"])}
        except TemplateRaised as e:
            out = {"error": str(e), "raised": True}
        except TemplateError as e:
            out = {"error": str(e)}
        except MemoryError:
            out = {"error": f"chat template needed more memory than a render may use ({RENDER_MEMORY >> 20} MiB)"}
        data = json.dumps(out, ensure_ascii=False).encode("utf-8", "surrogatepass")
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except BaseException as e:  # noqa: BLE001 - whatever happened, this process ends here
        code = 3
        try:
            os.write(2, f"edged: chat-template render process: {type(e).__name__}: {e}\n".encode())
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)
