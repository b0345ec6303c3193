"""Hot-swap under load, queue overflow, time limits, SIGHUP trust reload, SIGTERM drain: each
against its own real daemon."""
import asyncio
import json
import os
import re
import signal
import time

import pytest

from daemon_support import (ONCE, Server, aiohttp_session, alpha_beta_models, gather, model_dir, open_stream, running,
                            sse_events, stories)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "swap")


def test_hot_swap_under_load_no_failed_request(tmp_path, models):
    with running(tmp_path, *models, default_model="alpha", extra={"max_loaded_models": 1, "pin_default_model": False,
                                                                  "max_queue": 64, "n_parallel": 2}) as srv:
        async def one(s, i):
            name = "alpha" if i % 3 else "beta"
            body = {"model": name, "prompt": ONCE, "max_tokens": 4, "temperature": 0, "stream": bool(i % 2)}
            async with s.post("http://edged/v1/completions", json=body) as r:
                text = await r.text()
                return name, r.status, text

        results = gather(srv.socket, one, range(24))
        failed = [(n, st, t[:200]) for n, st, t in results if st != 200]
        assert not failed, failed
        for name, _, text in results:
            if text.startswith("data: "):
                assert sse_events(text)[0]["model"] == name
            else:
                assert json.loads(text)["model"] == name
        st, _, m = srv.request("GET", "/metrics")
        swaps = float(re.search(r"^edged_model_swaps_total (\S+)$", m, re.M).group(1))
        assert swaps >= 1
        listing = {x["id"]: x for x in srv.request("GET", "/v1/models")[2]["data"]}
        assert sum(x["loaded"] for x in listing.values()) == 1      # max_loaded_models = 1
        assert "swap: draining" in srv.logtext()


def test_queue_overflow_gets_429_with_retry_after(tmp_path, models):
    srv = Server(tmp_path, *models, default_model="alpha", extra={"max_queue": 1, "n_parallel": 1})
    try:
        async def one(s, i):
            body = {"prompt": ONCE, "max_tokens": 60, "temperature": 0}
            async with s.post("http://edged/v1/completions", json=body) as r:
                return r.status, r.headers.get("Retry-After"), await r.json()

        results = gather(srv.socket, one, range(6))
        codes = sorted(st for st, _, _ in results)
        assert codes.count(200) >= 2 and codes.count(429) >= 1, results
        assert set(codes) <= {200, 429}
        for st, retry, body in results:
            if st == 429:
                assert retry == "1" and body["error"]["type"] == "rate_limit_error"
            else:
                assert body["usage"]["completion_tokens"] >= 1
    finally:
        srv.stop()


def test_request_time_limit_ends_with_length_and_prompt_logging(tmp_path, models):
    srv = Server(tmp_path, *models, default_model="alpha", extra={"request_timeout": 0.3, "ctx_size": 2048})
    try:
        t0 = time.monotonic()
        st, _, r = srv.request("POST", "/v1/completions", {"prompt": ONCE, "max_tokens": 2000, "temperature": 0})
        assert st == 200 and r["choices"][0]["finish_reason"] == "length"
        assert r["usage"]["completion_tokens"] < 2000 and time.monotonic() - t0 < 30
        assert ONCE not in srv.logtext()                # prompts are not logged by default
        srv.config.write_text(srv.config.read_text() + "log_prompts = true\n")
        srv.reload(30)
        st, _, r = srv.request("POST", "/v1/completions", {"prompt": ONCE, "max_tokens": 3, "temperature": 0})
        assert f'prompt="{ONCE}"' in srv.logtext() and 'reply=", there' in srv.logtext()
    finally:
        srv.stop()


def test_sigterm_drains_in_flight_stream_then_exits_0(tmp_path, models):
    # A stream long enough to be still running when the signal is handled: 40 tokens of this
    # model could finish first on a busy host, and then nothing is in flight to drain.
    srv = Server(tmp_path, *models, default_model="alpha", extra={"ctx_size": 2048})
    c, r = open_stream(srv.socket, {"prompt": ONCE, "max_tokens": 1500, "stream": True, "temperature": 0})
    assert r.status == 200
    assert r.readline().startswith(b"data: ")
    srv.proc.send_signal(signal.SIGTERM)
    rest = r.read().decode()                       # the stream still completes
    c.close()
    assert rest.rstrip().endswith("data: [DONE]")
    assert '"finish_reason": "length"' in rest
    assert srv.proc.wait(60) == 0
    srv.notify.wait_for("STOPPING=1", 5)
    assert "stopping: draining 1 request(s)" in srv.logtext()
    srv.stop()


def test_sighup_rereads_trust_store(tmp_path, tmp_path_factory, models):
    from edged.trust.keys import fingerprint
    from edged.trust.sign import generate_key, public_pem
    _, trusted = models
    other = generate_key(2048)
    d = model_dir(tmp_path, other, {"delta": stories()})
    keys = tmp_path / "keys"
    keys.mkdir()
    for f in os.listdir(trusted):
        (keys / f).write_bytes(open(os.path.join(trusted, f), "rb").read())
    srv = Server(tmp_path, d, str(keys))
    try:
        st, _, body = srv.request("POST", "/v1/models/load", {"model": "delta"})
        assert st == 403 and body["error"]["code"] == "model_not_trusted"
        (keys / "other.pem").write_bytes(public_pem(other))
        srv.reload(30)
        st, _, body = srv.request("POST", "/v1/models/load", {"model": "delta"})
        assert st == 200 and body["loaded"] and body["signer"] == fingerprint(other)
        srv.notify.wait_for("STATUS=loading model delta", 5)
        srv.notify.wait_for("STATUS=serving (delta)", 5)
        st, _, body = srv.request("POST", "/v1/models/unload", {"model": "delta"})
        assert st == 200 and srv.request("GET", "/health")[0] == 503
    finally:
        srv.stop()


def test_idle_unload_keep_alive_and_watchdog(tmp_path, models):
    srv = Server(tmp_path, *models, default_model="alpha", env={"WATCHDOG_USEC": "200000"},
                 extra={"keep_alive": 1.0, "max_loaded_models": 2})
    try:
        srv.notify.wait_for("WATCHDOG=1", 10)
        st, _, body = srv.request("POST", "/v1/models/load", {"model": "beta"})
        assert st == 200 and set(srv.request("GET", "/health")[2]["models"]) == {"alpha", "beta"}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "beta" in srv.request("GET", "/health")[2]["models"]:
            time.sleep(0.2)
        # beta went idle and was unloaded; alpha, the default model, stays
        assert srv.request("GET", "/health")[2]["models"] == ["alpha"]
        assert "idle for" in srv.logtext()
    finally:
        srv.stop()


def test_over_budget_load_refused_old_model_keeps_serving(tmp_path, models):
    srv = Server(tmp_path, *models, default_model="alpha", extra={"max_loaded_models": 2, "pin_default_model": True})
    try:
        alpha = {m["id"]: m for m in srv.request("GET", "/v1/models")[2]["data"]}["alpha"]
        # A budget alpha fits in, but not alpha and beta together (SIGHUP re-reads it).
        srv.config.write_text(srv.config.read_text() + f"memory_budget = {alpha['memory'] * 3 // 2}\n")
        srv.reload(30)
        st, _, body = srv.request("POST", "/v1/completions", {"model": "beta", "prompt": ONCE, "max_tokens": 2})
        assert st == 503 and body["error"]["code"] == "model_over_budget", body
        assert "does not fit" in body["error"]["message"] and "beta" in body["error"]["message"]
        st, _, r = srv.request("POST", "/v1/completions", {"model": "alpha", "prompt": ONCE, "max_tokens": 2})
        assert st == 200
        assert srv.request("GET", "/health")[2]["models"] == ["alpha"]
    finally:
        srv.stop()


def test_edged_chat_client_streams_reply(tmp_path, models):
    import subprocess
    import sys
    from conftest import ROOT
    srv = Server(tmp_path, *models, default_model="alpha")
    try:
        r = subprocess.run([sys.executable, "-m", "edged", "chat", "--socket", srv.socket, "--temp", "0",
                            "-n", "8"], input="Tell me a story.\nAnd then?\n\n", capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        replies = [line for line in r.stdout.splitlines() if line.strip()]
        assert len(replies) >= 2
        log = srv.logtext()
        assert log.count("POST /v1/chat/completions 200") == 2
        r = subprocess.run([sys.executable, "-m", "edged", "chat", "--socket", str(tmp_path / "none.sock"),
                            "-p", "hi"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "no daemon socket" in r.stderr
    finally:
        srv.stop()


def test_swap_waits_for_the_old_models_in_flight_stream(tmp_path, models):
    srv = Server(tmp_path, *models, default_model="alpha",
                 extra={"max_loaded_models": 1, "pin_default_model": False, "n_parallel": 2})
    try:
        async def main():
            async with aiohttp_session(srv.socket) as s:
                done = {}
                streaming = asyncio.Event()

                async def alpha():
                    body = {"model": "alpha", "prompt": ONCE, "max_tokens": 200, "temperature": 0, "stream": True}
                    async with s.post("http://edged/v1/completions", json=body) as r:
                        first = await r.content.readany()
                        streaming.set()
                        text = (first + await r.read()).decode()
                    done["alpha"] = time.monotonic()
                    return r.status, text

                async def beta():
                    # alpha's stream is running (200 tokens of this model take only tens of ms,
                    # so a fixed delay could outlast it)
                    await streaming.wait()
                    body = {"model": "beta", "prompt": ONCE, "max_tokens": 2, "temperature": 0}
                    async with s.post("http://edged/v1/completions", json=body) as r:
                        res = r.status, await r.json()
                    done["beta"] = time.monotonic()
                    return res

                a, b = await asyncio.gather(alpha(), beta())
                return a, b, done

        (sa, ta), (sb, jb), done = asyncio.run(main())
        assert sa == 200 and ta.endswith("data: [DONE]\n\n") and '"finish_reason": "length"' in ta
        assert sb == 200 and jb["model"] == "beta"
        assert done["alpha"] < done["beta"]
        log = srv.logtext()
        assert log.index("swap: draining alpha for beta") < log.index("unloaded model alpha")
        alpha_line = [line for line in log.splitlines() if "model=alpha" in line and "completion_tokens=200" in line]
        assert alpha_line, log                  # the old model's stream ran to its end
        # beta's request arrived while alpha was streaming: the drain started before alpha ended
        assert log.index("swap: draining alpha for beta") < log.index(alpha_line[0])
    finally:
        srv.stop()
