"""Speculative decoding against plain decoding and llama.cpp's lookup decoding, per workload.

For each prompt file (default: tests/data/speculative/*.txt), -r times, each time once the
machine's 1-minute load is below --max-load (it waits up to --wait seconds, then measures anyway
and says so): `edged bench --lookup -f FILE -r 1 --json` (one plain and one speculative greedy
run, interleaved, after a warm-up of each; acceptance; whether the tokens agree) and, with
--llama DIR, llama.cpp's `llama-completion` (plain) and `llama-lookup` on the same file, model
and threads. Prints one Markdown table of medians (--json: the rows with every sample).
With --draft FILE the speculative runs use that draft model instead of lookup (no llama.cpp).

    python tools/bench_speculative.py -m ../shared/testdata/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        -t 1 -n 128 -r 5 --llama /path/to/llama.cpp/build/bin
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quiet_enough(args):
    """Wait until the 1-minute load is below --max-load (at most --wait s); the load then."""
    t_end = time.monotonic() + args.wait
    while os.getloadavg()[0] >= args.max_load and time.monotonic() < t_end:
        time.sleep(5)
    return os.getloadavg()[0]


def edged(args, path):
    """One interleaved plain + speculative pair: (plain t/s, speculative t/s, its stats)."""
    cmd = [sys.executable, "-m", "edged", "bench", "-m", args.model, "-t", str(args.threads),
           "-n", str(args.n), "-r", "1", "--draft-max", str(args.draft_max), "-f", path, "--json"]
    cmd += ["--draft", args.draft] if args.draft else ["--lookup"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    plain, spec = json.loads(out.stdout)["results"]
    return plain["samples"][0], spec["samples"][0], spec


def llama(args, tool, path, extra):
    """One run of a llama.cpp tool: (t/s of its generation, acceptance or None)."""
    cmd = [os.path.join(args.llama, tool), "-m", args.model, "-f", path, "-n", str(args.n),
           "-t", str(args.threads), "--temp", "0", "-c", "2048", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    text = r.stdout + r.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", text)
    if m:
        tps = int(m.group(1)) / float(m.group(2))
    else:
        m = re.search(r"(?<!prompt )eval time =\s+([0-9.]+) ms /\s+(\d+) (?:runs|tokens)", text)
        if not m:
            raise SystemExit(f"{tool}: no timing in its output:\n{text[-2000:]}")
        tps = int(m.group(2)) / float(m.group(1)) * 1000
    acc = re.search(r"accept\s+=\s+([0-9.]+)%", text)
    return tps, float(acc.group(1)) / 100 if acc else None


def measure(args, path):
    s = {"plain": [], "spec": [], "ratio": [], "load": []}
    drafted = accepted = 0
    same = True
    for _ in range(args.reps):
        s["load"].append(quiet_enough(args))
        plain, spec, st = edged(args, path)
        s["plain"].append(plain)
        s["spec"].append(spec)
        s["ratio"].append(spec / plain)
        drafted, accepted, same = drafted + st["drafted"], accepted + st["accepted"], same and st["same_tokens"]
        if args.llama and not args.draft:
            lp, _ = llama(args, "llama-completion", path, ["-no-cnv"])
            ll, lacc = llama(args, "llama-lookup", path, ["--spec-draft-n-max", str(args.draft_max)])
            s.setdefault("llama_plain", []).append(lp)
            s.setdefault("llama_lookup", []).append(ll)
            s.setdefault("llama_ratio", []).append(ll / lp)
            s.setdefault("llama_acceptance", []).append(lacc)
            s.setdefault("vs_llama_lookup", []).append(spec / ll)
    row = {"workload": os.path.splitext(os.path.basename(path))[0], "samples": s,
           "acceptance": accepted / drafted if drafted else 0.0, "same_tokens": same,
           "max_load": max(s["load"])}
    for k, v in s.items():
        if k not in ("load", "llama_acceptance"):
            row[k] = statistics.median(v)
    if "llama_acceptance" in s and None not in s["llama_acceptance"]:
        row["llama_acceptance"] = statistics.median(s["llama_acceptance"])
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("-n", type=int, default=128, help="tokens generated per run")
    p.add_argument("-r", "--reps", type=int, default=5)
    p.add_argument("--draft-max", type=int, default=10)
    p.add_argument("--draft", metavar="FILE", help="measure a draft model instead of lookup")
    p.add_argument("--llama", metavar="DIR", help="llama.cpp's build/bin (llama-lookup, llama-completion)")
    p.add_argument("--max-load", type=float, default=1.2, help="measure when the 1-minute load is below this")
    p.add_argument("--wait", type=float, default=300, help="seconds to wait for it before measuring anyway")
    p.add_argument("files", nargs="*", help="prompt files (default: tests/data/speculative/*.txt)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    files = args.files or sorted(glob.glob(os.path.join(ROOT, "tests", "data", "speculative", "*.txt")))
    rows = [measure(args, path) for path in files]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        table(rows, "draft" if args.draft else "lookup")


def table(rows, mode):
    """The rows of measure() as one Markdown table of medians."""
    llama_cols = any("llama_lookup" in r for r in rows)
    print(f"| workload | edged plain t/s | edged {mode} t/s | speed-up | accepted | same tokens |"
          + (" llama.cpp plain t/s | llama-lookup t/s | speed-up | accepted | edged/llama lookup |"
             if llama_cols else "") + " max load |")
    print("| --- | ---: | ---: | ---: | ---: | --- |" + (" ---: | ---: | ---: | ---: | ---: |" if llama_cols else "")
          + " ---: |")
    for r in rows:
        line = (f"| {r['workload']} | {r['plain']:.1f} | {r['spec']:.1f} | {r['ratio']:.2f}x | "
                f"{100 * r['acceptance']:.0f}% | {'yes' if r['same_tokens'] else 'NO'} |")
        if "llama_lookup" in r:
            acc = r.get("llama_acceptance")
            line += (f" {r['llama_plain']:.1f} | {r['llama_lookup']:.1f} | {r['llama_ratio']:.2f}x | "
                     f"{'-' if acc is None else f'{100 * acc:.0f}%'} | {r['vs_llama_lookup']:.2f}x |")
        print(line + f" {r['max_load']:.2f} |")


if __name__ == "__main__":
    main()
