#!/usr/bin/env python3
"""Soak and chaos run against a real `edged serve` (issue 41): mixed load from several uids
while the daemon's RSS, open descriptors and threads are sampled, its render worker is killed
with SIGKILL and its configuration reloaded (SIGHUP) now and then.

    sudo .venv/bin/python tools/soak.py --minutes 30 --models-dir ../shared/testdata/models
         [--clients 6] [--uids 0,65534,65533] [--kill-every 60] [--reload-every 90]

The three models are copied to a temporary directory and signed with a throwaway key: chat =
SmolLM2-135M-Instruct (chat, tools, grammar, JSON schema, prompt lists, streams), embed =
all-MiniLM-L6-v2 and story = stories260K; with max_loaded_models = 2 and chat pinned, embed
and story swap each other out. Each client is a forked process that drops to its uid (needs
root) and loops over the mix (WEIGHTS) until the time is up; every answer is checked:

- well-formed: 200 with a JSON body (a stream: ending in `data: [DONE]`), or one of the
  documented refusals (400/403/404/408/413/415/422/429/503) with a JSON `error.message`,
  counted as "STATUS CODE" (e.g. "429 swap_rate_limited");
- lost: no answer, a cut connection or a truncated stream, on a request the client did not
  drop itself; server_error: any other 5xx; malformed: anything else.

Prints one JSON object (the daemon's own log goes to stderr): counts by operation and
verdict, examples of failures, the daemon's VmRSS, RssAnon, open fds and threads at warm-up
(the maximum over the samples of the last tenth of the run, at least 10 s, before warm-up
ends at --warmup of the run), at the end (the same over the last tenth) and idle after the
load, every sample as [seconds, VmRSS, RssAnon, fds, threads], the kills and reloads done,
the daemon's CPU seconds, and whether it answered a chat and /health after the last kill.
The pytest wrapper is tests/service/test_soak.py.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from attack_connections import _Unix  # noqa: E402 - http.client over a Unix socket
from bench_daemon import signed_models, start  # noqa: E402

MODELS = {"chat": "SmolLM2-135M-Instruct.Q4_1.gguf", "embed": "all-MiniLM-L6-v2.Q8_0.gguf",
          "story": "stories260K.gguf"}
# The daemon's configuration for the run: small contexts so that several requests fit.
CONFIG = {"default_model": "chat", "pin_default_model": True, "max_loaded_models": 2, "auto_load": True,
          "n_parallel": 4, "ctx_size": 1024, "threads": 1, "max_queue": 32, "queue_timeout": 120.0,
          "socket_mode": "0666", "allow_gids": []}
REFUSALS = {400, 403, 404, 408, 413, 415, 422, 429, 503}   # documented answers with a reason
TIMEOUT = 300        # seconds a client waits for one answer (queue_timeout 120 answers 503 before)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"]}


def _chat(text, **kw):
    return {"model": "chat", "messages": [{"role": "user", "content": text}], **kw}


def _bodies(rnd, i):
    """(operation, method, path, body) of the mix; `i` varies the prompts."""
    return [
        ("chat", "POST", "/v1/chat/completions", _chat(f"Say something about the number {i}.", max_tokens=12,
                                                        temperature=0.7, seed=i)),
        ("chat_stream", "POST", "/v1/chat/completions", _chat(f"Count to {i % 9 + 2}.", max_tokens=16,
                                                               stream=True)),
        ("tools", "POST", "/v1/chat/completions", _chat(f"What is the weather in city {i}?", tools=TOOLS,
                                                         tool_choice="required", max_tokens=32)),
        ("grammar", "POST", "/v1/completions", {"model": "chat", "prompt": f"Is {i} even? Answer:",
                                                 "grammar": 'root ::= " yes" | " no"', "max_tokens": 4}),
        ("json_schema", "POST", "/v1/chat/completions", _chat(
            f"Give n={i} as JSON.", max_tokens=24, response_format={
                "type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}})),
        ("embeddings", "POST", "/v1/embeddings", {"model": "embed", "input": [f"soak text {i}", "hello world",
                                                                              "edge devices"]}),
        ("prompt_list", "POST", "/v1/completions", {"model": "chat", "prompt": [f"A {i}", "B", "C"],
                                                     "max_tokens": 4}),
        ("swap", "POST", "/v1/completions", {"model": "story", "prompt": "Once upon a time", "max_tokens": 8,
                                              "seed": i, "temperature": 0.8}),
        ("drop_stream", "POST", "/v1/completions", {"model": "chat", "prompt": f"Story {i}:", "max_tokens": 200,
                                                     "stream": True, "temperature": 1.0}),
        ("health", "GET", "/health", None),
        ("models", "GET", "/v1/models", None),
        ("metrics", "GET", "/metrics", None),
        ("tokenize", "POST", "/tokenize", {"model": "chat", "content": f"tokens {i}", "with_pieces": True}),
        ("bad_json", "POST", "/v1/completions", b'{"model": "chat", "prompt": '),
        ("unknown_model", "POST", "/v1/completions", {"model": f"nope{i}", "prompt": "x", "max_tokens": 1}),
    ]


WEIGHTS = {"chat": 6, "chat_stream": 4, "tools": 3, "grammar": 3, "json_schema": 3, "embeddings": 4,
           "prompt_list": 3, "swap": 2, "drop_stream": 3, "health": 2, "models": 1, "metrics": 1, "tokenize": 1,
           "bad_json": 1, "unknown_model": 1, "churn": 3}
EXPECT = {"bad_json": 400, "unknown_model": 404}
FAILURES = ("lost", "server_error", "malformed")
SAMPLED = ("rss_mib", "anon_mib", "fds", "threads")


def _refusal_code(status, text):
    """The error code of a documented refusal with a message, else None."""
    try:
        err = json.loads(text)["error"]
        return str(err.get("code") or err.get("type")) if status in REFUSALS and err["message"] else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _verdict(op, status, text, stream):
    """How an answer counts: "200", "STATUS CODE" for a documented refusal (e.g. "429
    swap_rate_limited"), else "malformed", "lost" (a truncated stream) or "server_error"."""
    if op in EXPECT and status != EXPECT[op]:
        return "malformed"
    if status == 200:
        if stream:
            return "200" if text.endswith("data: [DONE]\n\n") else "lost"
        if op == "metrics":
            return "200" if "edged_" in text else "malformed"
        try:
            json.loads(text)
            return "200"
        except ValueError:
            return "malformed"
    if status >= 500 and status != 503:
        return "server_error"
    code = _refusal_code(status, text)
    return f"{status} {code}" if code else "malformed"


def _churn(sock_path, rnd):
    """A connection that goes away: before sending, half-way through a request line, or after a
    request without reading the answer. Returns 'ok' (nothing to check but that the daemon lives)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(sock_path)
        how = rnd.randrange(3)
        if how == 1:
            s.sendall(b"POST /v1/completions HTT")
        elif how == 2:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: edged\r\n\r\n")
    finally:
        s.close()


def one_request(sock_path, rnd, i):
    """Run one operation of the mix: (operation, verdict (see _verdict; "closed" for churn), detail)."""
    ops = list(WEIGHTS)
    op = rnd.choices(ops, weights=[WEIGHTS[o] for o in ops])[0]
    if op == "churn":
        _churn(sock_path, rnd)
        return op, "closed", ""
    _, method, path, body = next(b for b in _bodies(rnd, i) if b[0] == op)
    raw = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    c = _Unix(sock_path, TIMEOUT)
    try:
        c.request(method, path, body=raw, headers={"Content-Type": "application/json"} if raw else {})
        r = c.getresponse()
        if op == "drop_stream" and r.status == 200:
            line = r.readline()                 # the first event, then the client goes away
            return (op, "200", "") if line.startswith(b"data: ") else (op, "malformed", line[:200].decode())
        text = r.read().decode(errors="replace")
        verdict = _verdict(op, r.status, text, stream=isinstance(body, dict) and bool(body.get("stream")))
        return op, verdict, text[-300:] if verdict in FAILURES else ""
    except (OSError, http.client.HTTPException) as e:
        return op, "lost", f"{type(e).__name__}: {e}"
    finally:
        c.close()


def client(sock_path, uid, seed, until, out_fd):
    """Body of a forked client process: drop to `uid`, loop until `until` (time.time()), write
    {op: {status: count}} and examples of failures as JSON to out_fd."""
    if uid != os.getuid():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    rnd = random.Random(seed)
    counts, failures, i = {}, [], seed * 100000
    while time.time() < until:
        i += 1
        op, verdict, detail = one_request(sock_path, rnd, i)
        row = counts.setdefault(op, {})
        row[verdict] = row.get(verdict, 0) + 1
        if verdict in FAILURES and len(failures) < 20:
            failures.append({"op": op, "verdict": verdict, "uid": uid, "at": time.time(), "detail": detail})
    with os.fdopen(out_fd, "w") as f:
        json.dump({"uid": uid, "counts": counts, "failures": failures}, f)


def render_workers(daemon_pid):
    """The render workers: children of the daemon's zygote (the daemon's child)."""
    zygotes = subprocess.run(["pgrep", "-P", str(daemon_pid)], capture_output=True, text=True).stdout.split()
    if not zygotes:
        return []
    out = subprocess.run(["pgrep", "-P", ",".join(zygotes)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def sample(pid):
    """{rss_mib, anon_mib, fds, threads} of process pid now: VmRSS and its anonymous part
    (RssAnon: what a leak grows; mapped model files move VmRSS as models swap)."""
    with open(f"/proc/{pid}/status") as fh:
        status = dict(line.split(":", 1) for line in fh if ":" in line)
    mib = {k: round(int(status[k].split()[0]) / 1024, 1) for k in ("VmRSS", "RssAnon")}
    return {"t": time.time(), "rss_mib": mib["VmRSS"], "anon_mib": mib["RssAnon"],
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task"))}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _window_max(samples, t0, t1):
    inside = [s for s in samples if t0 <= s["t"] <= t1] or samples[-1:]
    return {k: max(s[k] for s in inside) for k in SAMPLED}


def run(sock_path, pid, seconds, uids, clients=6, kill_every=60.0, reload_every=90.0, warmup=0.3,
        window=None, sample_every=2.0, seed=1):
    """The soak against the daemon `pid` serving `sock_path` (a path every uid in `uids` may
    reach); returns the report (a dict). Call from a process without threads (clients fork)."""
    window = window or max(10.0, seconds * 0.1)
    start = time.time()
    until = start + seconds
    procs = []
    for k in range(clients):
        r, w = os.pipe()
        child = os.fork()
        if child == 0:                                       # pragma: no cover - the client process
            code = 1
            try:
                os.close(r)
                client(sock_path, uids[k % len(uids)], seed * 1000 + k, until, w)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        procs.append((child, r))
    cpu0 = cpu_seconds(pid)
    samples, kills, reloads = [], [], []
    next_kill, next_reload = start + kill_every / 2, start + reload_every * 2 / 3
    while time.time() < until:
        samples.append(sample(pid))
        now = time.time()
        if now >= next_kill:
            next_kill += kill_every
            for w in render_workers(pid):
                try:
                    os.kill(w, signal.SIGKILL)
                    kills.append(round(now - start, 1))
                except ProcessLookupError:
                    pass
        if now >= next_reload:
            next_reload += reload_every
            os.kill(pid, signal.SIGHUP)
            reloads.append(round(now - start, 1))
        time.sleep(max(0.0, min(sample_every, until - time.time())))
    results = []
    for child, r in procs:
        with os.fdopen(r) as f:
            text = f.read()
        os.waitpid(child, 0)
        results.append(json.loads(text) if text else {"uid": None, "counts": {}, "failures": [
            {"verdict": "client_died", "detail": f"client {child} wrote nothing"}]})
    cpu = cpu_seconds(pid) - cpu0
    # After the load (and the last kill): the daemon answers, then idles.
    final = {}
    for op in ("chat", "health"):
        body = _chat("Hello!", max_tokens=4) if op == "chat" else None
        c = _Unix(sock_path, 120)
        try:
            c.request("POST" if body else "GET", "/v1/chat/completions" if body else "/health",
                      body=json.dumps(body) if body else None, headers={"Content-Type": "application/json"})
            final[op] = c.getresponse().status
        except (OSError, http.client.HTTPException) as e:
            final[op] = f"{type(e).__name__}: {e}"
        finally:
            c.close()
    time.sleep(3)
    idle = sample(pid)
    warm_end = start + seconds * warmup
    counts, by_status, failures = {}, {}, []
    for res in results:
        failures += res["failures"]
        for op, row in res["counts"].items():
            for key, n in row.items():
                counts.setdefault(op, {}).setdefault(key, 0)
                counts[op][key] += n
                by_status[key] = by_status.get(key, 0) + n
    for f in failures:
        f["at"] = round(f.get("at", start) - start, 1)
    warm, end = _window_max(samples, warm_end - window, warm_end), _window_max(samples, until - window, until)
    return {"seconds": seconds, "clients": clients, "uids": sorted(set(uids[:clients])),
            "cpu": _cpu_name(), "cpus": os.cpu_count(), "daemon_cpu_seconds": round(cpu, 1),
            "requests": sum(by_status.values()), "by_status": dict(sorted(by_status.items())),
            "counts": counts, "failures": failures[:60],
            "lost": by_status.get("lost", 0), "server_error": by_status.get("server_error", 0),
            "malformed": by_status.get("malformed", 0),
            "warmup": warm, "end": end, "idle_end": {k: idle[k] for k in SAMPLED},
            "growth": {k: round(end[k] - warm[k], 1) for k in warm},
            "kills": kills, "reloads": reloads, "after": final, "daemon_alive": _alive(pid),
            "samples": [[round(s["t"] - start)] + [s[k] for k in SAMPLED] for s in samples]}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return not fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return False


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def prepare_models(tmp, src_dir, key=None):
    """(models dir, trusted-keys dir) under tmp: MODELS from src_dir under their soak names,
    signed by key (a new throwaway key by default)."""
    return signed_models(tmp, {name: os.path.join(src_dir, f) for name, f in MODELS.items()}, key)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--models-dir", required=True, help="directory holding " + ", ".join(MODELS.values()))
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--uids", default="0,65534,65533", help="client uids, round robin (comma-separated)")
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills of the render worker")
    ap.add_argument("--reload-every", type=float, default=90.0, help="seconds between SIGHUPs")
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=0.3, help="fraction of the run that is warm-up")
    args = ap.parse_args()
    uids = [int(u) for u in args.uids.split(",")]
    tmp = tempfile.mkdtemp(prefix="edged-soak-")
    try:
        os.chmod(tmp, 0o755)
        models, keys = prepare_models(tmp, args.models_dir)
        proc, sock = start(tmp, models, keys, dict(CONFIG, allow_uids=sorted(set(uids)), log_level="warning"))
        try:
            report = run(sock, proc.pid, args.minutes * 60, uids, clients=args.clients, kill_every=args.kill_every,
                         reload_every=args.reload_every, warmup=args.warmup, sample_every=args.sample_every)
        finally:
            proc.terminate()
            report_exit = proc.wait()
        report["daemon_exit"] = report_exit
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
