"""`edged quantize IN.gguf OUT.gguf TYPE`: quantize a model into one of llama.cpp's mixes."""
import collections
import os
import sys
import time

from ..errors import ConfigError
from ..format.quantize import ALIASES, MIXES, parse_mix, quantize_file
from .progress import bar


def configure(p):
    p.description = ("Quantize IN into OUT with llama.cpp's per-tensor type choices "
                     "and quantizers (importance-weighted with --imatrix). Metadata is copied; OUT "
                     "is written atomically, with the mode your umask gives new files.")
    p.add_argument("input", metavar="IN.gguf", help="model to quantize (F32/F16/BF16 weights)")
    p.add_argument("output", metavar="OUT.gguf", help="file to write (refused if it exists, see --force)")
    p.add_argument("type", metavar="TYPE", help="one of " + ", ".join(list(MIXES) + list(ALIASES)))
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow quantizing tensors that are already quantized (their rounding "
                        "errors add up; as llama-quantize's flag of the same name)")
    p.add_argument("--imatrix", metavar="FILE",
                   help="importance matrix from llama-imatrix (GGUF or legacy .dat): each weight's "
                        "quantization error is weighted by its column's mean squared activation, "
                        "as llama-quantize --imatrix does, with the same bytes (Q4_0..Q5_1, the K-quants, "
                        "IQ4_NL, IQ4_XS; Q8_0 ignores it)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    p.set_defaults(func=run)


def run(args):
    ftype = parse_mix(args.type)  # fail on a bad type before reading anything
    if os.path.lexists(args.output) and not args.force:
        raise ConfigError(f"{args.output} exists (--force to overwrite it)")
    t0 = time.monotonic()
    with bar(f"quantize {os.path.basename(args.input)}", disable=True if args.quiet else None) as b:
        def progress(i, n, name, qtype, done, total):
            b.total = total
            b.set_postfix_str(f"{i}/{n} {name} -> {qtype.name}", refresh=False)
            b.update(done - b.n)

        types = quantize_file(args.input, args.output, ftype, progress=progress,
                              allow_requantize=args.allow_requantize, imatrix=args.imatrix)
    if not args.quiet:
        counts = collections.Counter(t.name for t in types.values())
        print(f"quantized {args.input} -> {args.output} as {ftype.name} in "
              f"{time.monotonic() - t0:.1f} s: " + ", ".join(f"{k} x{v}" for k, v in counts.items()),
              file=sys.stderr)
    return 0
