#!/usr/bin/env python3
"""Engine-level continuous batching: tokens/s of one session's decode steps vs Model.decode_batch
over 4 sessions, in interleaved rounds (the daemon adds HTTP, sampling and prefill on top).
The two kinds of step alternate one by one (this VM's speed drifts within seconds). Also per
process CPU second: with -t 1 that ratio does not depend on what else the machine runs
(wall-clock figures on a shared machine do), so A/B comparisons of kernels use it.

    tools/bench_batch.py MODEL.gguf [-t THREADS] [-r ROUNDS] [-n STEPS] [-b SESSIONS]
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-n", "--steps", type=int, default=8)
    ap.add_argument("-b", "--batch", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from edged import Model, _core
    m = Model.load(args.model, n_threads=args.threads or None)
    print(f"kernel path {_core.kernel_path()} ({_core.kernel_variant()}), load average {os.getloadavg()[0]:.1f}")
    ss = [m.session(512) for _ in range(args.batch)]
    for i, s in enumerate(ss):
        s.eval([1 + i, 2, 3, 4, 5][:2 + i])            # different positions per session
    ratios, cpu_ratios = [], []
    for r in range(args.rounds):
        # one step of each kind in turn: this VM's speed drifts within seconds, and a drift
        # then weighs on both sides alike instead of on whichever block of steps ran during it
        wall, cpu = [0.0, 0.0], [0.0, 0.0]
        for i in range(args.steps):
            for k in (0, 1):
                t0, c0 = time.perf_counter(), time.process_time()
                if k == 0:
                    ss[0].eval([7 + i])
                else:
                    m.decode_batch(ss, [7 + i + j for j in range(args.batch)])
                wall[k] += time.perf_counter() - t0
                cpu[k] += time.process_time() - c0
        one, many = args.steps / wall[0], args.steps * args.batch / wall[1]
        cpu_one, cpu_many = args.steps / cpu[0], args.steps * args.batch / cpu[1]
        ratios.append(many / one)
        cpu_ratios.append(cpu_many / cpu_one)
        print(f"round {r}: 1 session {one:.1f} tokens/s, batch of {args.batch} {many:.1f} tokens/s "
              f"({many / one:.2f}x); per CPU second {cpu_one:.1f} and {cpu_many:.1f} "
              f"({cpu_many / cpu_one:.2f}x)", flush=True)
        for s in ss:
            s.truncate(8)
    print(f"median ratio {statistics.median(ratios):.2f}x over {args.rounds} rounds "
          f"(per CPU second {statistics.median(cpu_ratios):.2f}x)")


if __name__ == "__main__":
    main()
