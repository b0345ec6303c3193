"""`edged synth`: make a random-weight model of a real shape, for benchmarks and demos."""
import os
import sys
import time


def register(sub):
    from ..format.synth import MIXES, SHAPES
    p = sub.add_parser("synth", help="write a random-weight GGUF model of a known shape",
                       description="Random weights, real shapes and vocabulary size, quantized by "
                       "edged's own quantizer with llama.cpp's type mix. For benchmarks; the text "
                       "such a model generates is random.")
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--type", default="Q4_K_M", choices=list(MIXES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("out", metavar="OUT.gguf")
    p.set_defaults(func=run)


def run(args):
    from ..format.synth import synth
    t0 = time.perf_counter()

    def progress(i, n):
        if sys.stderr.isatty():
            print(f"\redged synth: layer {i}/{n}", end="", file=sys.stderr, flush=True)

    n = synth(args.shape, args.type, args.out, seed=args.seed, progress=progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    size = os.path.getsize(args.out)
    print(f"edged synth: wrote {args.out}: {args.shape} {args.type}, {n / 1e6:.1f} M parameters, "
          f"{size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
