"""`edged bench`: prompt-processing and generation speed, like llama-bench."""
import json
import statistics
import sys
import time

import numpy as np

from .loadargs import add_load_args, add_speculation_args, load_model, load_speculation
from ..errors import ConfigError


def configure(p):
    p.description = ("Prompt processing: one batch of -p random tokens. "
                     "Generation: -n tokens one at a time from an empty context. "
                     "Each is repeated -r times after a short warm-up; mean and spread are printed.")
    add_load_args(p)
    p.add_argument("-p", "--n-prompt", type=int, default=512, metavar="N",
                   help="prompt tokens evaluated in one batch (pp test; 0 skips it; default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, metavar="N",
                   help="tokens generated one at a time (tg test; 0 skips it; default 128)")
    p.add_argument("-d", "--n-depth", type=int, default=0, metavar="N",
                   help="tokens already in the context when each test starts (llama-bench's -d; "
                        "evaluated once, not timed; default 0)")
    p.add_argument("-r", "--repetitions", type=int, default=5, metavar="R",
                   help="timed runs of each test after the warm-up (default 5)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--profile", action="store_true",
                   help="also print time per op kind for one token and for one prompt batch")
    add_speculation_args(p)
    p.add_argument("-f", "--file", metavar="FILE", default=None,
                   help="with --lookup/--draft: the prompt (a text file) -n tokens are generated "
                        "from, greedy, with and without speculation (default: a short built-in one)")
    p.set_defaults(func=run)


# What speculation is measured on without -f: a reply that copies its prompt with one change.
SPEC_PROMPT = ('Record: {"id": 4521, "name": "pump station 7", "status": "running", '
               '"pressure_bar": 3.2, "flow_lpm": 118, "last_service": "2026-03-14", '
               '"operator": "M. Keller"}\nThe same record with status "stopped":\nRecord: {"id": 4521,')


def _tokens(m, n, rng):
    return rng.integers(0, m.n_vocab, size=n).tolist()


def run_bench(m, n_prompt, n_gen, reps, n_depth=0):
    rng = np.random.default_rng(0)
    s = m.session(n_ctx=n_depth + max(n_prompt, n_gen, 1))
    if n_depth:
        s.eval(_tokens(m, n_depth, rng))  # the context each test starts from
    at = f"@d{n_depth}" if n_depth else ""
    results = []
    for name, n in (("pp", n_prompt), ("tg", n_gen)):
        if n <= 0:
            continue
        times = []
        for r in range(reps + 1):  # the first run is a short warm-up (pages in the weights)
            toks = _tokens(m, n if r else min(n, 16 if name == "pp" else 4), rng)
            s.truncate(n_depth)
            t0 = time.perf_counter()
            if name == "pp":
                s.eval(toks)
            else:
                for t in toks:
                    s.eval([t])
            dt = time.perf_counter() - t0
            if r:
                times.append(len(toks) / dt)
        results.append({"test": f"{name}{n}{at}", "n": n, "tps_mean": statistics.mean(times),
                        "tps_stdev": statistics.stdev(times) if len(times) > 1 else 0.0,
                        "samples": times})
    s.close()
    return results


def run_speculative(m, spec, prompt, n_gen, reps):
    """Greedy generation of n_gen tokens from prompt, without and with speculation, reps timed
    runs each after a warm-up, interleaved: [plain result, speculative result]; the speculative
    one carries drafted, accepted, acceptance and whether the tokens were the same."""
    ids = m.tokenizer.encode(prompt, parse_special=True)    # as llama.cpp's -f: control tokens
    s = m.session(n_ctx=len(ids) + n_gen + 1)
    mode = spec.mode
    runs = {"plain": [], mode: []}
    toks, st = {}, {}
    for r in range(reps + 1):
        for name, sp in (("plain", None), (mode, spec)):
            s.reset()                       # the prompt is evaluated again, not timed
            st = {}
            toks[name] = [o.token for o in s.generate(ids, max_tokens=n_gen, stats=st, speculative=sp)]
            if r:
                runs[name].append((st["n_gen"] / st["gen_ms"] * 1000 if st["gen_ms"] else 0.0, st))
    s.close()
    out = []
    for name, rs in runs.items():
        tps = [t for t, _ in rs]
        res = {"test": f"tg{n_gen} {name}", "n": n_gen, "tps_mean": statistics.mean(tps),
               "tps_stdev": statistics.stdev(tps) if len(tps) > 1 else 0.0, "samples": tps}
        if name != "plain":
            drafted = sum(x["n_drafted"] for _, x in rs)
            accepted = sum(x["n_accepted"] for _, x in rs)
            res.update(drafted=drafted, accepted=accepted,
                       acceptance=accepted / drafted if drafted else 0.0,
                       speedup=res["tps_mean"] / out[0]["tps_mean"] if out[0]["tps_mean"] else 0.0,
                       same_tokens=toks[name] == toks["plain"])
        out.append(res)
    return out


def run(args):
    m = load_model(args)
    draft = None
    try:
        if args.n_depth < 0:
            raise ConfigError(f"--n-depth {args.n_depth}: must be >= 0")
        if args.lookup or args.draft:
            prompt = SPEC_PROMPT
            if args.file:
                with open(args.file, encoding="utf-8") as f:
                    prompt = f.read()
            spec, draft = load_speculation(args, m, len(m.tokenizer.encode(prompt, parse_special=True)) + args.n_gen + 1)
            res = run_speculative(m, spec, prompt, max(args.n_gen, 1), max(1, args.repetitions))
        else:
            res = run_bench(m, args.n_prompt, args.n_gen, max(1, args.repetitions), args.n_depth)
        prof = m.backend.profile(args.n_prompt) if args.profile and hasattr(m.backend, "profile") \
            else None
        info = {"model": args.model, "arch": m.arch, "backend": m.backend_name,
                "threads": m.n_threads, "cache_type_k": m.cache.names[0],
                "cache_type_v": m.cache.names[1], "results": res}
        if prof is not None:
            info["profile"] = prof
        if args.json:
            json.dump(info, sys.stdout, indent=1)
            print()
            return 0
        print(f"| model | backend | threads | KV cache | test | t/s |")
        print(f"| --- | --- | ---: | --- | ---: | ---: |")
        for r in res:
            extra = (f" (accepted {r['accepted']}/{r['drafted']} = {100 * r['acceptance']:.1f}%, "
                     f"{r['speedup']:.2f}x{'' if r['same_tokens'] else ', TOKENS DIFFER'})") if "drafted" in r else ""
            print(f"| {m.arch} {m.path.rsplit('/', 1)[-1]} | {m.backend_name} | {m.n_threads} | "
                  f"{m.cache} | {r['test']} | {r['tps_mean']:.2f} ± {r['tps_stdev']:.2f}{extra} |")
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
        if draft is not None:
            draft.close()
        m.close()
    return 0
