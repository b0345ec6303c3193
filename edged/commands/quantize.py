"""`edged quantize IN.gguf OUT.gguf TYPE`: requantize a model into one of llama.cpp's mixes."""
import sys
import time


def register(sub):
    from ..format.quantize import ALIASES, MIXES
    p = sub.add_parser("quantize", help="quantize a GGUF model (Q4_K_M, Q8_0, ...)",
                       description="Quantize IN into OUT with llama.cpp's per-tensor type choices "
                       "and reference quantizers (no importance matrix). Metadata is copied; OUT "
                       "is written atomically.")
    p.add_argument("input", metavar="IN.gguf")
    p.add_argument("output", metavar="OUT.gguf")
    p.add_argument("type", metavar="TYPE", help="one of " + ", ".join(list(MIXES) + list(ALIASES)))
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args):
    from ..format.quantize import parse_mix, quantize_file
    ftype = parse_mix(args.type)  # fail on a bad type before reading anything
    t0 = time.monotonic()
    tty = sys.stderr.isatty()

    def progress(i, n, name, qtype, done, total):
        if args.quiet:
            return
        width = 30
        fill = int(width * done / max(1, total))
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {100 * done / max(1, total):5.1f}% "
                f"{i}/{n} {name} -> {qtype.name}")
        print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", file=sys.stderr)

    types = quantize_file(args.input, args.output, ftype, progress=progress)
    if not args.quiet:
        counts = {}
        for t in types.values():
            counts[t.name] = counts.get(t.name, 0) + 1
        print(("\n" if tty else "") + f"quantized {args.input} -> {args.output} as {ftype.name} in "
              f"{time.monotonic() - t0:.1f} s: " + ", ".join(f"{k} x{v}" for k, v in counts.items()),
              file=sys.stderr)
    return 0
