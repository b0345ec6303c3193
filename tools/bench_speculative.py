"""Speculative decoding against plain decoding and llama.cpp's lookup decoding, per workload.

For each prompt file (default: tests/data/speculative/*.txt) it runs `edged bench --lookup -f
FILE --json` (plain and lookup generation, greedy, interleaved; acceptance; whether the tokens
agree) and, with --llama DIR, llama.cpp's `llama-lookup` and `llama-completion` (plain) on the
same file, model and threads, and prints one Markdown table (--json: the rows).

    python tools/bench_speculative.py -m ../shared/testdata/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        -t 2 -n 128 -r 3 --llama /path/to/llama.cpp/build/bin
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def edged(args, path):
    cmd = [sys.executable, "-m", "edged", "bench", "-m", args.model, "-t", str(args.threads),
           "-n", str(args.n), "-r", str(args.reps), "--lookup", "--draft-max", str(args.draft_max),
           "-f", path, "--json"]
    if args.draft:
        cmd[cmd.index("--lookup")] = "--draft"
        cmd.insert(cmd.index("--draft") + 1, args.draft)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    plain, spec = json.loads(out.stdout)["results"]
    return plain, spec


def _llama(args, tool, path, extra):
    cmd = [os.path.join(args.llama, tool), "-m", args.model, "-f", path, "-n", str(args.n),
           "-t", str(args.threads), "--temp", "0", "-c", "2048", *extra]
    runs = []
    for _ in range(args.reps):
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
        runs.append({"tps": tps, "acceptance": float(acc.group(1)) / 100 if acc else None})
    runs.sort(key=lambda r: r["tps"])
    return runs[len(runs) // 2]             # the median run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", type=int, default=128, help="tokens generated per run")
    p.add_argument("-r", "--reps", type=int, default=3)
    p.add_argument("--draft-max", type=int, default=10)
    p.add_argument("--draft", metavar="FILE", help="measure a draft model instead of lookup")
    p.add_argument("--llama", metavar="DIR", help="llama.cpp's build/bin (llama-lookup, llama-completion)")
    p.add_argument("files", nargs="*", help="prompt files (default: tests/data/speculative/*.txt)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    files = args.files or sorted(glob.glob(os.path.join(ROOT, "tests", "data", "speculative", "*.txt")))
    rows = []
    for path in files:
        plain, spec = edged(args, path)
        row = {"workload": os.path.splitext(os.path.basename(path))[0], "plain_tps": plain["tps_mean"],
               "spec_tps": spec["tps_mean"], "acceptance": spec["acceptance"], "speedup": spec["speedup"],
               "same_tokens": spec["same_tokens"]}
        if args.llama and not args.draft:
            lp = _llama(args, "llama-completion", path, ["-no-cnv"])
            ll = _llama(args, "llama-lookup", path, ["--spec-draft-n-max", str(args.draft_max)])
            row.update(llama_plain_tps=lp["tps"], llama_lookup_tps=ll["tps"],
                       llama_acceptance=ll["acceptance"])
        rows.append(row)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    llama = any("llama_lookup_tps" in r for r in rows)
    print("| workload | edged plain t/s | edged lookup t/s | speed-up | accepted | same tokens |"
          + (" llama.cpp plain t/s | llama-lookup t/s | accepted |" if llama else ""))
    print("| --- | ---: | ---: | ---: | ---: | --- |" + (" ---: | ---: | ---: |" if llama else ""))
    for r in rows:
        line = (f"| {r['workload']} | {r['plain_tps']:.1f} | {r['spec_tps']:.1f} | {r['speedup']:.2f}x | "
                f"{100 * r['acceptance']:.0f}% | {'yes' if r['same_tokens'] else 'NO'} |")
        if "llama_lookup_tps" in r:
            acc = r["llama_acceptance"]
            line += (f" {r['llama_plain_tps']:.1f} | {r['llama_lookup_tps']:.1f} | "
                     f"{'-' if acc is None else f'{100 * acc:.0f}%'} |")
        print(line)


if __name__ == "__main__":
    main()
