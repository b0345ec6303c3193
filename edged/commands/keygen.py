"""`edged keygen`: make an RSA signing key pair for models."""
import os

from ..trust import keys, sign
from ..errors import ConfigError


def configure(p):
    p.description = ("Write an RSA private key (mode 0600) and its public key "
                     "beside it (KEY.pem -> KEY.pub.pem); never overwrites.")
    p.add_argument("--out", required=True, metavar="KEY.pem", help="private key file to create")
    p.add_argument("--bits", type=int, default=3072, help="modulus size (default 3072, at least 2048)")
    p.set_defaults(func=run)


def run(args):
    private_path = args.out
    public_path = sign.public_key_path(private_path)
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise ConfigError(f"{path} exists; keygen never overwrites a key")
    key = sign.generate_key(args.bits)
    sign.write_file_atomic(private_path, sign.private_pem(key), 0o600, overwrite=False)
    sign.write_file_atomic(public_path, sign.public_pem(key), 0o644, overwrite=False)
    print(f"{keys.fingerprint(key)}  {public_path}")
    return 0

