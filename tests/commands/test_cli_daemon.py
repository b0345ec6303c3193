"""`edged models / ps / load / unload` and serve's flags and EDGED_* variables, against a real
daemon on a real Unix socket (tests/support/daemon_support.py)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from daemon_support import Server, alpha_beta_models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "cli-models")


def edged(*args, env=None):
    return subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_models_ps_load_unload_through_the_socket(tmp_path, models):
    srv = Server(tmp_path, *models)
    try:
        s = ("--socket", srv.socket)
        r = edged("models", *s)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["NAME", "SIZE", "SIGNED", "LOADED", "MODIFIED"]
        assert [l.split()[0] for l in lines[1:]] == ["alpha", "beta"]
        assert all(l.split()[3:5] == ["yes", "no"] for l in lines[1:]), lines    # signed, not loaded
        r = edged("ps", *s)
        assert r.returncode == 0 and r.stdout.splitlines() == [r.stdout.splitlines()[0]]   # header only
        r = edged("load", "alpha", *s)
        assert r.returncode == 0 and r.stdout.startswith("loaded alpha in "), r.stderr
        assert srv.request("GET", "/health")[2]["models"] == ["alpha"]
        r = edged("ps", "--json", *s, env={"EDGED_SOCKET": "/nonexistent"})   # the flag wins
        loaded = json.loads(r.stdout)
        assert [m["id"] for m in loaded] == ["alpha"] and loaded[0]["memory"] > 0
        r = edged("ps", env={"EDGED_SOCKET": srv.socket})                    # the variable as default
        assert r.stdout.splitlines()[1].split()[0] == "alpha", r.stdout
        r = edged("load", "gamma", *s)
        assert r.returncode == 2 and "404" in r.stderr and "gamma" in r.stderr, r.stderr
        r = edged("unload", "alpha", *s)
        assert r.returncode == 0 and r.stdout.strip() == "unloaded alpha", r.stderr
        r = edged("unload", "alpha", *s)
        assert r.returncode == 2 and "not loaded" in r.stderr
        assert edged("ps", "--json", *s).stdout.strip() == "[]"
        assert "POST /v1/models/load 200" in srv.logtext()
    finally:
        assert srv.stop() == 0, srv.logtext()


def test_client_commands_name_the_missing_socket(tmp_path):
    for cmd in (("models",), ("ps",), ("load", "x"), ("unload", "x")):
        r = edged(*cmd, "--socket", str(tmp_path / "none.sock"))
        assert r.returncode == 2 and "no daemon socket at" in r.stderr and "Traceback" not in r.stderr, r.stderr
    sock = tmp_path / "stale.sock"
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()                      # a socket file nobody listens on
    r = edged("models", "--socket", str(sock))
    assert r.returncode == 2 and "nothing listening" in r.stderr, r.stderr


def test_serve_flags_and_environment_override_the_file(tmp_path, models):
    # file: n_parallel 1, log_level info. EDGED_N_PARALLEL=3 beats the file; --log-level info
    # beats EDGED_LOG_LEVEL=error (the access log lines are info); both hold across a reload.
    srv = Server(tmp_path, *models, extra={"n_parallel": 1},
                 env={"EDGED_N_PARALLEL": "3", "EDGED_LOG_LEVEL": "error"},
                 args=("--log-level", "info", "--no-require-signature"))
    try:
        def slots():
            text = srv.request("GET", "/metrics")[2]
            return [line for line in text.splitlines() if line.startswith("edged_slots ")]
        assert slots() == ["edged_slots 3.0"]
        srv.reload()
        assert slots() == ["edged_slots 3.0"]
        assert "GET /metrics 200" in srv.logtext()
    finally:
        assert srv.stop() == 0, srv.logtext()
