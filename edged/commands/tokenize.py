"""`edged tokenize -m FILE -p TEXT`: the token ids (and pieces) of a text under a model's
tokenizer. Works on vocab-only GGUF files."""
import json
import sys

from ..text.tokenizer import Tokenizer


def configure(p):
    p.description = ("Tokenize TEXT with the tokenizer in FILE's metadata (a vocab-only "
                     "GGUF file is enough) and print one line per token: id and piece.")
    p.add_argument("-m", "--model", required=True, metavar="FILE", help="GGUF file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", metavar="TEXT", help="the text")
    src.add_argument("-f", "--file", metavar="PATH", help="read the text from a file (- for stdin)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--ids", action="store_true", help="print only the ids, as [1, 2, 3]")
    out.add_argument("--pieces", action="store_true", help="print only the pieces, one per line")
    out.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    p.add_argument("--no-bos", action="store_true", help="do not add the BOS token the model asks for")
    p.add_argument("--parse-special", action="store_true",
                   help="turn control tokens written in the text (e.g. <|im_start|>) into their ids")
    p.add_argument("--allow-unknown-pre", action="store_true",
                   help="tokenize with the 'default' pre-tokenizer when the model's is unknown")
    p.set_defaults(func=run)


def _piece(tok, i):
    return tok.token_piece(i).decode("utf-8", "backslashreplace")


def _shown(tok, i):
    """A piece for the terminal: quoted text, or the bytes when they are part of a character."""
    b = tok.token_piece(i)
    try:
        return json.dumps(b.decode("utf-8"), ensure_ascii=False)
    except UnicodeDecodeError:
        return repr(b)


def run(args):
    if args.prompt is not None:
        text = args.prompt
    elif args.file == "-":
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as fh:
            text = fh.read()
    tok = Tokenizer.from_gguf(args.model, allow_unknown_pre=args.allow_unknown_pre)
    ids = tok.encode(text, add_special=True, parse_special=args.parse_special)
    if args.no_bos and tok.add_bos and ids[:1] == [tok.bos_id]:
        ids = ids[1:]
    if args.ids:
        print("[" + ", ".join(map(str, ids)) + "]")
    elif args.pieces:
        for i in ids:
            print(_shown(tok, i))
    elif args.json:
        print(json.dumps({"ids": ids, "pieces": [_piece(tok, i) for i in ids], "n_tokens": len(ids)},
                         ensure_ascii=False))
    else:
        for i in ids:
            print(f"{i:>7} {_shown(tok, i)}")
    return 0
