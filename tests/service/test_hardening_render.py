"""Against a real sandboxed daemon: a hostile chat template in a signed model costs at most the
render limits (issue 13.3), and the daemon starts with no thread outside its sandbox and no
warning, whatever the operator's environment (issue 13.7)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from daemon_support import Server, model_dir, running, signing_key, stories
from edged.service import sandbox

HOSTILE = {
    "center": "{{ ''|center(3000000000) }}",
    "doubling": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}{{ ns.s }}"),
    "spin": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}
# 2**28 characters, doubled once more: past the render process's 256 MiB, nothing a check sees
BIG = ("{% set ns = namespace(s='x') %}{% for i in range(28) %}{% set ns.s = ns.s ~ ns.s %}"
       "{% endfor %}{{ ns.s|length }}")


def _peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


@pytest.fixture(scope="module")
def hostile_models(tmp_path_factory):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("hostile")
    models = {"good": stories()}
    d = model_dir(tmp, key, models)
    from daemon_support import add_chat_template
    from edged.trust.sign import sign_file
    for name, template in dict(HOSTILE, big=BIG).items():
        dst = os.path.join(d, f"{name}.gguf")
        add_chat_template(stories(), dst, template=template)
        os.chmod(dst, 0o644)
        sign_file(dst, key)
    return d, trusted


def test_hostile_template_costs_at_most_the_render_limits(tmp_path, hostile_models):
    models, trusted = hostile_models
    extra = {"sandbox": "enforce", "max_loaded_models": 4, "auto_load": True, "swap_interval": 0}
    with running(tmp_path, models, trusted, default_model="good", extra=extra) as srv:
        base = _peak_rss_kib(srv.proc.pid)
        for name in HOSTILE:
            srv.request("POST", "/v1/models/load", {"model": name})
            t0 = time.monotonic()
            status, _, body = srv.request("POST", "/v1/chat/completions",
                                          {"model": name, "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 2})
            took = time.monotonic() - t0
            assert status == 422 and body["error"]["code"] == "model_unusable", (name, status, body)
            assert took < 2.0 + 3.0, (name, took)
            # other clients are served meanwhile and afterwards
            assert srv.request("GET", "/health")[0] == 200
        status, _, body = srv.request("POST", "/v1/chat/completions",
                                      {"model": "good", "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 2})
        assert status == 200, body
        # the daemon itself never held the 3 GB the first payload asked for (it took a daemon
        # from 162 MB to 3.1 GB before), nor the doubling string
        assert _peak_rss_kib(srv.proc.pid) - base < 100 * 1024, (base, _peak_rss_kib(srv.proc.pid))
        assert srv.proc.poll() is None


def test_normal_start_has_no_thread_outside_the_sandbox_and_no_warning(tmp_path, hostile_models):
    """Started by hand without OPENBLAS_NUM_THREADS (as root, as in the issue): `edged serve` sets
    the thread variables itself, so no thread predates the sandbox and nothing is warned."""
    models, trusted = hostile_models
    env = {k: "" for k in sandbox.LIBRARY_THREAD_ENV}
    with running(tmp_path, models, trusted, default_model="good", extra={"sandbox": "enforce"}, env=env) as srv:
        assert srv.request("GET", "/health")[0] == 200
        log = srv.logtext()
    assert "started before the sandbox" not in log and "were not dropped" not in log, log
    warnings = [line for line in log.splitlines() if "WARNING" in line or "warning" in line.lower()]
    assert not warnings, warnings


@pytest.mark.skipif(sandbox.landlock_abi() >= 8 or sandbox.landlock_abi() == 0,
                    reason="with Landlock ABI 8 every thread is covered (or there is no Landlock at all)")
def test_daemon_refuses_to_start_with_a_thread_its_sandbox_would_not_cover(tmp_path, hostile_models):
    """A program that imported numpy (starting OpenBLAS's pool) before starting the daemon."""
    models, trusted = hostile_models
    cfg = tmp_path / "edged.toml"
    cfg.write_text(f'socket = "{tmp_path}/s.sock"\nmodels_dir = "{models}"\ntrusted_keys = "{trusted}"\n'
                   f'socket_group = ""\nsandbox = "enforce"\n')
    code = ("import os\nfor k in %r: os.environ.pop(k, None)\nos.environ['OPENBLAS_NUM_THREADS'] = '2'\n"
            "import numpy, threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
            "from edged.service import config\nfrom edged.service.daemon import serve\n"
            "raise SystemExit(serve(config.load(%r)))\n") % (sandbox.LIBRARY_THREAD_ENV, str(cfg))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode != 0
    assert "thread(s) started before the sandbox" in r.stderr and "OPENBLAS_NUM_THREADS=1" in r.stderr, r.stderr


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def _render_worker(daemon_pid):
    """The render worker: the one process below the daemon with no child while nothing renders."""
    todo, leaves = _children(daemon_pid), []
    while todo:
        p = todo.pop()
        kids = _children(p)
        todo += kids
        if not kids:
            leaves.append(p)
    assert len(leaves) == 1, leaves
    return leaves[0]


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1].startswith(("Z", "X"))
    except OSError:
        return True


def test_no_request_kills_the_render_worker_and_a_killed_worker_is_replaced(tmp_path, hostile_models):
    """Issue 41.3: tool-call arguments nested 975 deep made the worker's own json.loads raise and
    the worker exit; chat then rendered inside the daemon (a template the render process refuses
    for memory then succeeded, peak RSS +770 MB). Now the worker answers such a request with an
    error and stays; one killed with SIGKILL is replaced by the next request, and no template
    ever renders in the daemon's process."""
    models, trusted = hostile_models
    extra = {"sandbox": "enforce", "max_loaded_models": 4, "auto_load": True, "swap_interval": 0}
    deep = "[" * 975 + "]" * 975
    attack = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "ok"}]

    def chat(srv, model="good", messages=None):
        return srv.request("POST", "/v1/chat/completions", {
            "model": model, "messages": messages or [{"role": "user", "content": "hi"}], "max_tokens": 2})

    with running(tmp_path, models, trusted, default_model="good", extra=extra) as srv:
        srv.request("POST", "/v1/models/load", {"model": "big"})
        assert chat(srv)[0] == 200
        worker = _render_worker(srv.proc.pid)
        status, _, body = chat(srv, messages=attack)
        assert status == 400 and "nested too deeply" in body["error"]["message"], (status, body)
        assert not _gone(worker), srv.logtext()[-3000:]          # the same worker, still there
        assert chat(srv)[0] == 200
        os.kill(worker, signal.SIGKILL)
        for _ in range(3):                      # the next request and those after it succeed
            status, _, body = chat(srv)
            assert status == 200, (status, body, srv.logtext()[-3000:])
        assert _render_worker(srv.proc.pid) != worker
        # a template only the render process's memory limit stops is still refused: it never
        # renders in the daemon
        base = _peak_rss_kib(srv.proc.pid)
        status, _, body = chat(srv, "big")
        assert status == 422 and "memory" in body["error"]["message"], (status, body)
        assert _peak_rss_kib(srv.proc.pid) - base < 100 * 1024
        assert srv.proc.poll() is None
