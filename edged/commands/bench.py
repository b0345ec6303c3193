"""`edged bench`: prompt-processing and generation speed, like llama-bench."""
import json
import statistics
import sys
import time

import numpy as np

from .loadargs import add_load_args, load_model


def configure(p):
    p.description = ("Prompt processing: one batch of -p random tokens. "
                     "Generation: -n tokens one at a time from an empty context. "
                     "Each is repeated -r times after a short warm-up; mean and spread are printed.")
    add_load_args(p)
    p.add_argument("-p", "--n-prompt", type=int, default=512, metavar="N",
                   help="prompt tokens evaluated in one batch (pp test; 0 skips it; default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, metavar="N",
                   help="tokens generated one at a time (tg test; 0 skips it; default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=5, metavar="R",
                   help="timed runs of each test after the warm-up (default 5)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--profile", action="store_true",
                   help="also print time per op kind for one token and for one prompt batch")
    p.set_defaults(func=run)


def _tokens(m, n, rng):
    return rng.integers(0, m.n_vocab, size=n).tolist()


def run_bench(m, n_prompt, n_gen, reps):
    rng = np.random.default_rng(0)
    s = m.session(n_ctx=max(n_prompt, n_gen, 1))
    results = []
    for name, n in (("pp", n_prompt), ("tg", n_gen)):
        if n <= 0:
            continue
        times = []
        for r in range(reps + 1):  # the first run is a short warm-up (pages in the weights)
            toks = _tokens(m, n if r else min(n, 16 if name == "pp" else 4), rng)
            s.reset()
            t0 = time.perf_counter()
            if name == "pp":
                s.eval(toks)
            else:
                for t in toks:
                    s.eval([t])
            dt = time.perf_counter() - t0
            if r:
                times.append(len(toks) / dt)
        results.append({"test": f"{name}{n}", "n": n, "tps_mean": statistics.mean(times),
                        "tps_stdev": statistics.stdev(times) if len(times) > 1 else 0.0,
                        "samples": times})
    s.close()
    return results


def run(args):
    m = load_model(args)
    try:
        res = run_bench(m, args.n_prompt, args.n_gen, max(1, args.repetitions))
        prof = m.backend.profile(args.n_prompt) if args.profile and hasattr(m.backend, "profile") \
            else None
        info = {"model": args.model, "arch": m.arch, "backend": m.backend_name,
                "threads": m.n_threads, "results": res}
        if prof is not None:
            info["profile"] = prof
        if args.json:
            json.dump(info, sys.stdout, indent=1)
            print()
            return 0
        print(f"| model | backend | threads | test | t/s |")
        print(f"| --- | --- | ---: | ---: | ---: |")
        for r in res:
            print(f"| {m.arch} {m.path.rsplit('/', 1)[-1]} | {m.backend_name} | {m.n_threads} | "
                  f"{r['test']} | {r['tps_mean']:.2f} ± {r['tps_stdev']:.2f} |")
        if args.profile:
            if prof is None:
                print(f"(no per-op profile from the {m.backend_name} backend)")
            else:
                for batch, ops in prof.items():
                    total = sum(ops.values()) or 1.0
                    print(f"\nprofile, {batch}:")
                    for k, v in sorted(ops.items(), key=lambda kv: -kv[1]):
                        print(f"  {k:<24} {v:9.3f} ms  {100 * v / total:5.1f}%")
    finally:
        m.close()
    return 0
