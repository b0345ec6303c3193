"""`edged synth`: make a random-weight model of a real shape, for benchmarks and demos."""
import os
import sys
import time

from ..format.synth import MIXES, SHAPES, synth
from .progress import bar


def configure(p):
    p.description = ("Random weights, real shapes and vocabulary size, quantized by "
                     "edged's own quantizer with llama.cpp's type mix. For benchmarks; the text "
                     "such a model generates is random.")
    p.add_argument("--shape", required=True, choices=sorted(SHAPES),
                   help="architecture and size to imitate: " + ", ".join(sorted(SHAPES)))
    p.add_argument("--type", default="Q4_K_M", choices=list(MIXES),
                   help="quantization mix of the weights (default Q4_K_M)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    p.add_argument("out", metavar="OUT.gguf", help="file to write")
    p.set_defaults(func=run)


def run(args):
    t0 = time.perf_counter()

    with bar(f"synth {args.shape}", unit="layer") as b:
        def progress(i, n):
            b.total = n
            b.update(i - b.n)

        n = synth(args.shape, args.type, args.out, seed=args.seed, progress=progress)
    size = os.path.getsize(args.out)
    print(f"edged synth: wrote {args.out}: {args.shape} {args.type}, {n / 1e6:.1f} M parameters, "
          f"{size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
