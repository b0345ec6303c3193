"""The Unix socket and HTTP framing (aiohttp): get the listening socket, read each request into
an ApiRequest with the peer's credentials (SO_PEERCRED, SO_PEERGROUPS), write the Reply or
stream the StreamReply, log one line per request."""
import errno
import json
import grp
import os
import socket
import stat
import struct
import time

from aiohttp import web

from ..errors import ConfigError
from . import apikeys, systemd
from .api import ApiRequest, Peer, Reply, error_reply
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
    and the TCP sockets systemd passed (edged-tcp.socket; never opened by the daemon itself).
    Returns (unix socket, how, [tcp sockets])."""
    unix, tcp = None, []
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
    sock.listen(128)
    sock.setblocking(False)
    return sock


def make_app(daemon):
    """The aiohttp application: one catch-all route that hands everything to daemon.api."""
    api = daemon.api

    async def handle(request):
        t0 = time.monotonic()
        route = request.path if (request.method, request.path) in api.routes else "other"
        sock = request.transport.get_extra_info("socket") if request.transport else None
        peer = None
        if sock is not None and sock.family == socket.AF_UNIX:
            try:
                peer = peer_credentials(sock)
            except OSError:
                peer = None
        elif sock is not None:          # TCP (opt-in): an API key instead of credentials
            refusal = _tcp_refusal(request, api, daemon.api_keys)
            if refusal is not None:
                return _finish(daemon, request, route, None, refusal, {}, t0, web.Response(
                    status=refusal.status, body=refusal.payload(), headers=refusal.headers,
                    content_type="application/json"))
        limit = daemon.cfg.max_body_bytes
        try:
            if request.content_length is not None and request.content_length > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            reply = error_reply(413, f"request body exceeds max_body_bytes={limit}", code="body_too_large")
            return _finish(daemon, request, route, peer, reply, {}, t0, web.Response(
                status=413, body=reply.payload(), content_type="application/json"))

        def gone():
            t = request.transport
            return t is None or t.is_closing()

        areq = ApiRequest(request.method, request.path, body, peer, gone)
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


def _tcp_refusal(request, api, keys):
    """A 401 for a TCP request without a valid API key, 403 for an admin route (those need a
    Unix peer's credentials); None when the request may go on."""
    if not keys or not apikeys.admitted(request.headers.get("Authorization"), keys):
        return error_reply(401, "a request over TCP needs 'Authorization: Bearer KEY' with a key from "
                           "api_keys_file", "authentication_error", "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})
    if request.path in api.ADMIN:
        return error_reply(403, f"{request.path} is not available over TCP", "permission_error", "forbidden")
    return None


def _finish(daemon, request, route, peer, reply, info, t0, resp):
    daemon.metrics.request(route, reply.status)
    ms = (time.monotonic() - t0) * 1e3
    parts = [f"{request.method} {request.path} {reply.status}"]
    for k in ("model", "prompt_tokens", "cached_tokens", "prompt_eval", "completion_tokens", "finish"):
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
        parts.append(f"reason={reply.body.get('error', {}).get('message', '')!r}")
    for k in ("prompt", "reply"):
        if k in info:
            parts.append(f"{k}={json.dumps(info[k], ensure_ascii=False)}")
    log.info(" ".join(parts))
    return resp
