"""An idle daemon uses no CPU: after a request on a model with two compute threads, the
process's utime + stime (/proc/PID/stat, all its threads) stays flat while nothing is asked of
it. Workers that kept spinning (or yielding) after the last request would burn a core each."""
import os
import time

from daemon_support import ONCE, Server, alpha_beta_models

IDLE_SECONDS = 3.0
IDLE_CPU_LIMIT = 0.15   # seconds of CPU over IDLE_SECONDS: timers and the idle sweep, not a core


def cpu_seconds(pid):
    """utime + stime of every thread of `pid` so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_daemon_uses_no_cpu_after_a_request(tmp_path_factory):
    models, trusted = alpha_beta_models(tmp_path_factory, "idle")
    srv = Server(tmp_path_factory.mktemp("daemon"), models, trusted, default_model="alpha",
                 extra={"threads": 2, "pin_default_model": True})
    try:
        status, _, body = srv.request("POST", "/v1/completions",
                                      {"model": "alpha", "prompt": ONCE, "max_tokens": 16, "temperature": 0})
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 16
        time.sleep(0.5)                  # the response is out; let the last wake-ups settle
        before = cpu_seconds(srv.proc.pid)
        time.sleep(IDLE_SECONDS)
        used = cpu_seconds(srv.proc.pid) - before
        assert used <= IDLE_CPU_LIMIT, f"idle daemon used {used:.2f} s of CPU in {IDLE_SECONDS} s"
        srv.assert_serving()
    finally:
        assert srv.stop() == 0, srv.logtext()
