#!/usr/bin/env python3
"""What a prompt chunk adds to a pass of decode tokens: the costs the daemon's mixed-load
policy (edged/service/scheduler.py, StepCosts) fits and sizes its chunks from.

    tools/bench_pass_cost.py MODEL.gguf [-t THREADS] [-r REPEATS] [--streams 3]
                             [--pos 0,1000,1900] [--chunks 1,2,4,5,8,16,32,64,128,256]

For each prompt position p and chunk size c: the median time of one Model.decode pass of the
streams' decode tokens alone, of the same pass with c prompt tokens at positions p.. of another
session ("mixed", and what each prompt token adds), and of the c tokens alone. Every pass is
undone (the sessions' caches truncated) so each repeat measures the same work. Watch for the
step where decode rows + c reaches the packed-panel threshold (ED_GEMM_MIN_COLS, 8 rows): the
weights are unpacked once per pass there, a fixed cost a few prompt rows do not repay.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edged import Model                     # noqa: E402
from edged.engine.batch import BatchEntry   # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-r", "--repeats", type=int, default=5)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--pos", default="0,1000,1900")
    ap.add_argument("--chunks", default="1,2,4,5,8,16,32,64,128,256")
    args = ap.parse_args()
    positions = [int(x) for x in args.pos.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    m = Model.load(args.model, n_threads=args.threads)
    unit = m.tokenizer.encode("The old lighthouse keeper climbed the stairs every evening, counting "
                              "the steps. ", add_special=False)
    n_ctx = max(positions) + max(chunks) + 16
    ids = (unit * (n_ctx // len(unit) + 1))[:n_ctx]
    streams = [m.session(n_ctx) for _ in range(args.streams)]
    for s in streams:
        m.decode([BatchEntry(s, tuple(ids[:5]))])
    prompt = m.session(n_ctx)

    def decode_rows():
        return [BatchEntry(s, (ids[7],), None, "last") for s in streams]

    def timed(entries):
        ts = []
        for _ in range(args.repeats):
            n0 = [e.session.n_past for e in entries]
            t0 = time.perf_counter()
            m.decode(entries)
            ts.append((time.perf_counter() - t0) * 1e3)
            for e, n in zip(entries, n0):
                e.session.truncate(n)
        return statistics.median(ts)

    print(f"{os.path.basename(args.model)}, {args.threads} thread(s), {args.streams} decode rows, "
          f"medians of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
    print("| prompt position | chunk | decode pass ms | mixed pass ms | ms per prompt token in the mixed pass | chunk alone ms | ms per token alone |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in positions:
        if prompt.n_past > p:
            prompt.truncate(p)
        while prompt.n_past < p:
            n = min(128, p - prompt.n_past)
            m.decode([BatchEntry(prompt, tuple(ids[prompt.n_past:prompt.n_past + n]), None, None)])
        for c in chunks:
            piece = BatchEntry(prompt, tuple(ids[p:p + c]), None, None)
            d = timed(decode_rows())
            mixed = timed(decode_rows() + [piece])
            alone = timed([piece])
            print(f"| {p} | {c} | {d:.1f} | {mixed:.1f} | {(mixed - d) / c:.2f} | {alone:.1f} | "
                  f"{alone / c:.2f} |", flush=True)
    m.close()


if __name__ == "__main__":
    main()
