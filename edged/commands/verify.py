"""`edged verify`: check a model's signature against a trust store, as the daemon does."""
import os
import sys

from ..trust import signing
from .progress import ProgressBar


def register(subparsers):
    p = subparsers.add_parser("verify", help="check a model's signature against trusted keys",
                              description="Verify MODEL as the daemon does before loading it. Prints the "
                                          "signer's fingerprint and exits 0, or the reason and exits 1.")
    p.add_argument("--trusted", default=signing.DEFAULT_TRUSTED_DIR, metavar="DIR",
                   help=f"directory of trusted PEM public keys (default {signing.DEFAULT_TRUSTED_DIR})")
    p.add_argument("--revoked", metavar="FILE",
                   help=f"revoked fingerprints, one a line (default {signing.DEFAULT_REVOKED_FILE} if it exists)")
    p.add_argument("model", metavar="MODEL.gguf")
    p.set_defaults(func=run)


def run(args):
    revoked = args.revoked
    if revoked is None and os.path.exists(signing.DEFAULT_REVOKED_FILE):
        revoked = signing.DEFAULT_REVOKED_FILE
    bar = ProgressBar(f"verify {args.model}")
    try:
        trust = signing.TrustStore.load(args.trusted, revoked)
        with signing.open_verified(args.model, trust, require_signature=True, progress=bar, cache=None) as vf:
            bar.finish()
            print(f"{vf.signer}  {args.model}  ({vf.kind}, {vf.algorithm}, {vf.signed_length} bytes signed)")
        return 0
    except signing.SignatureError as e:
        bar.finish()
        print(f"edged verify: {e}", file=sys.stderr)
        return 1
