#!/usr/bin/env python3
"""Generation speed and memory at a long context, per KV cache type, against llama-bench.

For each depth (tokens already in the context) and each cache type (K and V the same), fresh
processes, interleaved: `edged bench -p 0 -n N -d DEPTH -ctk T -ctv T` and, with --llama-bench,
`llama-bench -p 0 -n N -d DEPTH -ctk T -ctv T -fa 1` (flash attention: llama.cpp needs it for a
quantized V). Each run is under /usr/bin/time -v for its peak RSS; medians of -r runs are
printed as a Markdown table with the memory plan's KV bytes and the edged / llama.cpp ratio.

  python tools/bench_kvcache.py -m /tmp/qwen05-Q4_0.gguf -d 2048,4096 -n 32 -r 3 \\
      --llama-bench /path/to/llama-bench
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TYPES = ("f16", "q8_0", "q4_0")


def timed(cmd):
    """(stdout, peak RSS in MiB) of cmd under /usr/bin/time -v."""
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return r.stdout, rss / 1024


def edged_run(model, t, n, d, ctype):
    out, rss = timed([sys.executable, "-m", "edged", "bench", "-m", model, "-p", "0", "-n", str(n),
                      "-d", str(d), "-r", "1", "-t", str(t), "-ctk", ctype, "-ctv", ctype, "--json"])
    return json.loads(out)["results"][0]["tps_mean"], rss


def llama_run(bench, model, t, n, d, ctype):
    out, rss = timed([bench, "-m", model, "-p", "0", "-n", str(n), "-d", str(d), "-r", "1",
                      "-t", str(t), "-ctk", ctype, "-ctv", ctype, "-fa", "1", "-o", "json"])
    return json.loads(out)[0]["avg_ts"], rss


def kv_mib(model, d, n, ctype):
    sys.path.insert(0, ROOT)
    from edged.commands.info import model_info
    from edged.engine.kvcache import CacheTypes
    mem = model_info(model, [d + n], CacheTypes.parse(ctype, ctype))["memory"][0]
    return mem["kv_cache"] / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-d", "--depths", default="2048,4096")
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--llama-bench", default=None, help="llama-bench binary (skipped if not given)")
    a = ap.parse_args()
    rows = []
    for d in (int(x) for x in a.depths.split(",")):
        for ctype in a.types.split(","):
            e, l = [], []
            for _ in range(a.repetitions):
                e.append(edged_run(a.model, a.threads, a.n_gen, d, ctype))
                if a.llama_bench:
                    l.append(llama_run(a.llama_bench, a.model, a.threads, a.n_gen, d, ctype))
            med = lambda xs, i: statistics.median(x[i] for x in xs) if xs else None  # noqa: E731
            rows.append((d, ctype, kv_mib(a.model, d, a.n_gen, ctype), med(e, 0), med(e, 1),
                         med(l, 0), med(l, 1), [round(x[0], 2) for x in e]))
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"| depth | K/V cache | KV plan (MiB) | edged tg{a.n_gen} t/s (runs) | llama-bench t/s "
          "| edged / llama.cpp | edged max RSS (MiB) | llama-bench max RSS (MiB) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for d, ct, kv, et, er, lt, lr, runs in rows:
        ratio = f"{et / lt:.2f}" if lt else "-"
        print(f"| {d} | {ct}/{ct} | {kv:.1f} | {et:.2f} ({', '.join(map(str, runs))}) | "
              f"{f'{lt:.2f}' if lt else '-'} | {ratio} | {er:.0f} | {f'{lr:.0f}' if lr else '-'} |")


if __name__ == "__main__":
    main()
