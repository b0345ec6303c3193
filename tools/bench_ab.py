#!/usr/bin/env python3
"""Prompt and generation speed of two builds of edged side by side (before / after a change).

Each build is a checkout with its compiled core in place (e.g. a `git archive` of the merge
base with `python setup.py build_ext --inplace`, or a second worktree after tools/bootstrap.sh).
Runs are interleaved (before, after, before, ...) so both see the same machine load; each run
is a fresh `edged bench` process. Prints the median tokens/s of each build and their ratio.

  python tools/bench_ab.py --before ../base --after . -m q05-Q8_0.gguf q05-Q4_0.gguf \\
      -t 2 -p 512 -n 0 -r 5 --kernels avx512

Make 0.5B-shaped files with `edged synth --shape qwen2.5-0.5b --type Q8_0 q05-Q8_0.gguf`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = "import sys; from edged.cli import main; sys.exit(main())"


def bench(checkout, model, args):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), PYTHONDONTWRITEBYTECODE="1")
    if args.kernels:
        env["EDGED_KERNELS"] = args.kernels
    cmd = [sys.executable, "-c", RUN, "bench", "-m", os.path.abspath(model), "-t", str(args.threads),
           "-p", str(args.n_prompt), "-n", str(args.n_gen), "-r", "1", "--json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.abspath(checkout))
    if r.returncode != 0:
        sys.exit(f"bench failed in {checkout}: {r.stderr.strip()}")
    info = json.loads(r.stdout)
    return {res["test"][:2]: res["tps_mean"] for res in info["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="checkout with the old build")
    ap.add_argument("--after", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="checkout with the new build (default: this one)")
    ap.add_argument("-m", "--models", nargs="+", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=0)
    ap.add_argument("-r", "--rounds", type=int, default=5, help="interleaved runs of each build")
    ap.add_argument("--kernels", help="EDGED_KERNELS for both builds (generic, avx2, avx512)")
    args = ap.parse_args()
    keys = [k for k, n in (("pp", args.n_prompt), ("tg", args.n_gen)) if n > 0]
    print(f"| file | test | before t/s | after t/s | after / before |")
    print(f"| --- | --- | ---: | ---: | ---: |")
    for model in args.models:
        runs = {"before": [], "after": []}
        for _ in range(args.rounds):
            for side in ("before", "after"):
                runs[side].append(bench(getattr(args, side), model, args))
        for k in keys:
            b = statistics.median(r[k] for r in runs["before"])
            a = statistics.median(r[k] for r in runs["after"])
            name = {"pp": f"pp{args.n_prompt}", "tg": f"tg{args.n_gen}"}[k]
            print(f"| {os.path.basename(model)} | {name} | {b:.1f} | {a:.1f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
