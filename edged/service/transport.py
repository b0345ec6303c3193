"""The Unix socket and HTTP framing (aiohttp): get the listening socket, accept connections
within the caps, read each request into an ApiRequest with the peer's credentials
(SO_PEERCRED, SO_PEERGROUPS), write the Reply or stream the StreamReply, log one line per
request.

The accept loop is ours (`Listener`), not asyncio's: the peer's uid is known right after
accept(2), so a connection over `max_connections` or `max_connections_per_uid` is closed
before it costs more than a descriptor for a moment; descriptor exhaustion (EMFILE/ENFILE)
backs off instead of spinning; and every connection has a deadline (a complete request
header within `header_timeout`, the next one within `keepalive_timeout`, a body within
`body_timeout`), so slow or stalled clients cannot hold descriptors. Refusals are counted in
/metrics and logged once per `LOG_INTERVAL`, never once per attempt.

TCP (opt-in, issue #14): sockets systemd passes (edged-tcp.socket) or the daemon binds
itself before its sandbox (config key `listen`, `edged serve --listen`) go through the same
Listener and deadlines; each request needs an API key (apikeys.py) and may not use the admin
routes. There is no peer uid: until a request on it carries a valid key, a TCP connection is
held in a small pool of its own (`PREAUTH_MAX`; when full, the oldest idle one is closed for
the newcomer) and counts against no other cap, so unauthenticated peers cannot crowd out keyed
clients or Unix peers. From its first authenticated request it counts against
`max_connections` and, by remote address, `max_connections_per_uid`. A refused key closes the
connection and is logged in a summary line per `LOG_INTERVAL`, never once per request.
"""
import asyncio
import collections
import errno
import json
import grp
import os
import resource
import socket
import stat
import struct
import time
import zlib

from aiohttp import hdrs, web

from ..errors import ConfigError
from . import apikeys, systemd
from .config import split_host_port
from .wire import ApiRequest, Peer, Reply, error_reply
from .log import log

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)


def peer_credentials(sock):
    """(pid, uid, gid, supplementary groups) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    groups = ()
    try:
        buf = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 256)
        groups = struct.unpack(f"{len(buf) // 4}I", buf)
    except OSError:
        pass
    return Peer(pid, uid, gid, tuple(groups))


def open_socket(cfg):
    """The listening sockets: the Unix socket from systemd (LISTEN_FDS) or bound at cfg.socket,
    and the TCP sockets: those systemd passed (edged-tcp.socket) and those bound at cfg.listen
    (`edged serve --listen`, before the sandbox forbids it). Returns (unix socket, how, [tcp sockets])."""
    unix, tcp = None, [bind_tcp(addr) for addr in cfg.listen]
    for s in systemd.listen_fds():
        if s.type == socket.SOCK_STREAM and (s.family == socket.AF_UNIX and unix is None
                                             or s.family in (socket.AF_INET, socket.AF_INET6)):
            s.setblocking(False)
            if s.family == socket.AF_UNIX:
                unix = s
            else:
                tcp.append(s)
        else:
            s.close()
    if unix is not None:
        return unix, "systemd", tcp
    return bind_socket(cfg.socket, cfg.socket_mode, cfg.socket_group), "bound", tcp


def bind_tcp(addr):
    """A listening TCP socket at `addr` ("HOST:PORT" from the config key 'listen')."""
    host, port = split_host_port(addr)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ConfigError(f"config key 'listen': {addr!r}: {e.strerror}") from None
    sock = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # a restart within TIME_WAIT
        sock.bind(sockaddr)
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        raise ConfigError(f"config key 'listen': cannot listen on {addr}: {e.strerror}") from None
    sock.setblocking(False)
    return sock


def bind_socket(path, mode, group):
    """Bind at `path`: replace a stale socket file, refuse if another daemon answers there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"config key 'socket': {path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise ConfigError(f"config key 'socket': cannot probe existing socket {path}: {e}") from None
            log.info("replacing stale socket %s", path)
            os.unlink(path)
        else:
            raise ConfigError(f"config key 'socket': another process is already listening on {path}; "
                              "stop it first (or choose another socket path)")
        finally:
            probe.close()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o777)      # no window in which the socket is more open than `mode`
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ConfigError(f"config key 'socket': cannot bind {path}: {e.strerror}") from None
    finally:
        os.umask(old)
    gid = -1
    if group != "":
        try:
            gid = int(group) if str(group).isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            log.warning("socket group %r does not exist; socket %s keeps group %d", group, path, os.getgid())
    try:
        if gid != -1:
            os.chown(path, -1, gid)
        os.chmod(path, mode)
    except OSError as e:
        sock.close()
        os.unlink(path)
        raise ConfigError(f"config key 'socket_group'/'socket_mode': cannot set on {path}: {e.strerror}") from None
    # the kernel's cap (net.core.somaxconn), as systemd's socket units default to: a burst of
    # clients larger than a small backlog (the connection caps close them right after accept)
    # would make a non-blocking connect(2) fail with EAGAIN before the loop has drained it
    sock.listen(socket.SOMAXCONN)
    sock.setblocking(False)
    return sock


def make_app(daemon):
    """The aiohttp application: one catch-all route that hands everything to daemon.api."""
    api = daemon.api

    async def handle(request):
        listener = daemon.listener
        conn = listener.lookup(request.transport) if listener is not None else None
        if conn is None:
            return await serve(request, None, None)
        listener.request_started(conn)
        try:
            return await serve(request, conn.peer, conn)
        finally:
            listener.request_done(conn)

    async def serve(request, peer, conn):
        t0 = time.monotonic()
        route = request.path if (request.method, request.path) in api.routes else "other"
        sock = request.transport.get_extra_info("socket") if request.transport else None
        key = None          # over TCP: apikeys.key_id of the key the request carries
        if sock is not None and sock.family != socket.AF_UNIX:
            # TCP (opt-in): an API key instead of credentials
            key = apikeys.key_id(request.headers.get("Authorization"), daemon.api_keys or (),
                                 request.headers.get("x-api-key"))
            refusal = _tcp_refusal(request, api, key)
            listener = daemon.listener
            if refusal is None and conn is not None and not listener.authenticated(conn):
                refusal = error_reply(503, "too many connections (max_connections, max_connections_per_uid)",
                                      "server_error", "too_many_connections", {"Retry-After": "1"})
            if refusal is not None:
                refusal = api.shaped(request.path, refusal)
                resp = web.Response(status=refusal.status, body=refusal.payload(), headers=refusal.headers,
                                    content_type="application/json")
                if refusal.status == 403:       # a keyed client asking for an admin route
                    return _finish(daemon, request, route, None, refusal, {}, t0, resp)
                resp.force_close()              # its place goes to the next client
                daemon.metrics.request(route, refusal.status)
                if refusal.status == 401 and listener is not None:     # one line per LOG_INTERVAL
                    listener.auth_refusals.note(f"from {request.remote}")
                return resp
        elif peer is None and sock is not None:
            try:
                peer = peer_credentials(sock)
            except OSError:
                peer = None
        limit, timeout = daemon.cfg.max_body_bytes, daemon.cfg.body_timeout
        try:
            if request.content_length is not None and request.content_length > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
            body = await asyncio.wait_for(request.read(), timeout)
            encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
            if encoding != "identity":
                body = await asyncio.get_running_loop().run_in_executor(None, inflate, body, encoding, limit)
        except web.HTTPRequestEntityTooLarge:
            reply = api.shaped(request.path, error_reply(413, f"request body exceeds max_body_bytes={limit}",
                                                         code="body_too_large"))
            return _finish(daemon, request, route, peer, reply, {}, t0, web.Response(
                status=413, body=reply.payload(), content_type="application/json"))
        except BodyError as e:
            reply = api.shaped(request.path, error_reply(e.status, str(e), code="bad_content_encoding"))
            return _finish(daemon, request, route, peer, reply, {}, t0, web.Response(
                status=e.status, body=reply.payload(), content_type="application/json"))
        except asyncio.TimeoutError:
            reply = api.shaped(request.path, error_reply(
                408, f"request body not received within body_timeout={timeout:g}s", code="body_timeout"))
            resp = web.Response(status=408, body=reply.payload(), content_type="application/json",
                                headers={"Connection": "close"})
            resp.force_close()
            return _finish(daemon, request, route, peer, reply, {}, t0, resp)

        def gone():
            t = request.transport
            return t is None or t.is_closing()

        areq = ApiRequest(request.method, request.path, body, peer, gone,
                          tcp=sock is not None and sock.family != socket.AF_UNIX, api_key=key,
                          query=dict(request.query))
        reply = await api.handle(areq)
        if isinstance(reply, Reply):
            ct, _, charset = reply.content_type.partition("; ")
            resp = web.Response(status=reply.status, body=reply.payload(), headers=reply.headers)
            resp.content_type = ct
            if charset:
                resp.headers["Content-Type"] = reply.content_type
            return _finish(daemon, request, route, peer, reply, areq.info, t0, resp)
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        resp.content_type = reply.content_type
        try:
            await resp.prepare(request)
            async for chunk in reply.chunks():
                await resp.write(chunk)
                if gone():
                    break
            await resp.write_eof()
        except (ConnectionError, OSError) as e:
            areq.info["error"] = f"client gone: {type(e).__name__}"
        finally:
            await reply.close()
            _finish(daemon, request, route, peer, reply, areq.info, t0, resp)
        return resp

    app = web.Application(client_max_size=daemon.cfg.max_body_bytes + 1)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


class BodyError(ValueError):
    """A compressed request body that cannot be read: `status` 400 (corrupt) or 415 (encoding)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# Content-Encoding -> zlib's wbits. aiohttp's own inflating is off (daemon.py: auto_decompress):
# it ran on the event loop and before any size limit.
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def inflate(data, encoding, limit):
    """The body of a request sent with Content-Encoding `encoding`, inflated to at most `limit`
    bytes (the work stops there: HTTPRequestEntityTooLarge). Run off the event loop."""
    wbits = _ENCODINGS.get(encoding)
    if wbits is None:
        raise BodyError(415, f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise BodyError(400, f"request body is not valid {encoding} data: {e}") from None
    if len(out) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(out))
    if not d.eof or d.unused_data:
        raise BodyError(400, f"request body is not one complete {encoding} stream")
    return out


def _tcp_refusal(request, api, key):
    """A 401 for a TCP request without a valid API key (`key`: its apikeys.key_id), 403 for an
    admin route (those need a Unix peer's credentials); None when the request may go on."""
    if key is None:
        return error_reply(401, "a request over TCP needs 'Authorization: Bearer KEY' (or 'x-api-key: KEY') "
                           "with a key from api_keys_file", "authentication_error", "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})
    if request.path in api.ADMIN:
        return error_reply(403, f"{request.path} is not available over TCP", "permission_error", "forbidden")
    return None


def _finish(daemon, request, route, peer, reply, info, t0, resp):
    daemon.metrics.request(route, reply.status)
    ms = (time.monotonic() - t0) * 1e3
    parts = [f"{request.method} {request.path} {reply.status}"]
    for k in ("model", "prompt_tokens", "cached_tokens", "prompt_eval", "completion_tokens", "finish",
              "drafted", "accepted"):
        if k in info:
            parts.append(f"{k}={info[k]}")
    for k in ("queue_ms", "ttft_ms", "gen_ms"):
        if k in info:
            parts.append(f"{k}={info[k]:.1f}")
    parts.append(f"total_ms={ms:.1f}")
    if peer is not None:
        parts.append(f"uid={peer.uid} pid={peer.pid}")
    if "error" in info:
        parts.append(f"error={info['error']!r}")
    if reply.status >= 400 and isinstance(reply, Reply) and isinstance(reply.body, dict):
        err = reply.body.get("error", {})     # OpenAI's {"message": ...}; Ollama's a string
        parts.append(f"reason={err.get('message', '') if isinstance(err, dict) else err!r}")
    for k in ("prompt", "reply"):
        if k in info:
            parts.append(f"{k}={json.dumps(info[k], ensure_ascii=False)}")
    log.info(" ".join(parts))
    return resp


# --- accepting connections ------------------------------------------------------------------

LOG_INTERVAL = 10.0            # seconds between summary lines about refused connections
PREAUTH_MAX = 32               # TCP connections held before their first request with a valid key
SWEEP_INTERVAL = 0.25          # how often deadlines are checked
FD_RESERVE = 64                # descriptors kept for models, logs, the event loop, ...
_BACKOFF_MIN, _BACKOFF_MAX = 0.01, 1.0
_OVER_CAP_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                   b"Retry-After: 1\r\nConnection: close\r\n\r\n")


class RateLimitedLog:
    """Counts events by description and logs one summary line per `interval` seconds
    ("refused N <what> since the last report: ...")."""

    def __init__(self, interval=LOG_INTERVAL, clock=time.monotonic, what="connection(s)"):
        self.interval, self.clock, self.what = interval, clock, what
        self.pending = collections.Counter()
        self.last = -interval

    def note(self, what):
        self.pending[what] += 1
        self.flush()

    def flush(self, force=False):
        now = self.clock()
        if self.pending and (force or now - self.last >= self.interval):
            total = sum(self.pending.values())
            parts = ", ".join(f"{n} {what}" for what, n in self.pending.most_common(5))
            log.warning("refused %d %s since the last report: %s", total, self.what, parts)
            self.pending.clear()
            self.last = now


class Conn:
    """One accepted connection: who, and until when it may stay without a request in progress.
    `who` is what the per-client cap counts: the peer's uid over the Unix socket, the remote
    address over TCP (whose peer is None: an API key, checked per request, says who it is).
    `authed`: counted against the caps (a Unix peer at once, a TCP one from its first request
    with a valid key; before that it is in the pre-auth pool)."""
    __slots__ = ("sock", "peer", "who", "deadline", "busy", "transport", "authed", "evicted")

    def __init__(self, sock, peer, deadline, who=None):
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.who = peer.uid if who is None else who
        self.busy = 0              # requests being handled (their own timeouts apply)
        self.transport = None
        self.authed = peer is not None
        self.evicted = False       # closed for a newer one in the pre-auth pool


class Listener:
    """The accept loop over the listening sockets (the Unix socket, and the TCP sockets systemd
    passed), with the connection caps and deadlines: one count of connections for all of them."""

    def __init__(self, daemon, sock, factory, tcp=()):
        self.daemon, self.sock, self.factory = daemon, sock, factory
        self.tcp = list(tcp)
        self.socks = [sock] + self.tcp
        self.conns = {}                                 # fd -> Conn
        self.per_uid = collections.Counter()            # Conn.who -> authenticated connections
        self.preauth = {}                               # fd -> Conn not authenticated yet, oldest first
        self.refusals = RateLimitedLog()
        self.auth_refusals = RateLimitedLog(what="TCP request(s) without a valid API key")
        self.backoff = _BACKOFF_MIN
        self.loop = self._sweeper = None
        self.paused = False

    @property
    def cfg(self):
        return self.daemon.cfg

    def start(self):
        self.loop = asyncio.get_running_loop()
        self._watch()
        self._sweeper = self.loop.create_task(self._sweep())

    def stop(self):
        if not self.paused:
            self._unwatch()
        self.paused = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.refusals.flush(force=True)
        self.auth_refusals.flush(force=True)

    def lookup(self, transport):
        """The Conn of an aiohttp request's transport (None for one this listener did not accept)."""
        s = transport.get_extra_info("socket") if transport is not None else None
        conn = self.conns.get(s.fileno()) if s is not None else None
        if conn is not None and conn.transport is None:
            conn.transport = transport
        return conn

    def _watch(self):
        for ls in self.socks:
            self.loop.add_reader(ls.fileno(), self._accept, ls)

    def _unwatch(self):
        for ls in self.socks:
            self.loop.remove_reader(ls.fileno())

    def _accept(self, listening):
        for _ in range(128):                            # bounded work per wake-up
            try:
                sock, addr = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._back_off(e)
                    return
                if e.errno == errno.ECONNABORTED:
                    continue
                self.refusals.note(f"accept error {errno.errorcode.get(e.errno, e.errno)}")
                return
            self.backoff = _BACKOFF_MIN
            self._admit(sock, addr if listening is not self.sock else None)

    def _back_off(self, e):
        """Out of descriptors: stop accepting for a while (doubling up to a second) rather than
        waking up for the same pending connection again and again."""
        self.daemon.metrics.connections_refused["accept_" + errno.errorcode.get(e.errno, "error")] += 1
        self.refusals.note(f"accept paused {self.backoff:g}s: {e.strerror}")
        self._unwatch()
        self.paused = True
        self.loop.call_later(self.backoff, self._resume)
        self.backoff = min(self.backoff * 2, _BACKOFF_MAX)

    def _resume(self):
        if self.paused and not self.daemon.stopping:
            self.paused = False
            self._watch()

    def _admit(self, sock, addr=None):
        """addr: the remote address of a TCP connection (None: the Unix socket)."""
        if addr is None:
            try:
                peer = peer_credentials(sock)
            except OSError:
                sock.close()
                return
            who = peer.uid
        else:
            peer, who = None, f"tcp:{addr[0]}"
        self._prune()
        if peer is None:
            self._preadmit(sock, who)
            return
        if self._over_cap(who, f"from uid {who}", peer.uid in self.cfg.uids("admin_uids")):
            try:
                sock.send(_OVER_CAP_REPLY, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except OSError:
                pass
            sock.close()
            return
        self.per_uid[who] += 1
        self._open(sock, peer, who)

    def _over_cap(self, who, where, admin=False):
        """Whether one more connection of `who` would be over max_connections (which counts
        Unix peers and authenticated TCP ones) or, unless `admin`, max_connections_per_uid;
        if so it is counted and noted."""
        cfg = self.cfg
        if sum(self.per_uid.values()) >= cfg.max_connections:
            reason, what = "max_connections", f"over max_connections={cfg.max_connections}"
        elif self.per_uid[who] >= cfg.max_connections_per_uid and not admin:
            reason = "max_connections_per_uid"
            what = f"{where} over max_connections_per_uid={cfg.max_connections_per_uid}"
        else:
            return False
        self.daemon.metrics.connections_refused[reason] += 1
        self.refusals.note(what)
        return True

    def _open(self, sock, peer, who):
        sock.setblocking(False)
        conn = Conn(sock, peer, time.monotonic() + self.cfg.header_timeout, who)
        self.conns[sock.fileno()] = conn
        self.loop.create_task(self._connect(conn))
        return conn

    def _preadmit(self, sock, who):
        """A TCP connection into the pre-auth pool; a full pool closes its oldest connection
        that is idle: no request in progress, none waiting to be read (a client that sent its
        request at once, accepted in the same burst, is not cut off). None idle: the newcomer
        is refused."""
        if len(self.preauth) >= PREAUTH_MAX:
            old = next((c for c in self.preauth.values() if not c.busy and not _unread(c.sock)), None)
            if old is None:
                sock.close()
                self.daemon.metrics.connections_refused["preauth_full"] += 1
                self.refusals.note(f"unauthenticated TCP connection(s): all {PREAUTH_MAX} pre-auth places busy")
                return
            del self.preauth[old.sock.fileno()]
            old.evicted = True          # closed by its transport (or _connect): never here, as
            if old.transport is not None:   # asyncio may still hold the descriptor
                old.transport.abort()
            self.daemon.metrics.connections_refused["preauth_replaced"] += 1
            self.refusals.note(f"unauthenticated TCP connection(s) closed for newer ones (pool of {PREAUTH_MAX})")
        conn = self._open(sock, None, who)
        self.preauth[sock.fileno()] = conn

    def authenticated(self, conn):
        """A request on TCP connection `conn` carried a valid key: from now on the connection
        counts against max_connections and its address's max_connections_per_uid. False when
        that is over a cap (the request is refused with 503, the connection closed)."""
        if conn.authed:
            return True
        if self._over_cap(conn.who, f"from {conn.who.removeprefix('tcp:')}"):
            return False
        self.preauth.pop(conn.sock.fileno(), None)
        conn.authed = True
        self.per_uid[conn.who] += 1
        return True

    async def _connect(self, conn):
        if conn.evicted:                # replaced in the pre-auth pool before it was set up
            conn.sock.close()
            return
        try:
            conn.transport, _ = await self.loop.connect_accepted_socket(self.factory, conn.sock)
        except OSError:
            conn.sock.close()
            return
        if conn.evicted:
            conn.transport.abort()

    def _prune(self):
        """Forget connections whose socket the transport has closed."""
        for fd, conn in list(self.conns.items()):
            if conn.sock.fileno() == -1:
                del self.conns[fd]
                if not conn.authed:
                    if self.preauth.get(fd) is conn:
                        del self.preauth[fd]
                    continue
                self.per_uid[conn.who] -= 1
                if not self.per_uid[conn.who]:
                    del self.per_uid[conn.who]

    async def _sweep(self):
        """Close connections past their deadline that have no request in progress: a stalled or
        trickling request header, an idle keep-alive connection."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            now = time.monotonic()
            for conn in list(self.conns.values()):
                if not conn.busy and now > conn.deadline and conn.transport is not None:
                    conn.transport.abort()
            self._prune()
            self.daemon.metrics.connections_open = len(self.conns)
            self.refusals.flush()
            self.auth_refusals.flush()

    def request_started(self, conn):
        conn.busy += 1

    def request_done(self, conn):
        conn.busy -= 1
        conn.deadline = time.monotonic() + self.cfg.keepalive_timeout


def _unread(sock):
    """Whether bytes from the peer wait to be read on `sock`."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:             # nothing yet (EAGAIN), or a connection already broken
        return False


def fit_descriptor_limit(cfg):
    """Raise the soft RLIMIT_NOFILE to the hard one, and refuse a max_connections that would
    not leave FD_RESERVE descriptors for the rest of the daemon."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and cfg.max_connections + FD_RESERVE > soft:
        raise ConfigError(f"config key 'max_connections': {cfg.max_connections} connections and "
                          f"{FD_RESERVE} descriptors for the daemon exceed the open-file limit of {soft} "
                          f"(raise LimitNOFILE= in the unit, or lower max_connections to "
                          f"{max(soft - FD_RESERVE, 1)})")
    return soft
