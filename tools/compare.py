#!/usr/bin/env python3
"""Compare edged with llama.cpp (the PyPI llama-cpp-python, built from source with
CMAKE_ARGS=-DGGML_NATIVE=ON) on the same GGUF file and thread count.

Runs are interleaved (edged, llama.cpp, edged, ...) so both see the same machine load; each run
is a fresh process that loads the model, warms up, then times prompt processing (one batch of
-p random tokens) and generation (-n tokens one at a time from an empty context), like
llama-bench's pp/tg. --startup also measures process start -> first generated token and the
peak RSS of a one-token generation with /usr/bin/time -v.

  python tools/compare.py -m model.gguf -t 2 -p 512 -n 128 -r 3 --llama-python /path/venv/bin/python
  python tools/compare.py -m model.gguf -t 2 -p 512 -n 128 -r 3 --llama-bench /path/bin/llama-bench

llama.cpp runs either through llama-cpp-python (--llama-python or $EDGED_LLAMA_PYTHON) or as its
own `llama-bench` binary (--llama-bench or $EDGED_LLAMA_BENCH: one `-r 1 -o json` run per
repetition, its own warm-up); --startup with --llama-bench times the `llama-cli` beside it
(`-st -n 1`, or --llama-cli PATH). --edged-root DIR runs another checkout's edged (DIR/.venv),
e.g. an older commit, against the same llama.cpp runs. EDGED_KERNELS in the environment picks
edged's kernel path as usual.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LLAMA_BENCH = r"""
import json, sys, time, random
from llama_cpp import Llama
path, t, p, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=max(p, n) + 8, n_batch=max(p, 1), n_ubatch=max(p, 1),
            n_threads=t, n_threads_batch=t, verbose=False)
rnd = random.Random(0)
V = llm.n_vocab()
out = {}
for name, k in (("pp", p), ("tg", n)):
    if k <= 0:
        continue
    for rep in range(2):  # a short warm-up (as edged bench does), then the timed run
        toks = [rnd.randrange(V) for _ in range(k if rep else min(k, 16 if name == "pp" else 4))]
        llm.reset()
        t0 = time.perf_counter()
        if name == "pp":
            llm.eval(toks)
        else:
            for tok in toks:
                llm.eval([tok])
        dt = time.perf_counter() - t0
    out[name] = len(toks) / dt
print(json.dumps(out))
"""

LLAMA_FIRST_TOKEN = r"""
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False)
out = llm("Hello", max_tokens=1, temperature=0.0)
"""


def edged_python(root):
    """The interpreter of a checkout: its .venv, or this one (this checkout, or one built in place
    with this interpreter and no .venv of its own)."""
    venv = os.path.join(root, ".venv", "bin", "python")
    if os.path.samefile(root, ROOT) or not os.path.exists(venv):
        return sys.executable
    return venv


def edged_run(root, model, t, p, n):
    cmd = [edged_python(root), "-m", "edged", "bench", "-m", model, "-t", str(t), "-p", str(p),
           "-n", str(n), "-r", "1", "--json"]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
    res = json.loads(r.stdout)["results"]
    return {x["test"][:2]: x["tps_mean"] for x in res}


def llama_run(py, model, t, p, n):
    r = subprocess.run([py, "-c", LLAMA_BENCH, model, str(t), str(p), str(n)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def llama_bench_run(binary, model, t, p, n):
    """One llama-bench run of pp p and tg n (llama-bench warms up before it times)."""
    cmd = [binary, "-m", model, "-t", str(t), "-r", "1", "-o", "json"]
    cmd += ["-p", str(p)] if p > 0 else ["-p", "0"]
    cmd += ["-n", str(n)] if n > 0 else ["-n", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{binary} failed ({r.returncode}): {r.stderr[-2000:]}")
    out = {}
    for x in json.loads(r.stdout):
        out["pp" if x["n_prompt"] > 0 else "tg"] = x["avg_ts"]
    return out


def time_v(cmd, cwd=None):
    gnu_time = shutil.which("time")  # GNU time (the `time` package), not the shell keyword
    if not gnu_time:
        raise RuntimeError("--startup needs GNU time (apt-get install time)")
    r = subprocess.run([gnu_time, "-v"] + cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {r.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", r.stderr).group(1)
    secs = 0.0
    for part in wall.split(":"):
        secs = secs * 60 + float(part)
    return secs, rss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"),
                    help="python with llama_cpp installed (or $EDGED_LLAMA_PYTHON)")
    ap.add_argument("--llama-bench", default=os.environ.get("EDGED_LLAMA_BENCH"),
                    help="llama.cpp's llama-bench binary (or $EDGED_LLAMA_BENCH), instead of --llama-python")
    ap.add_argument("--llama-cli", default=None,
                    help="llama.cpp's llama-cli for --startup (default: beside --llama-bench)")
    ap.add_argument("--edged-root", default=ROOT,
                    help="checkout whose edged to run, with its .venv (default: this one)")
    ap.add_argument("--startup", action="store_true",
                    help="also measure start -> first token and peak RSS with /usr/bin/time -v")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not (a.llama_python or a.llama_bench):
        ap.error("--llama-bench or --llama-python (or $EDGED_LLAMA_BENCH / $EDGED_LLAMA_PYTHON) is required")
    model = os.path.abspath(a.model)
    root = os.path.abspath(a.edged_root)
    runs = {"edged": [], "llama.cpp": []}
    for rep in range(a.repetitions):
        runs["edged"].append(edged_run(root, model, a.threads, a.n_prompt, a.n_gen))
        if a.llama_bench:
            runs["llama.cpp"].append(llama_bench_run(a.llama_bench, model, a.threads, a.n_prompt, a.n_gen))
        else:
            runs["llama.cpp"].append(llama_run(a.llama_python, model, a.threads, a.n_prompt, a.n_gen))
        print(f"run {rep + 1}/{a.repetitions}: edged {runs['edged'][-1]}  "
              f"llama.cpp {runs['llama.cpp'][-1]}  load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    report = {"model": model, "threads": a.threads, "n_prompt": a.n_prompt, "n_gen": a.n_gen,
              "repetitions": a.repetitions, "edged_root": root,
              "edged_kernels": os.environ.get("EDGED_KERNELS", "auto"),
              "llama": a.llama_bench or a.llama_python, "tests": {}}
    for test, k in (("pp", a.n_prompt), ("tg", a.n_gen)):
        if k <= 0:
            continue
        e = [r[test] for r in runs["edged"]]
        l_ = [r[test] for r in runs["llama.cpp"]]
        report["tests"][f"{test}{k}"] = {
            "edged_tps": statistics.mean(e), "edged_stdev": statistics.pstdev(e),
            "llama_tps": statistics.mean(l_), "llama_stdev": statistics.pstdev(l_),
            "ratio": statistics.mean(e) / statistics.mean(l_),
            "edged_median": statistics.median(e), "llama_median": statistics.median(l_),
            "median_ratio": statistics.median(e) / statistics.median(l_)}
    if a.startup:
        es, er = time_v([edged_python(root), "-m", "edged", "generate", "-m", model, "-p", "Hello",
                         "-n", "1", "-t", str(a.threads), "-c", "64"], cwd=root)
        if a.llama_bench or a.llama_cli:
            cli = a.llama_cli or os.path.join(os.path.dirname(a.llama_bench), "llama-cli")
            ls_, lr = time_v([cli, "-m", model, "-p", "Hello", "-n", "1", "-t", str(a.threads), "-c", "64",
                              "--temp", "0", "-st", "--no-warmup"])
        else:
            ls_, lr = time_v([a.llama_python, "-c", LLAMA_FIRST_TOKEN, model, str(a.threads)])
        report["startup"] = {"edged_s": es, "llama_s": ls_, "edged_peak_rss_mib": er,
                             "llama_peak_rss_mib": lr}
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(f"model {os.path.basename(model)}, {a.threads} threads, {a.repetitions} interleaved runs, "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print("| test | edged t/s | llama.cpp t/s | edged / llama.cpp | medians: edged / llama.cpp |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in report["tests"].items():
        print(f"| {name} | {r['edged_tps']:.2f} ± {r['edged_stdev']:.2f} | "
              f"{r['llama_tps']:.2f} ± {r['llama_stdev']:.2f} | {r['ratio']:.2f} | "
              f"{r['edged_median']:.1f} / {r['llama_median']:.1f} = {r['median_ratio']:.2f} |")
    if "startup" in report:
        s = report["startup"]
        print(f"| start -> first token | {s['edged_s']:.2f} s | {s['llama_s']:.2f} s | "
              f"{s['edged_s'] / s['llama_s']:.2f} |")
        print(f"| peak RSS | {s['edged_peak_rss_mib']:.0f} MiB | {s['llama_peak_rss_mib']:.0f} MiB | "
              f"{s['edged_peak_rss_mib'] - s['llama_peak_rss_mib']:+.0f} MiB |")


if __name__ == "__main__":
    main()
