"""`edged verify`: check a model's signature against a trust store, as the daemon does."""
import sys

from ..errors import SignatureError
from ..trust import store, verify
from .progress import ProgressBar


def register(subparsers):
    p = subparsers.add_parser("verify", help="check a model's signature against trusted keys",
                              description="Verify MODEL as the daemon does before loading it. Prints the "
                                          "signer's fingerprint and exits 0, or the reason and exits 1.")
    p.add_argument("--trusted", default=store.DEFAULT_TRUSTED_DIR, metavar="DIR",
                   help=f"directory of trusted PEM public keys (default {store.DEFAULT_TRUSTED_DIR})")
    p.add_argument("--revoked", default=store.DEFAULT_REVOKED_FILE, metavar="FILE",
                   help=f"revoked fingerprints, one a line (default {store.DEFAULT_REVOKED_FILE} if it "
                        "exists, as the daemon's revoked_keys; \"\" for none)")
    p.add_argument("model", metavar="MODEL.gguf")
    p.set_defaults(func=run)


def run(args):
    bar = ProgressBar(f"verify {args.model}")
    try:
        trust = store.TrustStore.load(args.trusted, store.revocation_file(args.revoked))
        with verify.open_verified(args.model, trust, require_signature=True, progress=bar, cache=None) as vf:
            bar.finish()
            print(f"{vf.signer}  {args.model}  ({vf.kind}, {vf.algorithm}, {vf.signed_length} bytes signed)")
        return 0
    except SignatureError as e:
        bar.finish()
        print(f"edged verify: {e}", file=sys.stderr)
        return 1
