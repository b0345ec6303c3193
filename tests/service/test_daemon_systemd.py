"""systemd integration and the socket, with real parts: a real daemon process, a real datagram
socket as NOTIFY_SOCKET, real systemd-socket-activate, curl, signals, peer credentials."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT
from daemon_support import Notify, Server, needs_curl, request
from edged.service import systemd


@pytest.fixture
def empty_dirs(tmp_path):
    models, keys = tmp_path / "models", tmp_path / "keys"
    models.mkdir()
    keys.mkdir()
    return str(models), str(keys)


def test_notify_sends_datagrams_and_is_a_noop_without_socket(tmp_path, monkeypatch):
    n = Notify(tmp_path / "n.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", n.path)
    assert systemd.notify("READY=1", "STATUS=hello")
    assert n.wait_for("STATUS=hello", 5) == "READY=1\nSTATUS=hello"
    n.close()
    # abstract namespace address ("@name")
    name = f"edged-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    assert systemd.notify("WATCHDOG=1")
    s.settimeout(5)
    assert s.recv(100) == b"WATCHDOG=1"
    s.close()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert systemd.notify("READY=1") is False


def test_listen_fds_honours_listen_pid(monkeypatch):
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    assert systemd.listen_fds() == []
    assert "LISTEN_FDS" not in os.environ and "LISTEN_PID" not in os.environ
    # The process named by LISTEN_PID gets fd 3 as a socket (checked in a child: fd 3 is ours).
    code = ("import os, socket; a, b = socket.socketpair(); os.dup2(a.fileno(), 3); "
            "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid())); "
            "from edged.service import systemd; s = systemd.listen_fds(); "
            "print(len(s), s[0].family == socket.AF_UNIX, s[0].fileno(), 'LISTEN_FDS' in os.environ)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert r.stdout.split() == ["1", "True", "3", "False"], r.stderr


def test_daemon_lifecycle_ready_reload_stop(tmp_path, empty_dirs):
    srv = Server(tmp_path, *empty_dirs, extra={"max_queue": 5})
    try:
        msg = srv.notify.wait_for("READY=1")
        assert "STATUS=serving (no model loaded)" in msg
        assert any(m.startswith("STATUS=starting") for m in srv.notify.messages)
        st, _, body = srv.request("GET", "/health")
        assert st == 503 and body["error"]["message"] == "no model loaded"
        assert oct(os.stat(srv.socket).st_mode & 0o777) == "0o660"
        # SIGHUP: RELOADING=1 then READY=1, the new config is in force
        srv.config.write_text(srv.config.read_text().replace("max_queue = 5", "max_queue = 7"))
        srv.reload(30)
        assert "RELOADING=1" in srv.notify.messages[0].split("\n")
        assert any(line.startswith("MONOTONIC_USEC=") for line in srv.notify.messages[0].split("\n"))
        assert "reloaded configuration" in srv.logtext()
        st, _, m = srv.request("GET", "/metrics")
        assert st == 200 and 'edged_requests_total{route="/health",status="503"} 1' in m
        # a broken config on SIGHUP keeps the running one
        srv.config.write_text(srv.config.read_text() + "n_parallel = 0\n")
        srv.reload(30)
        assert "reload failed, keeping the running configuration" in srv.logtext()
        assert "'n_parallel'" in srv.logtext()
        assert srv.request("GET", "/v1/models")[0] == 200
        srv.notify.messages.clear()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        srv.notify.wait_for("STOPPING=1", 5)
        assert not os.path.exists(srv.socket)
    finally:
        srv.stop()


def test_stale_socket_replaced_live_socket_refused(tmp_path, empty_dirs):
    srv = Server(tmp_path, *empty_dirs)
    srv.proc.kill()                       # leaves the socket file behind
    srv.proc.wait()
    srv.stop()
    assert os.path.exists(srv.socket)
    srv2 = Server(tmp_path, *empty_dirs)
    try:
        assert "replacing stale socket" in srv2.logtext()
        assert srv2.request("GET", "/v1/models")[0] == 200
        r = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(srv2.config)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert "another process is already listening" in r.stderr
        assert srv2.request("GET", "/v1/models")[0] == 200       # the first one is unharmed
    finally:
        assert srv2.stop() == 0


@needs_curl
@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing")
def test_socket_activation_with_systemd_socket_activate(tmp_path, empty_dirs):
    path = str(tmp_path / "activated.sock")
    srv = Server(tmp_path, *empty_dirs, argv_prefix=["systemd-socket-activate", "-l", path, "-E", "NOTIFY_SOCKET", "-E", "PYTHONPATH"], wait=False)
    try:
        # The socket exists before the daemon runs: systemd-socket-activate holds it, and
        # starts edged on the first connection.
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = subprocess.run(["curl", "-sS", "--max-time", "60", "--unix-socket", path, "http://edged/v1/models"],
                           capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr + srv.logtext()
        assert json.loads(r.stdout) == {"object": "list", "data": []}
        srv.wait_ready(30)
        assert "(systemd)" in srv.logtext()
        assert not os.path.exists(srv.socket)        # it did not bind its own
    finally:
        srv.stop()


@needs_curl
def test_peer_credentials_refused_with_403_and_logged(tmp_path, empty_dirs):
    srv = Server(tmp_path, *empty_dirs, extra={"allow_uids": [4242], "allow_gids": []})
    try:
        r = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", "--unix-socket", srv.socket,
                            "http://edged/v1/models"], capture_output=True, text=True, timeout=30)
        body, code = r.stdout.rsplit("\n", 1)
        assert code == "403"
        assert json.loads(body)["error"]["type"] == "permission_error"
        log = srv.logtext()
        assert "refused GET /v1/models from uid 0 gid 0 pid" in log
    finally:
        srv.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client under another uid")
def test_admin_routes_narrower_than_api_for_another_uid(tmp_path, empty_dirs):
    nobody = 65534
    public = tempfile.mkdtemp(prefix="edged-test-")      # tmp_path is not reachable for uid 65534
    os.chmod(public, 0o755)
    srv = Server(tmp_path, *empty_dirs, extra={"allow_uids": [0, nobody], "allow_gids": [],
                                               "admin_uids": [0], "socket_mode": "0666",
                                               "socket": os.path.join(public, "edged.sock")})

    def as_nobody(path, body=None):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                      # child: become uid 65534, then talk to the daemon
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(nobody)
                os.setuid(nobody)
                st, _, b = request(srv.socket, "POST" if body is not None else "GET", path, body, timeout=30)
                os.write(w, json.dumps([st, b]).encode())
            except BaseException as e:
                os.write(w, json.dumps([0, repr(e)]).encode())
            finally:
                os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        return json.loads(data)

    try:
        st, body = as_nobody("/v1/models")
        assert st == 200 and body["object"] == "list"
        st, body = as_nobody("/v1/models/load", {"model": "anything"})
        assert st == 403 and body["error"]["code"] == "forbidden"
        assert f"refused POST /v1/models/load from uid {nobody} gid {nobody} pid" in srv.logtext()
        st, _, body = srv.request("POST", "/v1/models/load", {"model": "anything"})
        assert st == 404                    # root passes the admin check, then: no such model
    finally:
        srv.stop()
        shutil.rmtree(public, ignore_errors=True)


def test_journald_priority_prefixes(tmp_path, empty_dirs):
    srv = Server(tmp_path, *empty_dirs, journal=True)
    try:
        srv.request("GET", "/health")
    finally:
        srv.stop()
    lines = srv.log_path.read_text().splitlines()
    assert any(line.startswith("<6>listening on ") for line in lines), lines
    assert any(line.startswith("<6>GET /health 503") for line in lines), lines
