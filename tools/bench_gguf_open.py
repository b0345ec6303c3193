#!/usr/bin/env python3
"""Time opening a GGUF file (header, all metadata, tensor table) with edged's reader and,
for comparison, with the PyPI `gguf` reader. Prints the median of N runs for each.

  python tools/bench_gguf_open.py FILE [-r 7] [--no-oracle]
"""
import argparse
import statistics
import time


def timed(fn, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, min(times) * 1000, max(times) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("-r", "--runs", type=int, default=7)
    ap.add_argument("--no-oracle", action="store_true", help="skip the (slow) PyPI gguf reader")
    args = ap.parse_args()

    from edged.format.gguf import GGUFFile

    def ours():
        GGUFFile.open(args.file).close()

    med, lo, hi = timed(ours, args.runs)
    print(f"edged GGUFFile.open   median {med:8.1f} ms  (min {lo:.1f}, max {hi:.1f}, {args.runs} runs)")
    if not args.no_oracle:
        import gguf

        def theirs():
            r = gguf.GGUFReader(args.file)
            for f in r.fields.values():   # materialise the values, as edged's reader does
                f.contents()

        runs = max(1, min(3, args.runs))
        omed, olo, ohi = timed(theirs, runs)
        print(f"gguf.GGUFReader       median {omed:8.1f} ms  (min {olo:.1f}, max {ohi:.1f}, {runs} runs)")
        print(f"ratio                 {omed / med:8.1f}x faster")


if __name__ == "__main__":
    main()
