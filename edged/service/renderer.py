"""Chat templates rendered in a bounded process, so that a hostile template costs at most the
stated limits however it is written.

A template is untrusted code. edged/text/chat.py renders it in jinja2's sandbox and checks the
arguments of every filter, global and method that could make a large string or run long; what
no such check can see (a string doubled in a loop, a huge integer, a filter nobody thought of)
is bounded here, by the operating system:

- At start-up, before the daemon confines itself (its seccomp policy then forbids new
  processes), it forks a zygote. The zygote closes every descriptor but its control socket
  and stderr, dies with the daemon (PR_SET_PDEATHSIG), and applies the daemon's sandbox with
  one difference: it may fork, never exec (edged/service/sandbox.py `allow_fork`). It reads
  nothing from requests: asked for a render worker (one byte), it forks one (killing the
  previous one, if any) and passes the daemon its end of a new socketpair (SCM_RIGHTS).
- The render worker runs no template and parses no request either: for each render it reads
  a small header (operation and limits, written by the daemon) and the request's bytes, and
  forks a fresh child. The child limits its own address space to what it has plus
  `RENDER_MEMORY` (RLIMIT_AS: an allocation past it fails with MemoryError), its CPU time
  (RLIMIT_CPU), forbids itself new processes and threads (seccomp), decodes the request,
  renders, and writes the result as JSON to a pipe. The worker kills it at the time limit,
  refuses more output than the size limit allows, and answers anything that goes wrong with an
  error reply: no request ends the worker.
- The daemon talks to the worker over the socketpair, JSON both ways (never pickle: a child
  that escaped the jinja2 sandbox must not be able to send code). A child that crashes or is
  killed costs one failed render; the next render gets a new child. A worker found gone (killed
  from outside) is replaced from the zygote, and a render it dropped is sent once more to the
  new one; one that fails again, or a worker stuck past the time limit, answers 503. Templates
  never render in the daemon's own process: without a worker (the zygote gone too) chat
  requests answer 503 saying so.
"""
import base64
import json
import os
import resource
import select
import signal
import socket
import struct
import threading
import time

from ..errors import NotReady, RequestError, TemplateError, TemplateRaised
from ..text import chat
from . import images, sandbox
from .log import log

RENDER_MEMORY = 256 << 20       # address space a render may add to the worker's, bytes
_KILL_SLACK = 0.5               # seconds past the render's own deadline before SIGKILL
_LEN = struct.Struct("<Q")
_MAX_HEADER = 4096
_MAX_REQUEST = 64 << 20
_SPAWN_TIMEOUT = 10.0           # seconds the zygote may take to hand over a new worker
_WORKER_GROWTH = 16 << 20       # what a worker may have added to the zygote's address space


def _send(sock, *frames):
    """Length-prefixed frames of bytes."""
    sock.sendall(b"".join(_LEN.pack(len(f)) + f for f in frames))


def _encode(obj):
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _decode(data):
    return json.loads(data.decode("utf-8", "surrogatepass"))


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("render worker closed its socket")
        buf += chunk
    return bytes(buf)


def _recv(sock, limit):
    """One frame; one over `limit` bytes is read past (the stream stays in step) and refused."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > limit:
        while n:
            n -= len(_recv_exact(sock, min(n, 1 << 20)))
        raise ValueError(f"message over the limit of {limit} bytes")
    return _recv_exact(sock, n)


def _vm_size():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class RenderWorker:
    """The daemon's side: start() forks the zygote (before the sandbox) and takes a worker from
    it; render() is what edged.text.chat.render calls for every template. `pid` is the current
    worker's, `zygote` the zygote's."""

    def __init__(self, mode="enforce", on_deny="eperm", max_memory=RENDER_MEMORY):
        self.mode, self.on_deny, self.max_memory = mode, on_deny, max_memory
        self.ctl = self.sock = None
        self.zygote = self.pid = None
        self._lock = threading.Lock()

    def start(self):
        images.preload()                # the children cannot import Pillow's plugins later
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:                                         # the zygote
            code = 0
            try:
                parent.close()
                _Zygote(child, self.mode, self.on_deny, self.max_memory).serve()
            except BaseException:  # noqa: BLE001 - a forked process must never return to the caller
                code = 1
            finally:
                os._exit(code)
        child.close()
        parent.set_inheritable(False)
        self.ctl, self.zygote = parent, pid
        chat.use_renderer(self.render)
        images.use_decoder(self.decode_image)
        try:
            self._spawn()
        except NotReady:                # logged; chat requests say so, the rest is served
            return
        log.info("chat templates render in children of worker process %d (zygote %d; limits: %d MiB, "
                 "%g s, %d characters)", self.pid, pid, self.max_memory >> 20, chat.MAX_SECONDS,
                 chat.MAX_OUTPUT_CHARS)

    def _spawn(self):
        """A new worker from the zygote: its socket comes back over the control socket.
        Raises NotReady when there is none (the zygote gone: for good)."""
        try:
            self.ctl.settimeout(_SPAWN_TIMEOUT)
            self.ctl.sendall(b"w")
            msg, fds, _, _ = socket.recv_fds(self.ctl, 256, 1, socket.MSG_CMSG_CLOEXEC)
        except OSError as e:
            msg, fds = b"", []
            log.error("chat-template render zygote %s: %s", self.zygote, e)
        if len(fds) == 1:
            self.sock, self.pid = socket.socket(fileno=fds[0]), int(msg)
            return
        for fd in fds:
            os.close(fd)
        if msg:                             # the zygote could not fork this time
            log.error("chat-template render zygote %s: %s", self.zygote, msg.decode(errors="replace"))
            raise NotReady(f"chat templates cannot be rendered now: {msg.decode(errors='replace')}")
        log.error("chat-template render zygote %s is gone: chat requests answer 503 until the "
                  "daemon restarts", self.zygote)
        self.ctl.close()
        self.ctl = None
        raise NotReady("chat templates cannot be rendered: the render worker cannot be restarted "
                       "(restart the daemon)")

    def _worker(self):
        """The socket of a live worker, replacing a dead one. The worker never writes unasked,
        so a socket readable between renders means it closed (the worker is gone)."""
        if self.sock is not None and select.select([self.sock], [], [], 0)[0]:
            log.error("chat-template render worker %s is gone; starting a new one", self.pid)
            self._drop()
        if self.sock is None:
            if self.ctl is None:
                raise NotReady("chat templates cannot be rendered: no render worker (restart the daemon)")
            self._spawn()
            log.info("chat-template render worker %d started", self.pid)
        return self.sock

    def render(self, op, source, **kw):
        """Run `op` ("render" or "compile") for `source` in a fresh bounded child."""
        max_seconds = kw.get("max_seconds", chat.MAX_SECONDS)
        max_chars = kw.get("max_chars", chat.MAX_OUTPUT_CHARS)
        try:
            payload = _encode(dict(kw, op=op, source=source))
        except RecursionError:
            raise RequestError("the conversation is nested too deeply to render") from None
        except (TypeError, ValueError) as e:                 # not JSON-serialisable
            raise TemplateError(f"chat template request cannot go to the render worker: {e}") from None
        reply = self._call({"op": op, "max_seconds": max_seconds, "max_chars": max_chars}, payload,
                           8 * max_chars + 65536)
        if isinstance(reply.get("text"), str):
            return reply["text"]
        error = TemplateRaised if reply.get("raised") is True else \
            RequestError if reply.get("request") is True else TemplateError
        raise error(str(reply.get("error")))

    def decode_image(self, data, max_pixels):
        """(height, width, RGB bytes) of encoded image `data` (images.decode_here), decoded in
        a fresh bounded child; RequestError when it is not an image it may decode."""
        max_bytes = (max_pixels * 3 + 2) // 3 * 4 + 4096            # the RGB, base64, in JSON
        reply = self._call({"op": "image", "max_seconds": images.DECODE_SECONDS, "max_bytes": max_bytes},
                           _encode({"op": "image", "data": base64.b64encode(data).decode(),
                                    "max_pixels": max_pixels}), max_bytes + 65536)
        shape = reply.get("shape")
        if isinstance(reply.get("text"), str) and isinstance(shape, list) and len(shape) == 2:
            return int(shape[0]), int(shape[1]), base64.b64decode(reply["text"])
        raise RequestError(str(reply.get("error") or "the image decoder sent a malformed reply"))

    def _call(self, header, payload, max_reply):
        """One request to the worker: its reply (a dict), from a fresh bounded child."""
        header = _encode(header)
        max_seconds = json.loads(header)["max_seconds"]
        with self._lock:
            for attempt in (1, 2):
                sock = self._worker()
                try:
                    sock.settimeout(max_seconds + 30)
                    _send(sock, header, payload)
                    reply = _decode(_recv(sock, max_reply))
                    break
                except (EOFError, ConnectionError) as e:
                    # closed before it answered: killed from outside, maybe just before this
                    # render was sent; one more try with a new worker
                    log.error("chat-template render worker %s is gone (%s); starting a new one", self.pid, e)
                    self._drop()
                    if attempt == 2:
                        raise NotReady("the chat-template render worker stopped during this request "
                                       "(a new one serves the next)") from None
                except (OSError, ValueError) as e:      # stuck past the time limit, or a bad reply
                    log.error("chat-template render worker %s failed: %s; it is replaced", self.pid, e)
                    self._drop()
                    raise NotReady("the chat-template render worker failed during this request "
                                   "(a new one serves the next)") from None
        if not isinstance(reply, dict):
            raise TemplateError("the chat-template render worker sent a malformed reply")
        return reply

    def _drop(self):
        """Forget the current worker (the zygote kills it, if alive, when it starts the next)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self):
        """Stop: the zygote ends when its socket closes, the worker dies with it."""
        with self._lock:
            self._drop()
            if self.ctl is not None:
                self.ctl.close()
                self.ctl = None
            chat.use_renderer(None)
            images.use_decoder(None)
        if self.zygote is not None:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                pid, _ = os.waitpid(self.zygote, os.WNOHANG)
                if pid:
                    break
                time.sleep(0.02)
            else:
                os.kill(self.zygote, signal.SIGKILL)
                os.waitpid(self.zygote, 0)
            self.zygote = self.pid = None


def _confine_to(fd, mode, on_deny):
    """The start of the zygote: die with the daemon, ignore the daemon's signals, keep only
    `fd` and stderr, apply the sandbox (forks allowed)."""
    sandbox.die_with_parent()
    signal.set_wakeup_fd(-1)                     # the daemon's event loop is not ours
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)       # stop when the daemon closes the socket
    os.closerange(3, fd)
    os.closerange(fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.dup2(os.open(os.devnull, os.O_RDWR), 0)
    os.dup2(2, 1)
    if mode != "off":
        sandbox.apply(mode, on_deny=on_deny, allow_fork=True)


class _Zygote:
    """Forks render workers on request, one at a time; reads one byte per request and nothing
    else, so no request can end it."""

    def __init__(self, ctl, mode, on_deny, max_memory):
        self.ctl, self.mode, self.on_deny, self.max_memory = ctl, mode, on_deny, max_memory

    def serve(self):
        _confine_to(self.ctl.fileno(), self.mode, self.on_deny)
        current = None                                      # pid of the current worker
        while self.ctl.recv(1):
            if current is not None:     # replaced (a stuck one too). Reaped only here, so the
                os.kill(current, signal.SIGKILL)            # pid is still this worker's
                os.waitpid(current, 0)
                current = None
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                base = _vm_size()           # the worker's address space when it starts
                pid = os.fork()
            except OSError as e:            # out of processes or memory: say so, stay
                mine.close()
                theirs.close()
                self.ctl.sendall(f"no render worker: {e}".encode()[:200])
                continue
            if pid == 0:                                    # the worker
                code = 0
                try:
                    self.ctl.close()
                    theirs.close()
                    sandbox.die_with_parent()
                    _Worker(mine, self.mode != "off", self.max_memory, base).serve()
                except BaseException:  # noqa: BLE001 - a forked process must never return
                    code = 1
                finally:
                    os._exit(code)
            mine.close()
            current = pid
            socket.send_fds(self.ctl, [str(pid).encode()], [theirs.fileno()])
            theirs.close()


class _Worker:
    """The worker process: reads requests, forks one bounded child per request, relays its
    reply. Never renders anything itself, never parses the request's payload, never ends
    because of a request."""

    def __init__(self, sock, confine, max_memory, base):
        self.sock, self.confine, self.max_memory, self.base = sock, confine, max_memory, base

    def _limit(self, payload):
        """The address space a render child may reach: the worker's plus max_memory. Forked
        after the sandbox, a worker may not read its own /proc entry: then its size is taken
        as the zygote's at the fork, plus _WORKER_GROWTH, plus the request in memory."""
        try:
            return _vm_size() + self.max_memory
        except OSError:
            return self.base + _WORKER_GROWTH + len(payload) + self.max_memory

    def serve(self):
        while True:
            frames = []
            for limit in (_MAX_HEADER, _MAX_REQUEST):    # the header, the request's bytes
                try:
                    frames.append(_recv(self.sock, limit))
                except EOFError:
                    return
                except ValueError as e:
                    frames.append(e)
            try:
                for f in frames:
                    if isinstance(f, ValueError):
                        raise f
                reply = self._one(_decode(frames[0]), frames[1])
            except Exception as e:  # noqa: BLE001 - one request's failure is its own answer
                reply = {"error": f"chat template render failed in the render worker: "
                                  f"{type(e).__name__}: {e}"}
            _send(self.sock, _encode(reply))

    def _one(self, req, payload):
        max_seconds = float(req.get("max_seconds", chat.MAX_SECONDS))
        max_chars = int(req.get("max_chars", chat.MAX_OUTPUT_CHARS))
        max_bytes = int(req.get("max_bytes", 8 * max_chars + 4096))
        what = "image decoding" if req.get("op") == "image" else "chat template"
        limit = self._limit(payload)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(payload, w, limit, max_seconds, self.confine)
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
            return {"error": f"{what} took longer than {max_seconds:g} s (render process killed)"}
        if killed == "size":
            return {"error": f"{what} output exceeds {max_bytes} bytes"}
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            how = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit status {os.WEXITSTATUS(status)}")
            return {"error": f"{what} process failed ({how}); limits "
                             f"{self.max_memory >> 20} MiB, {max_seconds:g} s"}
        try:
            reply = _decode(b"".join(chunks))
        except (ValueError, RecursionError):
            reply = None
        if isinstance(reply, dict) and isinstance(reply.get("text"), str):
            return {"text": reply["text"], "shape": reply.get("shape")}
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            return {"error": reply["error"], "raised": reply.get("raised") is True,
                    "request": reply.get("request") is True}
        return {"error": "chat template render process sent a malformed reply"}


def _child(payload, w, limit, max_seconds, confine):
    """One render, in a fresh process whose address space cannot grow past `limit` bytes.
    Never returns."""
    code = 0
    try:
        sandbox.die_with_parent()
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(max_seconds) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        if confine:
            sandbox.deny_new_tasks()
        req = {}
        try:
            try:
                req = _decode(payload)
            except RecursionError:
                raise RequestError("the conversation is nested too deeply to render") from None
            if req["op"] == "image":
                height, width, rgb = images.decode_here(base64.b64decode(req["data"]), req["max_pixels"])
                out = {"text": base64.b64encode(rgb).decode(), "shape": [height, width]}
            elif req["op"] == "compile":
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
        except RequestError as e:
            out = {"error": str(e), "request": True}
        except MemoryError:
            what = "image decoding" if req.get("op") == "image" else "chat template"
            out = {"error": f"{what} needed more memory than a render may use ({RENDER_MEMORY >> 20} MiB)"}
        except RecursionError:
            out = {"error": "chat template or conversation nested too deeply to render"}
        data = _encode(out)
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
