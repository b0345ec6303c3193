"""`edged sign`: sign a model file with an RSA private key (appended block or detached .sig)."""
import getpass
import sys

from ..errors import SignatureError
from ..trust import keys, sign
from .progress import ByteProgress


def configure(p):
    p.description = ("Sign MODEL with an RSA key: by default a signature block is "
                     "appended to the file; --detached writes MODEL.gguf.sig "
                     "(the model's file name plus .sig), the raw signature "
                     "`openssl dgst -sha256 -sign` makes.")
    p.add_argument("--key", required=True, metavar="KEY.pem", help="RSA private key (PEM)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--append", dest="detached", action="store_false", help="append a signature block (default)")
    mode.add_argument("--detached", dest="detached", action="store_true", help="write MODEL.gguf.sig beside the model instead")
    p.add_argument("--pss", action="store_true", help="RSA-PSS padding instead of PKCS#1 v1.5")
    p.add_argument("model", metavar="MODEL.gguf", help="model file (or its mmproj image projector) to sign")
    p.set_defaults(func=run, detached=False)


def _load_key(path):
    try:
        return sign.load_private_key(path)
    except SignatureError:
        with open(path, "rb") as f:
            encrypted = b"ENCRYPTED" in f.read(1 << 20)
        if not (encrypted and sys.stdin.isatty()):
            raise
        return sign.load_private_key(path, getpass.getpass(f"passphrase for {path}: ").encode())


def run(args):
    key = _load_key(args.key)
    with ByteProgress(f"sign {args.model}") as progress:
        out = sign.sign_file(args.model, key, detached=args.detached, pss=args.pss, progress=progress)
    kind = "detached" if args.detached else "appended"
    algorithm = keys.ALGORITHM_NAMES[keys.PSS if args.pss else keys.PKCS1V15]
    print(f"{keys.fingerprint(key)}  {out}  ({kind}, {algorithm})")
    return 0
