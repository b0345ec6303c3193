#!/usr/bin/env python3
"""Daemon benchmarks against a real `edged serve` on a temporary socket.

    tools/bench_daemon.py --model A.gguf --model2 B.gguf [-t THREADS] [-r REPEATS] [-n TOKENS]
    tools/bench_daemon.py --model A.gguf --only mixed [--long 2000] [--root CHECKOUT ...]
                          [--set decode_latency_budget=3] [--debug-steps]

1. Swap latency: with max_loaded_models = 1 and A loaded, a streamed request for B, from
   sending it to its first token, split into signature check, mapping/validation and warm-up
   (the daemon's own timings from GET /v1/models). Run cold (first verification of B) and warm
   (B verified before: the verification cache skips re-hashing an unchanged file).
2. Aggregate generation speed: 1 stream vs 4 concurrent streams (n_parallel = 4, decoded
   together by continuous batching), tokens/s summed over streams, in interleaved rounds;
   also tokens per CPU second of the daemon process (the figure a shared machine's load does
   not move much, with -t 1).

3. Mixed load (--only mixed): three greedy streams decode (n_parallel = 4) while a prompt
   of --long tokens arrives. Reports the long prompt's time to first token (and alone, with
   no streams running), and the gaps between tokens of the three streams: p50 while they
   decode undisturbed, p50/p99/max while the long prompt is absorbed, p50 undisturbed again
   after it (the streams have grown meanwhile: their own attention reads more keys), and p99
   (absorbing) over p50 undisturbed before and after; and each gap while absorbing over the
   stream's undisturbed gap at that moment (interpolated in time between the p50 before and
   the p50 after: the streams grow meanwhile), p50 and p99, the figure a stalled stream shows. --root runs the daemon from
   another checkout of edged (give it several times to compare code versions in
   interleaved rounds, so the shared machine's load hits each the same). Then the idle
   daemon's CPU seconds over 10 s (no spinning workers after the last request).
   --set KEY=VALUE adds a key to the daemons' configuration (e.g. the mixed-load policy's
   decode_latency_budget); --debug-steps has the daemon log every pass (EDGED_DEBUG_STEPS=1,
   log_level debug) to its stderr.

Both files are copied to a temporary model directory and signed with a throwaway key.
"""
import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def start(tmp, models_dir, keys, extra, root=ROOT, env=None):
    sock = os.path.join(tmp, f"edged-{time.monotonic_ns()}.sock")
    cfg = os.path.join(tmp, "edged.toml")
    lines = {"socket": sock, "models_dir": models_dir, "trusted_keys": keys, "socket_group": "",
             "sandbox": "off", "log_level": "warning", **extra}
    with open(cfg, "w") as f:
        f.write("".join(f"{k} = {json.dumps(v)}\n" for k, v in lines.items()))
    env = dict(os.environ, PYTHONPATH=root, OPENBLAS_NUM_THREADS="1", **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", cfg], env=env, cwd=root)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if os.path.exists(sock):
            try:
                if asyncio.run(get(sock, "/health"))[0] == 200:
                    return proc, sock
            except OSError:
                pass
        if proc.poll() is not None:
            sys.exit("daemon exited during start-up")
        time.sleep(0.2)
    sys.exit("daemon not ready")


def signed_models(tmp, models, key=None):
    """(models dir, trusted-keys dir) under tmp: each of models {NAME: source file} (None: left
    out) copied to NAME.gguf and signed by `key`, a new throwaway key by default."""
    sys.path.insert(0, ROOT)
    from edged.trust.sign import generate_key, public_pem, sign_file
    models_dir, keys = os.path.join(tmp, "models"), os.path.join(tmp, "keys")
    os.makedirs(models_dir, 0o755, exist_ok=True)
    os.makedirs(keys, 0o755, exist_ok=True)
    if key is None:
        key = generate_key(2048)
        with open(os.path.join(keys, "bench.pem"), "wb") as f:
            f.write(public_pem(key))
    for name, src in models.items():
        if src is None:
            continue
        dst = os.path.join(models_dir, name + ".gguf")
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o644)
        sign_file(dst, key)
    return models_dir, keys


def session(sock):
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock, limit=0),
                                 timeout=aiohttp.ClientTimeout(total=3600))


async def get(sock, path):
    async with session(sock) as s, s.get("http://edged" + path) as r:
        return r.status, await r.json()


async def post(sock, path, body):
    async with session(sock) as s, s.post("http://edged" + path, json=body) as r:
        return r.status, await r.json()


async def stream(s, model, n, seed, temperature=0.8):
    """(seconds to first token, tokens, seconds of generation after the first token)."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": n, "temperature": temperature,
            "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    usage = None
    async with s.post("http://edged/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if first is None and ev["choices"] and ev["choices"][0]["text"]:
                first = time.perf_counter()
            if ev.get("usage"):
                usage = ev["usage"]
    end = time.perf_counter()
    first = first or end
    return first - t0, usage["completion_tokens"], end - first, end - t0


def bench_swap(tmp, models_dir, keys, args):
    proc, sock = start(tmp, models_dir, keys, {"default_model": "a", "max_loaded_models": 1,
                                               "pin_default_model": False, "threads": args.threads,
                                               "ctx_size": 512})
    rows = []
    try:
        async def once(name):
            async with session(sock) as s:
                ttft, *_ = await stream(s, name, 4, 0)
            _, listing = await get(sock, "/v1/models")
            t = {m["id"]: m for m in listing["data"]}[name]["load_seconds"]
            return ttft, t

        for i in range(args.repeats):
            for name in ("b", "a"):
                ttft, t = asyncio.run(once(name))
                rows.append((name, i, ttft, t))
                print(f"swap -> {name} (round {i}): first token after {ttft * 1e3:.0f} ms; verify "
                      f"{t['verify'] * 1e3:.0f} ms, map/validate {t['map'] * 1e3:.0f} ms, warm-up "
                      f"{t['warmup'] * 1e3:.0f} ms, load total {t['total'] * 1e3:.0f} ms", flush=True)
    finally:
        proc.terminate()
        proc.wait()
    return rows


def cpu_seconds(pid):
    """User + system CPU seconds of process pid so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_parallel(tmp, models_dir, keys, args):
    proc, sock = start(tmp, models_dir, keys, {"default_model": "a", "n_parallel": 4, "threads": args.threads,
                                               "ctx_size": 512, "max_queue": 16})
    out = {}
    try:
        async def run(k):
            async with session(sock) as s:
                # warm: every slot this run uses has had a request (its KV cache mapped)
                await asyncio.gather(*(stream(s, "a", 4, 99) for _ in range(k)))
                t0, c0 = time.perf_counter(), cpu_seconds(proc.pid)
                res = await asyncio.gather(*(stream(s, "a", args.tokens, i, args.temperature)
                                             for i in range(k)))
                wall, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0
            n = sum(r[1] for r in res)
            return n / wall, n / cpu, res

        out, per_cpu = {1: [], 4: []}, {1: [], 4: []}
        for i in range(args.repeats):       # interleaved: the shared machine's load hits both
            for k in (1, 4):
                tps, tpc, res = asyncio.run(run(k))
                out[k].append(tps)
                per_cpu[k].append(tpc)
            print(f"round {i}: 1 stream {out[1][-1]:.1f}, 4 streams {out[4][-1]:.1f} tokens/s "
                  f"({out[4][-1] / out[1][-1]:.2f}x); per daemon CPU second {per_cpu[1][-1]:.1f} "
                  f"and {per_cpu[4][-1]:.1f} ({per_cpu[4][-1] / per_cpu[1][-1]:.2f}x)", flush=True)
        for k in (1, 4):
            print(f"{k} stream(s): aggregate {statistics.mean(out[k]):.1f} tokens/s "
                  f"(runs: {', '.join(f'{x:.1f}' for x in out[k])})", flush=True)
        ratios = [b / a for a, b in zip(out[1], out[4])]
        print(f"4 vs 1 stream aggregate ratio: {statistics.mean(out[4]) / statistics.mean(out[1]):.2f}x "
              f"(per round: {', '.join(f'{r:.2f}' for r in ratios)}; median "
              f"{statistics.median(ratios):.2f}x)")
        cpu_ratios = [b / a for a, b in zip(per_cpu[1], per_cpu[4])]
        print(f"per daemon CPU second (with -t 1 independent of the machine's other load): median "
              f"{statistics.median(cpu_ratios):.2f}x ({', '.join(f'{r:.2f}' for r in cpu_ratios)})")
    finally:
        proc.terminate()
        proc.wait()
    return out


def pct(xs, q):
    """The q-th percentile (nearest rank) of xs."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]


async def timed_stream(s, body, stamps, stop):
    """Stream `body`, appending the arrival time of each text chunk to `stamps`, until the
    reply ends or `stop` is set (the client then goes away: the daemon cancels the job)."""
    async with s.post("http://edged/v1/completions", json=dict(body, stream=True)) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                ev = json.loads(line[6:])
                if ev["choices"] and ev["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
            if stop.is_set():
                break


def stall_of(gaps, t_span, steady, after):
    """Each gap while the prompt is absorbed (gaps: [(gap, seconds after the prompt was sent)])
    over the stream's undisturbed gap at that moment: a stream's own pass grows with its length
    (attention over its keys) and the streams keep decoding for the whole absorption, so the
    undisturbed gap is interpolated linearly in time between its p50 before the prompt arrived
    and its p50 after the prompt was done (t_span seconds after it was sent). A value of 1 is no
    slowdown at all; the p99 of these is what a stalled stream shows."""
    if not steady or not after:
        return []
    u0, u1 = statistics.median(steady), statistics.median(after)
    span = max(t_span, 1e-9)
    return [g / (u0 + (u1 - u0) * min(max(t / span, 0.0), 1.0)) for g, t in gaps]


def bench_mixed(tmp, models_dir, keys, args):
    """Three streams decoding while a long prompt arrives, per checkout in --root, interleaved."""
    from edged.format.gguf import GGUFFile
    from edged.text.tokenizer import Tokenizer
    with GGUFFile.open(args.model) as f:
        tok = Tokenizer.from_gguf_file(f)
    text = ("The old lighthouse keeper climbed the stairs every evening, counting the steps and "
            "listening to the sea below, and wrote what he saw in a small blue book. ")
    unit = tok.encode(text, add_special=False)
    long_ids = (unit * (args.long // len(unit) + 1))[:args.long]
    no_eos = {str(t): -100 for t in tok.eog_ids}      # the streams must outlast the prompt
    shorts = ["Once upon a time", "The little dog ran", "In a small village by the sea"]
    roots = args.root or [ROOT]
    results = {r: [] for r in roots}

    async def scenario(sock):
        async with session(sock) as s:
            # warm: the slots have had a request; the long prompt alone, no other stream
            await asyncio.gather(*(stream(s, "a", 4, 99) for _ in range(3)))
            t0 = time.perf_counter()
            st = []
            await timed_stream(s, {"model": "a", "prompt": long_ids, "max_tokens": 2, "temperature": 0},
                               st, asyncio.Event())
            alone = st[0] - t0
            stop = asyncio.Event()
            stamps = [[] for _ in shorts]
            tasks = [asyncio.create_task(timed_stream(
                s, {"model": "a", "prompt": p, "max_tokens": args.ctx - 64, "temperature": 0,
                    "logit_bias": no_eos}, stamps[i], stop)) for i, p in enumerate(shorts)]
            while min(len(x) for x in stamps) < args.steady:
                await asyncio.sleep(0.01)
            t_send = time.perf_counter()
            lt = []
            await timed_stream(s, {"model": "a", "prompt": long_ids, "max_tokens": 2, "temperature": 0},
                               lt, asyncio.Event())
            t_first, t_done = lt[0], lt[-1]
            n_after = [len(x) for x in stamps]
            # 24 more tokens of each stream, undisturbed again at the length they reached (unless
            # the streams ended first: a slow model's long prompt can outlast their max_tokens)
            while (min(len(x) - n for x, n in zip(stamps, n_after)) < 24
                   and not all(t.done() for t in tasks)):
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        steady, absorbing, after, worst = [], [], [], []
        for x in stamps:
            for a, b in zip(x, x[1:]):
                if b <= t_send:
                    steady.append(b - a)
                elif a < t_first:
                    absorbing.append(b - a)
                    worst.append((b - a, a - t_send))
                elif a > t_done:
                    after.append(b - a)
        return (alone, t_first - t_send, steady, absorbing, after, sorted(worst)[-3:],
                stall_of(worst, t_done - t_send, steady, after))

    for i in range(args.repeats):
        for root in roots:
            extra = {"default_model": "a", "n_parallel": 4, "threads": args.threads,
                     "ctx_size": args.ctx, "max_queue": 16, **dict(args.set)}
            env = None
            if args.debug_steps:
                extra["log_level"], env = "debug", {"EDGED_DEBUG_STEPS": "1"}
            proc, sock = start(tmp, models_dir, keys, extra, root, env)
            try:
                alone, ttft, steady, absorbing, after, worst, stall = asyncio.run(scenario(sock))
                time.sleep(1)
                c0 = cpu_seconds(proc.pid)
                time.sleep(10)
                idle = cpu_seconds(proc.pid) - c0
            finally:
                proc.terminate()
                proc.wait()
            p50s = statistics.median(steady)
            p50a = statistics.median(after) if after else float("nan")
            row = dict(alone=alone, ttft=ttft, p50_steady=p50s, p50_after=p50a, p50=statistics.median(absorbing),
                       p99=pct(absorbing, 99), max=max(absorbing), n=len(absorbing), idle=idle,
                       stall_p50=statistics.median(stall) if stall else float("nan"),
                       stall_p99=pct(stall, 99) if stall else float("nan"))
            results[root].append(row)
            print(f"round {i} [{root}]: {args.long}-token prompt first token after {ttft:.2f} s "
                  f"(alone {alone:.2f} s); gaps of the 3 streams: undisturbed p50 "
                  f"{p50s * 1e3:.0f} ms; while absorbing ({row['n']} gaps) p50 {row['p50'] * 1e3:.0f}, "
                  f"p99 {row['p99'] * 1e3:.0f}, max {row['max'] * 1e3:.0f} ms; undisturbed again after it "
                  f"p50 {p50a * 1e3:.0f} ms; p99/p50 undisturbed {row['p99'] / p50s:.1f}x (before), "
                  f"{row['p99'] / p50a:.1f}x (after); over the undisturbed gap at that length "
                  f"p50 {row['stall_p50']:.1f}x, p99 {row['stall_p99']:.1f}x; longest gaps (ms @ s after the prompt was sent) "
                  f"{', '.join(f'{g * 1e3:.0f} @ {t:.1f}' for g, t in worst)}; idle daemon CPU "
                  f"{idle:.2f} s in 10 s", flush=True)
    for root, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        ratios = [r["p99"] / r["p50_steady"] for r in rows]
        ratios_after = [r["p99"] / r["p50_after"] for r in rows]
        print(f"[{root}] medians of {len(rows)} rounds: time to first token {med['ttft']:.2f} s "
              f"(alone {med['alone']:.2f} s); gap p50 undisturbed {med['p50_steady'] * 1e3:.0f} ms, "
              f"absorbing p50 {med['p50'] * 1e3:.0f} / p99 {med['p99'] * 1e3:.0f} / max "
              f"{med['max'] * 1e3:.0f} ms; gap p50 undisturbed after it {med['p50_after'] * 1e3:.0f} ms; "
              f"p99/p50 before {statistics.median(ratios):.1f}x (rounds: {', '.join(f'{x:.1f}' for x in ratios)}), "
              f"after {statistics.median(ratios_after):.1f}x (rounds: {', '.join(f'{x:.1f}' for x in ratios_after)}); "
              f"gap over the undisturbed gap at that length p50 {med['stall_p50']:.1f}x, p99 "
              f"{med['stall_p99']:.1f}x (rounds: {', '.join('%.1f' % r['stall_p99'] for r in rows)}); "
              f"idle daemon CPU "
              f"{med['idle']:.2f} s in 10 s", flush=True)
    return results


def config_item(text):
    """KEY=VALUE with VALUE in TOML (a number, true/false, "a string") -> (KEY, value)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), tomllib.loads(f"v = {value}")["v"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model2", help="second model (swap benchmark)")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-n", "--tokens", type=int, default=32)
    ap.add_argument("--only", choices=("swap", "parallel", "mixed"))
    ap.add_argument("--long", type=int, default=2000, help="mixed: tokens of the long prompt")
    ap.add_argument("--ctx", type=int, default=2304, help="mixed: ctx_size of the slots")
    ap.add_argument("--steady", type=int, default=12,
                    help="mixed: tokens each stream decodes before the long prompt arrives")
    ap.add_argument("--root", action="append",
                    help="mixed: run the daemon from this checkout (repeat to compare, interleaved)")
    ap.add_argument("--set", action="append", default=[], type=config_item, metavar="KEY=VALUE",
                    help="mixed: a configuration key of the daemon (TOML value), e.g. decode_latency_budget=3")
    ap.add_argument("--debug-steps", action="store_true",
                    help="mixed: the daemon logs every pass to stderr (EDGED_DEBUG_STEPS=1)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="of the throughput requests (0: greedy, no sampling cost)")
    args = ap.parse_args()
    if args.only in (None, "swap") and not args.model2:
        ap.error("the swap benchmark needs --model2 (or choose --only parallel/mixed)")
    tmp = tempfile.mkdtemp(prefix="edged-bench-")
    try:
        os.chmod(tmp, 0o755)
        models_dir, keys = signed_models(tmp, {"a": args.model, "b": args.model2})
        if args.only in (None, "swap"):
            bench_swap(tmp, models_dir, keys, args)
        if args.only in (None, "parallel"):
            bench_parallel(tmp, models_dir, keys, args)
        if args.only == "mixed":
            bench_mixed(tmp, models_dir, keys, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
