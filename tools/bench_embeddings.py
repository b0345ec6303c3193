#!/usr/bin/env python3
"""Embedding throughput: inputs/s for 32 short sentences (~12 tokens), 32 medium ones (~130
tokens) and 8 (--long-n) long inputs of exactly 512 tokens (a bert-base context), edged's Model.embed
against llama.cpp (llama-cpp-python's Llama.embed, which also sends the whole list as one
batch) on the same file and thread count. Both load the model once and time only embed();
the rounds alternate (edged, llama.cpp, edged, ...; llama.cpp runs in a child process that
waits for each round), medians and their ratio.

  .venv/bin/edged synth --shape bert-base --type F16 /tmp/bert-base-f16.gguf
  .venv/bin/python tools/bench_embeddings.py --model /tmp/bert-base-f16.gguf -t 2 -r 5 \\
      --llama-python /path/to/venv/bin/python

The interpreter with llama_cpp comes from --llama-python or $EDGED_LLAMA_PYTHON (without one,
edged alone is measured); LLAMA_CPP_LIB_PATH picks its native build as usual. Without
llama-cpp-python, --llama-embedding BIN runs llama.cpp's own `llama-embedding` once per round
(`-t N --pooling mean`, the texts one per line, its default batch size: all of them in one
batch) and takes the time between its log's first "batch_decode" line and its performance print
(the model's load and warm-up are before it; its printed "prompt eval time" is 0 for encoders);
edged then embeds with mean pooling too. --serve 32,256 adds the request path: one
/v1/embeddings request of 32 (256) short texts to a real daemon (Unix socket), against
llama-embedding's end-to-end run (process start and model load included) or, with
--llama-server BIN, against the same request to llama-server on a loopback TCP port
(`--embedding --pooling mean -t N -c 8192 -b 8192 -ub 8192`, its other settings at their
defaults; started once, one warm-up request, then timed alternately with edged's).
"""
import argparse
import json
import os
import random
import statistics
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from edged.engine.model import Model  # noqa: E402

WORDS = ("the quick brown fox jumps over lazy dog a an of in on to is was for with as by at "
         "from it this that sensor reading valve pressure alarm report device").split()

LLAMA = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, sets = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
llm = Llama(model_path=path, embedding=True, n_ctx=8192, n_batch=8192, n_ubatch=8192,
            n_threads=threads, n_threads_batch=threads, verbose=False)
for name, texts in sets.items():
    llm.embed(texts)                                  # warm-up
print("ready", flush=True)
for line in sys.stdin:                                # one timed round per set name
    t0 = time.perf_counter()
    llm.embed(sets[line.strip()])
    print(time.perf_counter() - t0, flush=True)
"""


def sentences(n_words, seed, n=32):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(n_words)) for _ in range(n)]


def exactly(m, n_tokens, seed, n=8):
    """n texts of n_tokens tokens each (special tokens included) for model m."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        words = []
        while True:
            words.append(rng.choice(WORDS))
            if len(m.tokenizer.encode(" ".join(words))) > n_tokens:
                words.pop()
                break
        text = " ".join(words)
        while len(m.tokenizer.encode(text + " a")) <= n_tokens:
            text += " a"
        out.append(text)
    return out


def _stamp(line):
    """Seconds of a llama.cpp log line's timestamp (minutes.seconds.ms.us)."""
    m, sec, ms, us = (int(v) for v in line.split()[0].split("."))
    return m * 60 + sec + ms / 1e3 + us / 1e6


def llama_embedding(binary, model, threads, texts):
    """Seconds llama-embedding spends from its first batch_decode to its performance print (the
    batches' evaluation and its printing of the embeddings; the load and warm-up are before),
    from its log's timestamps, the tokens it counted, and the process's wall time (load
    included: its end-to-end time)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n".join(texts))
        f.flush()
        t0 = time.perf_counter()
        r = subprocess.run([binary, "-m", model, "-t", str(threads), "-tb", str(threads),
                            "--pooling", "mean", "-f", f.name, "--perf", "-v"],
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
    lines = r.stderr.splitlines()
    start = next((ln for ln in lines if "batch_decode: n_tokens" in ln), None)
    end = next((ln for ln in lines if "prompt eval time" in ln), None)
    if r.returncode or not start or not end:
        sys.exit(f"llama-embedding failed ({r.returncode}): {r.stderr[-2000:]}")
    tokens = sum(int(re.search(r"n_tokens = (\d+)", ln).group(1))
                 for ln in lines if "batch_decode: n_tokens" in ln)
    return _stamp(end) - _stamp(start), tokens, wall


class LlamaServer:
    """llama.cpp's llama-server serving `model` for embeddings on a free loopback port."""

    def __init__(self, binary, model, threads):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile("w+")           # its log: a pipe nobody reads would fill
        self.proc = subprocess.Popen(
            [binary, "-m", model, "--embedding", "--pooling", "mean", "-t", str(threads),
             "-tb", str(threads), "-c", "8192", "-b", "8192", "-ub", "8192",
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                sys.exit(f"llama-server exited ({self.proc.returncode}): {self.log.read()[-2000:]}")
            try:
                if self.request("/health", None)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        sys.exit("llama-server did not become ready in 120 s")

    def request(self, path, body):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            if body is None:
                c.request("GET", path)
            else:
                c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def embed(self, texts):
        """Seconds from sending one /v1/embeddings request to its whole JSON reply."""
        t0 = time.perf_counter()
        st, body = self.request("/v1/embeddings", {"input": texts})
        took = time.perf_counter() - t0
        assert st == 200 and len(body["data"]) == len(texts), (st, str(body)[:300])
        return took

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def serve_rounds(model, threads, sets, reps, llama_bin, server_bin=None):
    """The request path: POST /v1/embeddings with each set's texts in one request to a real
    daemon (tools/bench_daemon.py's signed temporary one), from sending to the whole JSON reply,
    after one warm-up request; alternated with the same request to llama-server (server_bin) or
    else llama-embedding's end-to-end run (load included). Returns {set: ([ours], [theirs])}."""
    import asyncio
    from bench_daemon import post, signed_models, start
    out = {k: ([], []) for k in sets}
    server = LlamaServer(server_bin, model, threads) if server_bin else None
    if server:
        for texts in sets.values():
            server.embed(texts)                        # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        models_dir, keys = signed_models(tmp, {"m": model})
        proc, sock = start(tmp, models_dir, keys, {"default_model": "m", "threads": threads,
                                                   "auto_load": True, "ctx_size": 512})
        try:
            for texts in sets.values():
                st, _ = asyncio.run(post(sock, "/v1/embeddings", {"model": "m", "input": texts}))
                assert st == 200, st
            for _ in range(reps):
                for name, texts in sets.items():
                    t0 = time.perf_counter()
                    st, body = asyncio.run(post(sock, "/v1/embeddings", {"model": "m", "input": texts}))
                    out[name][0].append(time.perf_counter() - t0)
                    assert st == 200 and len(body["data"]) == len(texts), st
                    if server:
                        out[name][1].append(server.embed(texts))
                    elif llama_bin:
                        out[name][1].append(llama_embedding(llama_bin, model, threads, texts)[2])
        finally:
            proc.terminate()
            proc.wait()
            if server:
                server.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="an encoder GGUF (edged synth --shape bert-base)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("-r", "--reps", type=int, default=5, help="timed rounds per set (default 5)")
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"),
                    help="python with llama_cpp installed (default $EDGED_LLAMA_PYTHON)")
    ap.add_argument("--sets", default="short,long512", help="short, medium, long512 (default short,long512)")
    ap.add_argument("--long-n", type=int, default=8, help="inputs in the long512 set (default 8)")
    ap.add_argument("--llama-embedding", metavar="BIN",
                    help="llama.cpp's llama-embedding binary (instead of --llama-python)")
    ap.add_argument("--serve", metavar="N,N", help="also the request path: /v1/embeddings with N short "
                    "texts in one request to a real daemon (e.g. 32,256), against llama-embedding's "
                    "end-to-end time")
    ap.add_argument("--llama-server", metavar="BIN", help="with --serve: time the same request "
                    "against llama.cpp's llama-server instead of llama-embedding's end-to-end run")
    a = ap.parse_args()
    m = Model.load(a.model, n_threads=a.threads)
    makers = {"short": lambda: sentences(10, 1), "medium": lambda: sentences(120, 2),
              "long512": lambda: exactly(m, min(512, m.embed_limit), 3, a.long_n)}
    sets = {k: makers[k]() for k in a.sets.split(",")}
    ntok = {k: [len(ids) for ids in m.tokenize_inputs(v)] for k, v in sets.items()}
    child = None
    if a.llama_python:
        child = subprocess.Popen([a.llama_python, "-c", LLAMA, a.model, str(a.threads),
                                  json.dumps(sets)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline().strip() == "ready", "llama.cpp child did not start"
    ours = {k: [] for k in sets}
    theirs = {k: [] for k in sets}
    their_tokens = {}
    pooling = "mean" if a.llama_embedding else None
    for name, texts in sets.items():
        m.embed(texts, pooling=pooling)               # warm-up
    for _ in range(a.reps):                           # A B A B ...
        for name, texts in sets.items():
            t0 = time.perf_counter()
            m.embed(texts, pooling=pooling)
            ours[name].append(time.perf_counter() - t0)
            if child:
                child.stdin.write(name + "\n")
                child.stdin.flush()
                theirs[name].append(float(child.stdout.readline()))
            elif a.llama_embedding:
                t, their_tokens[name], _ = llama_embedding(a.llama_embedding, a.model, a.threads, texts)
                theirs[name].append(t)
    if child:
        child.stdin.close()
        child.wait()
    print(f"model {os.path.basename(a.model)} ({m.arch}, n_embd {m.hp.n_embd}, {m.hp.n_layer} "
          f"layers), {a.threads} threads, {a.reps} alternating rounds, medians; backend "
          f"{m.backend_name}, load {os.getloadavg()[0]:.1f}")
    for name in sets:
        n, e = len(sets[name]), statistics.median(ours[name])
        line = (f"{name:>7}: {n} inputs, {sum(ntok[name])} tokens (max {max(ntok[name])}): edged "
                f"{n / e:7.2f} inputs/s ({e * 1000:.0f} ms)")
        if theirs[name]:
            ll = statistics.median(theirs[name])
            line += f", llama.cpp {n / ll:7.2f} inputs/s ({ll * 1000:.0f} ms"
            line += f", {their_tokens[name]} tokens)" if name in their_tokens else ")"
            line += f", ratio {ll / e:.2f}"
        print(line)
        print(f"         edged runs {[round(t, 3) for t in ours[name]]}"
              + (f" llama.cpp runs {[round(t, 3) for t in theirs[name]]}" if theirs[name] else ""))
    if a.serve:
        m.close()
        reqs = {f"req{n}": sentences(10, 4, int(n)) for n in a.serve.split(",")}
        other = "llama-server" if a.llama_server else "llama-embedding end to end"
        for name, (e, ll) in serve_rounds(a.model, a.threads, reqs, a.reps, a.llama_embedding,
                                          a.llama_server).items():
            line = f"{name:>7}: /v1/embeddings, {len(reqs[name])} texts in one request: {statistics.median(e) * 1000:.0f} ms"
            if ll:
                line += (f", {other} {statistics.median(ll) * 1000:.0f} ms, "
                         f"ratio {statistics.median(ll) / statistics.median(e):.2f}")
            print(line)
            print(f"         edged runs {[round(t, 3) for t in e]} {other} runs {[round(t, 3) for t in ll]}")


if __name__ == "__main__":
    main()
