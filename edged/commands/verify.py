"""`edged verify`: check a model's signature against a trust store, as the daemon does."""
import sys

from ..errors import SignatureError
from ..trust import store, verify
from .progress import ByteProgress


def configure(p):
    p.description = ("Verify MODEL as the daemon does before loading it. Prints the "
                     "signer's fingerprint and exits 0, or the reason and exits 1.")
    p.add_argument("--trusted-keys", "--trusted", dest="trusted", default=store.DEFAULT_TRUSTED_DIR,
                   metavar="DIR", help="directory of trusted PEM public keys (default "
                   f"{store.DEFAULT_TRUSTED_DIR}; --trusted is the old name)")
    p.add_argument("--revoked-keys", "--revoked", dest="revoked", default=store.DEFAULT_REVOKED_FILE,
                   metavar="FILE", help=f"revoked fingerprints, one a line (default {store.DEFAULT_REVOKED_FILE} "
                   "if it exists, as the daemon's revoked_keys; \"\" for none; --revoked is the old name)")
    p.add_argument("model", metavar="MODEL.gguf", help="model file (or its mmproj image projector) to verify")
    p.set_defaults(func=run)


def run(args):
    try:
        trust = store.TrustStore.load(args.trusted, store.revocation_file(args.revoked))
        with ByteProgress(f"verify {args.model}") as progress:
            vf = verify.open_verified(args.model, trust, require_signature=True, progress=progress,
                                      cache=None)
        with vf:
            print(f"{vf.signer}  {args.model}  ({vf.kind}, {vf.algorithm}, {vf.signed_length} bytes signed)")
        return 0
    except SignatureError as e:
        print(f"edged verify: {e}", file=sys.stderr)
        return 1
