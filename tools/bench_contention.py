#!/usr/bin/env python3
"""Generation speed when other programs take CPU time: issue #16's contention table.

Cases, each with 1 and 2 threads:
  quiet      nothing of this script's runs beside the measured process
  nice 19    one `nice -n 19` busy loop per CPU (a device's housekeeping, or other people's
             builds on a shared machine): a thread that sleeps hands its CPU to such a task
  one busy   one busy loop at normal priority pinned to the last CPU this process may use
Engines: `edged bench` (the adaptive thread count, the default), edged with it off
(EDGED_ADAPT_THREADS=0: chunked work and futex barriers only), optionally another checkout's
edged (--baseline: before / after a change) and llama.cpp's `llama-bench`.
Every run is a fresh process generating -n tokens one at a time from an empty context (both
warm up first); the measured processes are not pinned. The engines alternate inside every case
and the cases inside every round (A B C A B C ...); the table shows the median of -r rounds with
the samples, and the load average before each run is recorded (this measures a machine, not
only a program: say how busy it was).

  python tools/bench_contention.py -m q05-Q4_0.gguf -n 64 -r 3 --llama-bench PATH/llama-bench
  python tools/bench_contention.py ... --baseline OTHER_CHECKOUT   # and another build beside it

Without --llama-bench (or $EDGED_LLAMA_BENCH) the llama.cpp column is left out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from compare import ROOT, edged_run, llama_bench_run

BUSY = ["sh", "-c", "while :; do :; done"]
CASES = ("quiet", "nice 19", "one busy")
CASE_NAMES = {"quiet": "quiet", "nice 19": "nice-19 loop per CPU", "one busy": "one core busy"}


def start_load(case, cpus):
    """The busy loops of `case` (child processes; stop_load them when done)."""
    if case == "nice 19":
        return [subprocess.Popen(["nice", "-n", "19"] + BUSY) for _ in cpus]
    if case == "one busy":
        return [subprocess.Popen(BUSY, preexec_fn=lambda: os.sched_setaffinity(0, {cpus[-1]}))]
    return []


def stop_load(procs):
    for p in procs:
        p.kill()
        p.wait()


def one_run(engine, model, threads, n, llama_bench, root, baseline):
    if engine == "llama.cpp":
        return llama_bench_run(llama_bench, model, threads, 0, n)["tg"]
    # the `edged bench` process inherits this
    os.environ["EDGED_ADAPT_THREADS"] = "0" if engine == "edged fixed" else "1"
    return edged_run(baseline if engine == "edged baseline" else root, model, threads, 0, n)["tg"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="GGUF file (the 0.5B Q4_0 of the issue)")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--llama-bench", default=os.environ.get("EDGED_LLAMA_BENCH"),
                    help="llama.cpp's llama-bench binary (or $EDGED_LLAMA_BENCH)")
    ap.add_argument("--no-fixed", action="store_true", help="leave out edged with the adaptive count off")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {CASES}")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--root", default=ROOT,
                    help="the edged checkout to measure (its .venv; default this one)")
    ap.add_argument("--baseline", help="another edged checkout (its .venv), measured the same way "
                    "in a column of its own, interleaved with the others: before / after")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error(f"needs at least 2 CPUs, this process may use {cpus}")
    cases = [c.strip() for c in a.cases.split(",")]
    if any(c not in CASES for c in cases):
        ap.error(f"--cases {a.cases}: expected a subset of {CASES}")
    threads = [int(t) for t in a.threads.split(",")]
    engines = ["edged"] + ([] if a.no_fixed else ["edged fixed"]) + \
        (["edged baseline"] if a.baseline else []) + (["llama.cpp"] if a.llama_bench else [])
    cells = [(c, t) for c in cases for t in threads]
    samples = {(e, cell): [] for e in engines for cell in cells}
    loads = []
    for rep in range(a.repetitions):
        for case, t in cells:
            for e in engines:
                load = os.getloadavg()[0]
                loads.append(load)
                procs = start_load(case, cpus)
                try:
                    tps = one_run(e, model, t, a.n_gen, a.llama_bench, a.root, a.baseline)
                finally:
                    stop_load(procs)
                samples[(e, (case, t))].append(tps)
                print(f"round {rep + 1}/{a.repetitions} {case} t={t} {e}: {tps:.2f} t/s "
                      f"(load {load:.1f})", file=sys.stderr)
    rows = [{"case": f"{CASE_NAMES[c]}, {t} thread{'s' if t > 1 else ''}",
             **{e: statistics.median(samples[(e, (c, t))]) for e in engines},
             **{e + " samples": samples[(e, (c, t))] for e in engines}} for c, t in cells]
    report = {"model": model, "n_gen": a.n_gen, "repetitions": a.repetitions, "cpus": cpus,
              "busy_cpu": cpus[-1], "load_min": min(loads), "load_median": statistics.median(loads),
              "load_max": max(loads), "rows": rows}
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(f"tg{a.n_gen} tokens/s, median of {a.repetitions} (samples), {os.path.basename(model)}; "
          f"CPUs {cpus}, busy loop on CPU {cpus[-1]}; load average before the runs "
          f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})")
    print("| tg t/s | " + " | ".join(engines) + " |")
    print("| --- |" + " ---: |" * len(engines))
    for r in rows:
        print(f"| {r['case']} | " + " | ".join(
            f"{r[e]:.1f} ({', '.join(f'{x:.1f}' for x in r[e + ' samples'])})" for e in engines) + " |")


if __name__ == "__main__":
    main()
