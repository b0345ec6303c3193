"""Load and faults against a real, sandboxed daemon.

Load: 64 concurrent clients for a bounded time; every request gets its expected answer (or a
clean 429/503), and the daemon's RSS does not grow over the run. With the text layer present
the clients also ask for completions of a real model.
Faults: a model file that vanished, is unreadable, was tampered with in place or replaced by
rename while loaded; the daemon killed with SIGKILL and started again. Each case: a clear
error to the requester, and the daemon keeps serving.
"""
import collections
import json
import os
import signal
import threading
import time

import pytest

from daemon_support import (Server, UnixHTTPConnection, add_chat_template, can_generate, empty_models_dir,
                            engine_env, open_stream, running, signing_key, stories)

CLIENTS = 64
SECONDS = float(os.environ.get("EDGED_LOAD_SECONDS", "8"))
# EDGED_LOAD_MODEL=FILE: serve this model instead of the tiny test model (e.g. the output of
# `edged synth --shape qwen2.5-0.5b --type Q4_K_M`), for the figures in SECURITY.md.
LOAD_MODEL = os.environ.get("EDGED_LOAD_MODEL")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def trusted(tmp_path_factory):
    return signing_key(tmp_path_factory)


def signed_model(models, name, key, src=None):
    from edged.trust.sign import sign_file
    path = models / f"{name}.gguf"
    if src is not None:
        add_chat_template(src, str(path))
    else:
        path.write_bytes(b"GGUF")
    sign_file(str(path), key)
    return path


# A mix of requests and what each must answer. Streams and completions join in when a model
# can generate.
REQUESTS = [
    ("GET", "/v1/models", None, {200}),
    ("GET", "/health", None, {200, 503}),
    ("GET", "/metrics", None, {200}),
    ("POST", "/v1/chat/completions", b"{not json", {400}),
    ("POST", "/v1/chat/completions", json.dumps({"model": "absent", "messages": []}).encode(), {400, 404}),
    ("POST", "/v1/completions", json.dumps({"model": "absent", "prompt": "x", "n": 3}).encode(), {400, 404}),
]
GENERATE = [
    ("POST", "/v1/chat/completions", json.dumps({"model": "demo", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Once upon a time"}]}).encode(), {200, 429, 503}),
    ("POST", "/v1/completions", json.dumps({"model": "demo", "max_tokens": 8, "stream": True,
                                            "prompt": "Once"}).encode(), {200, 429, 503}),
]


def hammer(srv, requests, seconds):
    """CLIENTS threads, each sending requests in turn until the deadline; returns (count, errors)."""
    deadline = time.monotonic() + seconds
    counts, errors, lock = [0], [], threading.Lock()
    by_status = collections.Counter()

    def client(i):
        n = i
        while time.monotonic() < deadline:
            method, path, body, ok = requests[n % len(requests)]
            n += 1
            c = UnixHTTPConnection(srv.socket, timeout=120)
            try:
                c.request(method, path, body=body,
                          headers={"Content-Type": "application/json"} if body else {})
                r = c.getresponse()
                data = r.read()
                good = r.status in ok
                if good and path.endswith("completions") and r.status == 200:
                    good = b'"finish_reason"' in data and (b"data: [DONE]" in data or b'"usage"' in data)
            except Exception as e:  # noqa: BLE001 - any transport failure is a failed request
                good, data = False, repr(e).encode()
            finally:
                c.close()
            with lock:
                counts[0] += 1
                by_status[(path.rsplit("/", 1)[-1], getattr(r, "status", None))] += 1
                if not good:
                    errors.append((method, path, getattr(r, "status", None), data[:200]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hammer.by_status = by_status
    return counts[0], errors


def test_64_clients_rss_flat(tmp_path, trusted):
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    requests = list(REQUESTS)
    extra = {"sandbox": "enforce", "max_queue": 8, "queue_timeout": 30.0}
    if can_generate():
        signed_model(models, "demo", key, LOAD_MODEL or stories())
        requests += GENERATE
        extra["default_model"] = "demo"
    with running(tmp_path, str(models), keys_dir, extra=extra, env=engine_env()) as srv:
        hammer(srv, requests, 2)                          # warm-up: imports, caches, arenas
        before = rss_kib(srv.proc.pid)
        n, errors = hammer(srv, requests, SECONDS)
        after = rss_kib(srv.proc.pid)
        assert n >= 1000, f"only {n} requests in {SECONDS}s"
        assert not errors, f"{len(errors)} of {n} failed, e.g. {errors[:3]}"
        # flat: growth under 8 MiB (allocator noise) over >= 1,000 requests
        assert after - before < 8 * 1024, (before, after, n)
        print(f"\n{n} requests from {CLIENTS} clients in {SECONDS:.0f}s; RSS {before} -> {after} KiB; "
              + ", ".join(f"{p} {st}: {c}" for (p, st), c in sorted(hammer.by_status.items())))
        srv.assert_serving()


def test_faults_get_clear_errors_and_the_daemon_keeps_serving(tmp_path, trusted):
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    vanish = signed_model(models, "vanish", key)
    locked = signed_model(models, "locked", key)
    tampered = signed_model(models, "tampered", key)
    with running(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"}) as srv:
        status, _, listing = srv.request("GET", "/v1/models")
        assert {m["id"] for m in listing["data"]} == {"vanish", "locked", "tampered"}
        # vanished between listing and load
        vanish.unlink()
        status, _, body = srv.request("POST", "/v1/models/load", {"model": "vanish"})
        assert status == 404 and "vanish" in body["error"]["message"], body
        # unreadable: mode 000; the sandboxed daemon has no CAP_DAC_OVERRIDE even as root
        os.chmod(locked, 0)
        status, _, body = srv.request("POST", "/v1/models/load", {"model": "locked"})
        assert status in (403, 422, 500) and status != 200, body
        assert "locked" in body["error"]["message"], body
        assert "internal error" not in body["error"]["message"], body
        # changed in place after signing: the signature no longer matches
        with open(tampered, "r+b") as f:
            f.seek(2)
            f.write(b"XX")
        status, _, body = srv.request("POST", "/v1/models/load", {"model": "tampered"})
        assert status == 403 and body["error"]["code"] == "model_not_trusted", body
        srv.assert_serving()


def test_sigkill_and_restart(tmp_path, trusted):
    """The daemon keeps no state a crash can break: a stale socket file is replaced."""
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    signed_model(models, "m", key)
    srv = Server(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"})
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    srv.stop()
    assert os.path.exists(srv.socket)                  # left behind by the crash
    with running(tmp_path, str(models), keys_dir, extra={"sandbox": "enforce"}) as again:
        status, _, listing = again.request("GET", "/v1/models")
        assert status == 200 and [m["id"] for m in listing["data"]] == ["m"]


@pytest.mark.skipif(not can_generate(), reason="needs the text layer to load a model")
def test_rename_while_loaded_and_client_killed_mid_stream(tmp_path, trusted):
    key, keys_dir = trusted
    models = empty_models_dir(tmp_path)
    path = signed_model(models, "demo", key, stories())
    with running(tmp_path, str(models), keys_dir, default_model="demo", extra={"sandbox": "enforce"},
                 env=engine_env()) as srv:
        # a client that goes away mid-stream
        c, r = open_stream(srv.socket, {"model": "demo", "prompt": "Once", "max_tokens": 200, "stream": True})
        r.read(64)
        c.sock.close()
        # replace the file by rename with garbage: the loaded model keeps serving
        tmp = models / ".incoming"
        tmp.write_bytes(b"GGUF garbage")
        os.replace(tmp, path)
        status, _, body = srv.request("POST", "/v1/chat/completions", {
            "model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200 and body["choices"][0]["finish_reason"], body
        # the next load verifies the new file and refuses it; the old model is unaffected
        srv.request("POST", "/v1/models/unload", {"model": "demo"})
        status, _, body = srv.request("POST", "/v1/models/load", {"model": "demo"})
        assert status in (403, 422), body
