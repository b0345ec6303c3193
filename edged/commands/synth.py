"""`edged synth`: make a random-weight model of a real shape, for benchmarks and demos."""
import os
import sys
import time

from ..errors import ConfigError
from ..format.synth import (ENCODER_SHAPES, MIXES, MMPROJ_SHAPES, SHAPES, synth, synth_encoder,
                            synth_mmproj)
from .progress import bar


def configure(p):
    p.description = ("Random weights, real shapes and vocabulary size, quantized by "
                     "edged's own quantizer with llama.cpp's type mix. For benchmarks; the text "
                     "such a model generates is random.")
    shapes = sorted(SHAPES) + sorted(ENCODER_SHAPES)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--shape", choices=shapes,
                      help="architecture and size to imitate: " + ", ".join(shapes) + " (the "
                      "encoders, with a synthetic WordPiece vocabulary, take F32, F16 or Q8_0)")
    what.add_argument("--mmproj", choices=sorted(MMPROJ_SHAPES),
                      help="write a vision projector (llama.cpp's mmproj file) instead: "
                      + ", ".join(sorted(MMPROJ_SHAPES)) + " (F16 or F32)")
    p.add_argument("--type", default=None, choices=list(MIXES),
                   help="quantization mix of the weights (default Q4_K_M; encoders F16)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="only the shape's first N layers, of their real shapes (for a model too "
                   "large for the machine; default: all)")
    p.add_argument("out", metavar="OUT.gguf", help="file to write")
    p.set_defaults(func=run)


def run(args):
    t0 = time.perf_counter()
    if args.layers is not None and (args.mmproj or args.shape in ENCODER_SHAPES):
        raise ConfigError("--layers applies to the decoder shapes only")
    if args.mmproj:
        args.type = args.type or "F16"
        n = synth_mmproj(args.mmproj, args.out, args.type, seed=args.seed)
        print(f"edged synth: wrote {args.out}: mmproj {args.mmproj} {args.type}, {n / 1e6:.1f} M "
              f"parameters in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return 0
    if args.shape in ENCODER_SHAPES:
        args.type = args.type or "F16"
        n = synth_encoder(args.shape, args.type, args.out, seed=args.seed)
        print(f"edged synth: wrote {args.out}: {args.shape} {args.type}, {n / 1e6:.1f} M "
              f"parameters in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return 0
    args.type = args.type or "Q4_K_M"

    with bar(f"synth {args.shape}", unit="layer") as b:
        def progress(i, n):
            b.total = n
            b.update(i - b.n)

        n = synth(args.shape, args.type, args.out, seed=args.seed, progress=progress,
                  n_layer=args.layers)
    size = os.path.getsize(args.out)
    print(f"edged synth: wrote {args.out}: {args.shape} {args.type}, {n / 1e6:.1f} M parameters, "
          f"{size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
