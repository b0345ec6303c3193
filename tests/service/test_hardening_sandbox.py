"""The in-process sandbox (edged/sandbox.py), applied in a child process and probed from inside.

Each test starts a fresh Python that imports numpy, applies the sandbox, then tries what a
compromised daemon would try and what a healthy one needs, and reports every outcome as JSON.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

from edged.service import sandbox

pyseccomp = pytest.importorskip("pyseccomp")

LANDLOCK = sandbox.landlock_abi()

PROBES = r'''
import errno, json, os, socket, subprocess, sys, threading
import numpy as np
from edged.service import sandbox

ro, rw, mode, on_deny = sys.argv[1:5]
desc = sandbox.apply(mode, read_only=[ro], read_write=[rw], on_deny=on_deny)
out = {"describe": desc, "text": sandbox.format_description(desc)}

def probe(name, fn):
    try:
        r = fn()
        out[name] = "ok" if r is not False else "returned False"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)

def thread():
    box = []
    t = threading.Thread(target=lambda: box.append(sum(range(10))))
    t.start(); t.join()
    return box == [45]

def child():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

probe("thread", thread)
probe("numpy", lambda: float((np.arange(64.0).reshape(8, 8) @ np.ones((8, 8))).sum()) == 16128.0)
probe("read_allowed", lambda: open(os.path.join(ro, "model.gguf"), "rb").read() == b"GGUF")
probe("lazy_import_stdlib", lambda: __import__("xml.dom.minidom").dom.minidom.parseString("<a/>") is not None)
probe("lazy_import_extension", lambda: __import__("lzma").decompress(__import__("lzma").compress(b"x")) == b"x")
probe("write_allowed", lambda: open(os.path.join(rw, "w"), "w").write("x") == 1)
probe("unix_socketpair", lambda: socket.socketpair()[0].close())
probe("unix_bind", lambda: socket.socket(socket.AF_UNIX).bind(os.path.join(rw, "s")))
probe("proc_self_status", lambda: "Seccomp" in open("/proc/self/status").read())
probe("fork", child)
probe("subprocess", lambda: subprocess.run(["/bin/true"]))
out["system"] = os.system("true")
if mode == "enforce":
    probe("execv", lambda: os.execv("/bin/true", ["true"]))
probe("etc_passwd", lambda: open("/etc/passwd").read())
probe("write_outside", lambda: open(os.path.join(os.path.dirname(ro), "escape"), "w"))
probe("write_readonly_dir", lambda: open(os.path.join(ro, "new"), "w"))
probe("af_inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
probe("af_inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
probe("af_netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
probe("unix_connect", lambda: socket.socket(socket.AF_UNIX).connect(os.path.join(rw, "s")))
def unshare():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:          # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare")

probe("unshare", unshare)
with open("/proc/self/status") as f:
    out["status"] = dict(l.split(":\t", 1) for l in f.read().splitlines() if ":\t" in l)
print(json.dumps(out))
'''


def run_probes(tmp_path, mode="enforce", on_deny="eperm", script=PROBES):
    ro = tmp_path / "models"
    rw = tmp_path / "run"
    ro.mkdir()
    rw.mkdir()
    (ro / "model.gguf").write_bytes(b"GGUF")
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", script, str(ro), str(rw), mode, on_deny],
                       capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    return p


def probes(tmp_path, **kw):
    p = run_probes(tmp_path, **kw)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_enforce_denies_escape_and_keeps_the_runtime_working(tmp_path):
    out = probes(tmp_path)
    # what a healthy daemon needs
    for name in ("thread", "numpy", "read_allowed", "lazy_import_stdlib", "lazy_import_extension",
                 "write_allowed", "unix_socketpair", "unix_bind", "proc_self_status"):
        assert out[name] == "ok", (name, out[name])
    # no new programs, no new processes
    for name in ("fork", "subprocess", "execv"):
        assert out[name] == "EPERM", (name, out[name])
    assert out["system"] != 0            # system(3) cannot start a shell
    # no network, no connect of any kind, no namespaces
    for name in ("af_inet", "af_inet6", "af_netlink", "unix_connect", "unshare"):
        assert out[name] == "EPERM", (name, out[name])
    st = out["status"]
    assert st["Seccomp"] == "2" and st["NoNewPrivs"] == "1"
    assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0
    assert int(st["CapBnd"], 16) == 0 or os.geteuid() != 0
    d = out["describe"]
    assert d["mode"] == "enforce" and d["kernel"]["Seccomp"] == "2"
    assert "execve" in d["denied"] and "connect" in d["denied"]
    assert "sandbox mode: enforce" in out["text"] and "seccomp: 2" in out["text"]


@pytest.mark.skipif(LANDLOCK == 0, reason="Landlock not available in this kernel")
def test_enforce_landlock_confines_the_filesystem(tmp_path):
    out = probes(tmp_path)
    assert out["etc_passwd"] == "EACCES"
    assert out["write_outside"] == "EACCES"
    assert out["write_readonly_dir"] == "EACCES"
    assert out["describe"]["landlock"] == f"enforced (ABI {LANDLOCK})"
    assert not (tmp_path / "escape").exists()


def test_log_mode_logs_but_allows(tmp_path):
    out = probes(tmp_path, mode="log")
    assert out["status"]["Seccomp"] == "2" and out["status"]["NoNewPrivs"] == "1"
    assert out["fork"] == "ok" and out["af_inet"] == "ok" and out["system"] == 0
    assert out["etc_passwd"] == "ok"             # Landlock has no audit-only mode: skipped
    assert out["describe"]["on_deny"] == "log"


def test_off_mode_changes_nothing(tmp_path):
    out = probes(tmp_path, mode="off")
    assert out["status"]["Seccomp"] == "0"
    assert out["fork"] == "ok" and out["etc_passwd"] == "ok"
    assert "sandbox mode: off" in out["text"]


KILL = r'''
import os, sys, threading
from edged.service import sandbox
sandbox.apply("enforce", read_only=[sys.argv[1]], read_write=[sys.argv[2]], on_deny="kill")
t = threading.Thread(target=print, args=("thread ok",), kwargs={"flush": True})
t.start(); t.join()
os.fork()
print("survived fork", flush=True)
'''


def test_kill_mode_kills_on_fork_but_not_on_threads(tmp_path):
    p = run_probes(tmp_path, script=KILL)
    assert "thread ok" in p.stdout
    assert "survived" not in p.stdout
    assert p.returncode == -signal.SIGSYS, (p.returncode, p.stderr)


SERVER = r'''
import asyncio, json, os, socket, sys
import numpy as np
from aiohttp import web
from edged.service import sandbox

ro, rw = sys.argv[1:3]
sock = socket.socket(socket.AF_UNIX)
sock.bind(os.path.join(rw, "edged.sock"))
sandbox.apply("enforce", read_only=[ro], read_write=[rw])

async def handle(request):
    body = await request.json()
    result = {"sum": float(np.asarray(body["x"], dtype=np.float32).sum())}
    try:
        open("/etc/passwd")
        result["passwd"] = "ok"
    except OSError as e:
        result["passwd"] = e.errno
    return web.json_response(result)

async def main():
    app = web.Application()
    app.router.add_post("/probe", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
'''


@pytest.mark.skipif(not shutil.which("curl"), reason="curl missing")
def test_sandboxed_aiohttp_server_answers_over_unix_socket(tmp_path):
    ro, rw = tmp_path / "models", tmp_path / "run"
    ro.mkdir()
    rw.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(ro), str(rw)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        for i in range(3):
            r = subprocess.run(["curl", "-sS", "--unix-socket", str(rw / "edged.sock"),
                                "-H", "content-type: application/json",
                                "-d", json.dumps({"x": [1, 2, 3, i]}), "http://edged/probe"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            got = json.loads(r.stdout)
            assert got["sum"] == 6 + i
            if LANDLOCK:
                assert got["passwd"] == 13          # EACCES inside a live handler
        with open(f"/proc/{proc.pid}/status") as f:
            status = f.read()
        assert "\nSeccomp:\t2\n" in status and "\nNoNewPrivs:\t1\n" in status
    finally:
        proc.kill()
        proc.wait()


def test_bad_mode_and_double_apply_are_refused(tmp_path):
    with pytest.raises(sandbox.SandboxError, match="'strict'"):
        sandbox.apply("strict")
    with pytest.raises(sandbox.SandboxError, match="on_deny"):
        sandbox.apply("enforce", on_deny="ignore")
    script = textwrap.dedent('''
        import sys
        from edged.service import sandbox
        sandbox.apply("log")
        try:
            sandbox.apply("log")
        except sandbox.SandboxError as e:
            print("refused:", e)
    ''')
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert "refused: the sandbox is already applied" in p.stdout, p.stderr


def test_runtime_paths_never_grant_the_root():
    paths = sandbox.runtime_read_paths()
    assert "/" not in paths
    assert any(p.endswith("lib-dynload") or "python3" in p for p in paths)
    assert "/etc/ld.so.cache" in paths or not os.path.exists("/etc/ld.so.cache")


PRE_FILTERED = r'''
import errno, os, sys
import pyseccomp as sc
# What the unit does before edged runs: no capabilities, and a filter that refuses capset
# (SystemCallFilter=~@privileged with SystemCallErrorNumber=EPERM).
f = sc.SyscallFilter(sc.ALLOW)
f.add_rule(sc.ERRNO(errno.EPERM), "capset")
f.load()
from edged.service import sandbox
d = sandbox.apply("enforce", read_only=[sys.argv[1]], read_write=[sys.argv[2]])
print(d["capabilities"], d["kernel"]["Seccomp_filters"], d["kernel"]["CapEff"])
try:
    os.fork()
except PermissionError:
    print("fork refused")
'''


@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv (util-linux) missing")
@pytest.mark.skipif(os.geteuid() != 0, reason="emptying the bounding set needs root")
def test_apply_under_the_units_restrictions(tmp_path):
    """No capabilities and capset filtered out, as under edged.service: apply still succeeds."""
    (tmp_path / "m").mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
                        sys.executable, "-c", PRE_FILTERED, str(tmp_path / "m"), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["dropped", "2", "0000000000000000", "fork", "refused"]


def test_reloadable_grants_a_dedicated_directory_never_a_shared_one(tmp_path):
    assert sandbox.reloadable("/etc/edged/edged.toml") == "/etc/edged"
    assert sandbox.reloadable(str(tmp_path / "edged.toml")) == str(tmp_path)
    for shared in ("/etc/edged.toml", "/edged.toml", "/var/revoked", "/home/u/edged.toml",
                   "/tmp/edged.toml", "/root/edged.toml"):
        assert sandbox.reloadable(shared) == shared
