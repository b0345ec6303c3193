#!/usr/bin/env python3
"""Generation speed when another program takes a core: issue #16's contention table.

For each case (quiet / one core busy) x (1 / 2 threads) it runs tg (-n tokens one at a time
from an empty context, after a short warm-up) as fresh processes: `edged bench`, optionally
edged again with the adaptive thread count off (EDGED_ADAPT_THREADS=0: chunked work and
futex barriers only), and llama.cpp through llama-cpp-python. "Busy" is a busy loop pinned
to the last CPU this process may use (os.sched_setaffinity), started before and killed after
each run; the measured processes are not pinned (numa none, the default). The runs of all
engines are interleaved, case after case, repeated -r times; the table shows medians, and the
load average when the script started and ended (this measures a machine, not only a program).

  edged synth --shape qwen2.5-0.5b --type Q4_0 /tmp/qwen0.5b-q4_0.gguf
  python tools/bench_contention.py -m /tmp/qwen0.5b-q4_0.gguf -n 32 -r 5 \
      --llama-python /path/venv/bin/python

Without --llama-python (or $EDGED_LLAMA_PYTHON) the llama.cpp column is left out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from compare import edged_run, llama_run

BUSY = "while True:\n    pass\n"


def busy_loop(cpu):
    """A Python busy loop pinned to `cpu` (a child process; kill it when done)."""
    return subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def one_run(engine, model, threads, n, llama_python):
    if engine == "llama.cpp":
        return llama_run(llama_python, model, threads, 0, n)["tg"]
    # edged_run's `edged bench` process inherits this
    os.environ["EDGED_ADAPT_THREADS"] = "0" if engine == "edged (fixed threads)" else "1"
    return edged_run(model, threads, 0, n)["tg"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="GGUF file (a 0.5B-shaped Q4_0 from `edged synth`)")
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--llama-python", default=os.environ.get("EDGED_LLAMA_PYTHON"),
                    help="python with llama_cpp installed (or $EDGED_LLAMA_PYTHON)")
    ap.add_argument("--no-fixed", action="store_true", help="leave out edged with the adaptive count off")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error(f"needs at least 2 CPUs, this process may use {cpus}")
    engines = ["edged"] + ([] if a.no_fixed else ["edged (fixed threads)"]) + \
        (["llama.cpp"] if a.llama_python else [])
    cases = [(busy, t) for busy in (False, True) for t in (1, 2)]
    samples = {(e, c): [] for e in engines for c in cases}
    load0 = os.getloadavg()
    for rep in range(a.repetitions):
        for busy, t in cases:
            for e in engines:
                hog = busy_loop(cpus[-1]) if busy else None
                try:
                    tps = one_run(e, model, t, a.n_gen, a.llama_python)
                finally:
                    if hog:
                        hog.kill()
                        hog.wait()
                samples[(e, (busy, t))].append(tps)
                print(f"run {rep + 1}/{a.repetitions} {'busy' if busy else 'quiet'} t={t} {e}: "
                      f"{tps:.2f} t/s", file=sys.stderr)
    load1 = os.getloadavg()
    rows = [{"case": f"{'one core busy' if busy else 'quiet'}, {t} thread{'s' if t > 1 else ''}",
             **{e: statistics.median(samples[(e, (busy, t))]) for e in engines},
             **{e + " samples": samples[(e, (busy, t))] for e in engines}} for busy, t in cases]
    report = {"model": model, "n_gen": a.n_gen, "repetitions": a.repetitions, "cpus": cpus,
              "busy_cpu": cpus[-1], "loadavg_start": load0, "loadavg_end": load1, "rows": rows}
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(f"tg{a.n_gen} tokens/s, median of {a.repetitions}, {os.path.basename(model)}; busy loop on "
          f"CPU {cpus[-1]} of {cpus}; load average {load0[0]:.1f} at start, {load1[0]:.1f} at end")
    print("| | " + " | ".join(engines) + " |")
    print("| --- |" + " ---: |" * len(engines))
    for r in rows:
        print(f"| {r['case']} | " + " | ".join(f"{r[e]:.1f}" for e in engines) + " |")


if __name__ == "__main__":
    main()
