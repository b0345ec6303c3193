#!/usr/bin/env python3
"""Image encode time and peak memory per projector type, edged against llama.cpp's libmtmd,
on the same mmproj file, the same picture and the same thread count.

    python tools/bench_vision.py --teacher /path/to/mtmd_teacher -t 2 -r 3

The mmproj files are edged's synthesiser's real shapes (`edged synth --mmproj`: gemma3 =
gemma-3-4b's SigLIP-so400m at 896 px, smolvlm = SmolVLM-256M's SigLIP-base tiles of 512 px,
llava-1.5 = llava-v1.5-7b's CLIP ViT-L/14 at 336 px), F16 as the converter writes them, with
random weights (the work per image does not depend on them). libmtmd needs a text model of the
projector's output width: a one-layer llama of that width (its weights are mapped but never
read: a timing run of tools/mtmd_teacher.cpp evaluates no prompt).

Each round runs each side in a fresh process, alternating: the file loaded, one encode to
warm up, one timed (llama.cpp: mtmd_encode_chunk, its preprocessing included; edged:
Projector.encode, its preprocessing included, from the same decoded RGB pixels). Reported:
median encode seconds over the rounds, the ratio (llama.cpp's time / edged's: > 1 is edged
faster), and each side's peak RSS (the process's, from wait4).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CASES = ("smolvlm", "llava-1.5", "gemma3")

EDGED_ENCODE = r"""
import sys, time, numpy as np
from edged.engine.vision import Projector
path, raw, w, h, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
img = np.fromfile(raw, np.uint8).reshape(h, w, 3)
with Projector.load(path, n_threads=threads) as p:
    p.encode(img)
    t0 = time.perf_counter()
    p.encode(img)
    print("encode_ms %.1f" % ((time.perf_counter() - t0) * 1000))
"""


def picture(w, h):
    """Colour bands with noise (every resize weight matters), as the goldens' picture."""
    rng = np.random.default_rng(1)
    base = np.add.outer(np.arange(h), np.arange(w))[:, :, None] * np.array([1, 2, 3])
    return (base % 256).astype(np.uint8) ^ rng.integers(0, 32, (h, w, 3), dtype=np.uint8)


def text_model(n_embd, out):
    """A one-layer llama of width n_embd (libmtmd checks the projector's output width)."""
    from edged.format import synth
    name = f"bench-text-{n_embd}"
    synth.SHAPES[name] = {"arch": "llama", "n_embd": n_embd, "n_head": n_embd // 128,
                          "n_head_kv": n_embd // 128, "n_ff": 256, "n_layer": 1, "n_vocab": 4096,
                          "rope_freq_base": 10000.0, "rms_eps": 1e-5, "n_ctx_train": 2048,
                          "tied": True, "qkv_bias": False}
    synth.synth(name, "F16", out)


def run(cmd, env=None):
    """(encode seconds, peak RSS bytes) of one process printing 'encode_ms X'."""
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                             env=dict(os.environ, **(env or {})))
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = out + err.read()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}):\n{text[-2000:]}")
    ms = [float(line.split()[1]) for line in text.splitlines() if line.startswith("encode_ms")]
    return ms[-1] / 1000, usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", required=True, help="tools/mtmd_teacher.cpp, built")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--size", default="640x480", help="the picture, WxH (default 640x480)")
    ap.add_argument("--flash", action="store_true", help="llama.cpp with flash attention (auto)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "edged-bench-vision"),
                    help="where the synthesised files are kept between runs")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args()
    from edged.format.synth import MMPROJ_SHAPES, synth_mmproj
    os.makedirs(a.work, exist_ok=True)
    w, h = (int(x) for x in a.size.split("x"))
    raw = os.path.join(a.work, f"picture-{w}x{h}.rgb")
    picture(w, h).tofile(raw)
    env = {"MTMD_THREADS": str(a.threads), "MTMD_REPEAT": "1", "MTMD_FLASH": "1" if a.flash else "0"}
    rows = []
    for case in a.cases:
        mmproj = os.path.join(a.work, f"mmproj-{case}-F16.gguf")
        if not os.path.exists(mmproj):
            synth_mmproj(case, mmproj, "F16", seed=0)
        n_text = MMPROJ_SHAPES[case]["n_embd_text"]
        model = os.path.join(a.work, f"text-{n_text}.gguf")
        if not os.path.exists(model):
            text_model(n_text, model)
        ours, theirs = [], []
        for _ in range(a.rounds):
            theirs.append(run([a.teacher, mmproj, model, raw, str(w), str(h), os.devnull,
                               "<__media__>"], env))
            ours.append(run([sys.executable, "-c", EDGED_ENCODE, mmproj, raw, str(w), str(h),
                             str(a.threads)]))
        e, l = statistics.median(t for t, _ in ours), statistics.median(t for t, _ in theirs)
        rows.append((case, e, l, max(m for _, m in ours), max(m for _, m in theirs)))
        print(f"{case}: edged {e:.2f} s, llama.cpp {l:.2f} s, ratio {l / e:.2f}x; peak RSS "
              f"edged {rows[-1][3] >> 20} MiB, llama.cpp {rows[-1][4] >> 20} MiB "
              f"(rounds: edged {[round(t, 2) for t, _ in ours]}, llama.cpp {[round(t, 2) for t, _ in theirs]})",
              flush=True)
    print(f"\n| projector ({a.size}, {a.threads} thread{'s' * (a.threads > 1)}) | edged s | llama.cpp s "
          f"| ratio | edged peak MiB | llama.cpp peak MiB |\n|---|---|---|---|---|---|")
    for case, e, l, me, ml in rows:
        print(f"| {case} | {e:.2f} | {l:.2f} | {l / e:.2f}x | {me >> 20} | {ml >> 20} |")
    print(f"\n{time.strftime('%Y-%m-%d')}, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
