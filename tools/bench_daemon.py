#!/usr/bin/env python3
"""Daemon benchmarks against a real `edged serve` on a temporary socket.

    tools/bench_daemon.py --model A.gguf --model2 B.gguf [-t THREADS] [-r REPEATS] [-n TOKENS]

1. Swap latency: with max_loaded_models = 1 and A loaded, a streamed request for B, from
   sending it to its first token, split into signature check, mapping/validation and warm-up
   (the daemon's own timings from GET /v1/models). Run cold (first verification of B) and warm
   (B verified before: the verification cache skips re-hashing an unchanged file).
2. Aggregate generation speed: 1 stream vs 4 concurrent streams (n_parallel = 4, decoded
   together by continuous batching), tokens/s summed over streams, in interleaved rounds;
   also tokens per CPU second of the daemon process (the figure a shared machine's load does
   not move much, with -t 1).

Both files are copied to a temporary model directory and signed with a throwaway key.
"""
import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def start(tmp, models_dir, keys, extra):
    sock = os.path.join(tmp, f"edged-{time.monotonic_ns()}.sock")
    cfg = os.path.join(tmp, "edged.toml")
    lines = {"socket": sock, "models_dir": models_dir, "trusted_keys": keys, "socket_group": "",
             "sandbox": "off", "log_level": "warning", **extra}
    with open(cfg, "w") as f:
        f.write("".join(f"{k} = {json.dumps(v)}\n" for k, v in lines.items()))
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", cfg], env=env, cwd=ROOT)
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


def bench_parallel(tmp, models_dir, keys, args):
    proc, sock = start(tmp, models_dir, keys, {"default_model": "a", "n_parallel": 4, "threads": args.threads,
                                               "ctx_size": 512, "max_queue": 16})
    out = {}
    try:
        def cpu_seconds():                  # the daemon's user + system time
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        async def run(k):
            async with session(sock) as s:
                # warm: every slot this run uses has had a request (its KV cache mapped)
                await asyncio.gather(*(stream(s, "a", 4, 99) for _ in range(k)))
                t0, c0 = time.perf_counter(), cpu_seconds()
                res = await asyncio.gather(*(stream(s, "a", args.tokens, i, args.temperature)
                                             for i in range(k)))
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model2", required=True)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-n", "--tokens", type=int, default=32)
    ap.add_argument("--only", choices=("swap", "parallel"))
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="of the throughput requests (0: greedy, no sampling cost)")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from edged.trust.sign import generate_key, public_pem, sign_file

    tmp = tempfile.mkdtemp(prefix="edged-bench-")
    try:
        os.chmod(tmp, 0o755)
        models_dir, keys = os.path.join(tmp, "models"), os.path.join(tmp, "keys")
        os.mkdir(models_dir, 0o755)
        os.mkdir(keys, 0o755)
        key = generate_key(2048)
        with open(os.path.join(keys, "bench.pem"), "wb") as f:
            f.write(public_pem(key))
        for name, src in (("a", args.model), ("b", args.model2)):
            dst = os.path.join(models_dir, name + ".gguf")
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o644)
            sign_file(dst, key)
        if args.only in (None, "swap"):
            bench_swap(tmp, models_dir, keys, args)
        if args.only in (None, "parallel"):
            bench_parallel(tmp, models_dir, keys, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
