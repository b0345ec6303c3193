"""Time to first token for a long prompt in a fresh process: from a prompt-cache file vs
evaluated again (BENCHMARKS.md "Prompt cache on disk").

    python tools/bench_prompt_cache.py MODEL.gguf [--tokens 2000] [--cache-type f16] [--runs 3]

Each measurement runs in a new process (a restart: model loaded, nothing in memory). The file's
pages are dropped from the page cache before each read (posix_fadvise DONTNEED on that file
only), so "disk" includes reading it from the device. Model load time is the same for both and
is not counted. Prints one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def phase(args):
    import numpy as np
    from edged import Model
    from edged.engine.model import Session
    key = bytes(32)
    m = Model.load(args.model, n_threads=args.threads or None, cache_type_k=args.cache_type,
                   cache_type_v=args.cache_type)
    ids = np.random.default_rng(0).integers(100, m.n_vocab, args.tokens).tolist()
    n_ctx = args.tokens + 48
    out = {}
    if args.phase in ("save", "recompute"):
        s = m.session(n_ctx=n_ctx)
        t0 = time.perf_counter()
        s.eval(ids)                                 # the prompt's last row gives the first token
        out["ms"] = (time.perf_counter() - t0) * 1000
        if args.phase == "save":
            t0 = time.perf_counter()
            out["bytes"] = s.save(args.file, key)
            out["save_ms"] = (time.perf_counter() - t0) * 1000
    else:
        fd = os.open(args.file, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        t0 = time.perf_counter()
        s = Session.load(m, args.file, key)
        s.truncate(len(ids) - 1)                    # as Session.start: the last token again
        s.eval(ids[-1:])
        out["ms"] = (time.perf_counter() - t0) * 1000
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--cache-type", default="f16")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--phase", choices=("save", "recompute", "restore"), help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        return phase(args)
    with tempfile.TemporaryDirectory(dir=os.environ.get("EDGED_BENCH_DIR")) as d:
        f = os.path.join(d, "prompt.edkv")

        def run(what):
            r = subprocess.run([sys.executable, __file__, args.model, "--tokens", str(args.tokens),
                                "--cache-type", args.cache_type, "--threads", str(args.threads),
                                "--phase", what, "--file", f], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": HERE}, check=True)
            return json.loads(r.stdout)
        saved = run("save")
        rec = [run("recompute")["ms"] for _ in range(args.runs)]
        disk = [run("restore")["ms"] for _ in range(args.runs)]
    out = {"model": os.path.basename(args.model), "tokens": args.tokens,
           "cache_type": args.cache_type, "recompute_ms": round(statistics.median(rec), 1),
           "disk_ms": round(statistics.median(disk), 1), "save_ms": round(saved["save_ms"], 1),
           "file_bytes": saved["bytes"],
           "bytes_per_1000_tokens": round(saved["bytes"] * 1000 / args.tokens)}
    out["disk_over_recompute"] = round(out["disk_ms"] / out["recompute_ms"], 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
