#!/usr/bin/env python3
"""What rendering chat templates in the bounded render process costs (SECURITY.md, item 3).

For each template, the median wall time of one render in-process (edged.text.chat.render_here)
and through the render worker (a fresh, limited child per render, as the daemon does), over
--runs renders after one warm-up each; also the worker's and one render child's resident
memory. Prints a Markdown table.

    python tools/bench_render.py --runs 30 ../shared/testdata/templates/Meta-Llama-3.1-8B-Instruct.jinja
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edged.service.renderer import RenderWorker  # noqa: E402
from edged.text import chat  # noqa: E402

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
]


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _median_ms(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("templates", nargs="+")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--sandbox", default="off", choices=("off", "enforce"),
                    help="the worker's sandbox, as the daemon's `sandbox` key (enforce needs Linux + seccomp)")
    args = ap.parse_args(argv)
    kw = dict(add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    rows = []
    for path in args.templates:
        source = open(path, encoding="utf-8").read()
        here = _median_ms(lambda: chat.render_here(source, CONVERSATION, **kw), args.runs)
        rows.append([os.path.basename(path), here])
    worker = RenderWorker(args.sandbox)
    worker.start()
    try:
        for row, path in zip(rows, args.templates):
            source = open(path, encoding="utf-8").read()
            row.append(_median_ms(lambda: chat.render(source, CONVERSATION, **kw), args.runs))
        worker_rss = _rss_kib(worker.pid)
    finally:
        worker.close()
    print(f"| template | in-process ms (median, min-max) | render process ms (median, min-max) |")
    print("|---|---|---|")
    for name, here, there in rows:
        print(f"| {name} | {here[0]:.2f} ({here[1]:.2f}-{here[2]:.2f}) | {there[0]:.2f} ({there[1]:.2f}-{there[2]:.2f}) |")
    print(f"\nrender worker RSS: {worker_rss} KiB (mostly shared with the daemon, copy-on-write); "
          f"{args.runs} runs per cell, sandbox {args.sandbox}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
