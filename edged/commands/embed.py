"""`edged embed -m FILE -p TEXT [-p TEXT ...]`: embeddings of texts under a model (a BERT-family
encoder, or a decoder with --pooling), as llama.cpp's llama-embedding prints them."""
import json
import sys

from .loadargs import add_load_args, load_model


def configure(p):
    p.description = ("Embed each TEXT with the model in FILE: pooled as the file's pooling type "
                     "says (or --pooling) and L2-normalised.")
    add_load_args(p)
    p.add_argument("-p", "--prompt", action="append", metavar="TEXT",
                   help="a text to embed (repeat for several; they run as one batch)")
    p.add_argument("-f", "--file", metavar="PATH",
                   help="embed each line of a file (- for stdin)")
    p.add_argument("--pooling", choices=["mean", "cls", "last", "none"], default=None,
                   help="pooling over the tokens (default: the file's <arch>.pooling_type)")
    p.add_argument("--no-normalize", action="store_true", help="do not L2-normalise")
    p.add_argument("--json", action="store_true",
                   help="print OpenAI's shape: {\"data\": [{\"index\", \"embedding\"}], ...}")
    p.set_defaults(func=run)


def texts_with_file(texts, path):
    """`texts` and each non-empty line of the file at `path` (- for stdin), if given."""
    texts = list(texts or ())
    if path:
        fh = sys.stdin if path == "-" else open(path, encoding="utf-8")
        with fh:
            texts += [line.rstrip("\n") for line in fh if line.strip()]
    return texts


def run(args):
    texts = texts_with_file(args.prompt, args.file)
    if not texts:
        print("edged embed: give at least one -p TEXT or -f FILE", file=sys.stderr)
        return 2
    with load_model(args) as m:
        vecs = m.embed(texts, pooling=args.pooling, normalize=not args.no_normalize)
    if args.json:
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in enumerate(vecs)]
        print(json.dumps({"object": "list", "data": data, "model": args.model}))
        return 0
    for i, v in enumerate(vecs):
        rows = v if v.ndim == 2 else [v]
        for r in rows:
            print(f"embedding {i}: " + " ".join(f"{x:9.6f}" for x in r))
    return 0
