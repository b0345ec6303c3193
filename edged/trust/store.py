"""The trust store: the public keys a device accepts (a directory of PEM files, one key each)
and the fingerprints it revoked (a file, one fingerprint a line). Both are parsed strictly: a
file that says more than one thing is refused with the file and line named, never half-read.
The daemon and `edged verify` use the same defaults (`revocation_file`)."""
import os

from .keys import fingerprint, load_public_key, parse_fingerprint
from .rules import BAD_REVOCATION_LIST, NO_TRUST_STORE, REVOKED_KEY, UNKNOWN_KEY, refuse

DEFAULT_TRUSTED_DIR = "/etc/edged/trusted-keys"
DEFAULT_REVOKED_FILE = "/etc/edged/revoked-keys"


def revocation_file(path=DEFAULT_REVOKED_FILE):
    """The revocation list in force for a configured `path`, the same rule for the daemon's
    `revoked_keys` and `edged verify --revoked`: the default file counts when it exists (a
    device without revocations need not create it); any other path must exist; "" or None
    means none."""
    if not path:
        return None
    if path == DEFAULT_REVOKED_FILE and not os.path.lexists(path):
        return None
    return path


def _is_fingerprint(text):
    try:
        parse_fingerprint(text)
    except ValueError:
        return False
    return True


class TrustStore:
    """The public keys a device accepts, by fingerprint, and the fingerprints it revoked.

    A revoked key may still sit in the directory: it is kept (so a refusal can name it) but
    never accepted."""

    def __init__(self, keys, revoked=frozenset(), source="<memory>"):
        self.keys = dict(keys)  # fingerprint -> RSAPublicKey, every key found
        self.revoked = frozenset(revoked)
        self.source = source

    @classmethod
    def load(cls, trusted_dir=DEFAULT_TRUSTED_DIR, revoked_file=None):
        """Every regular, non-hidden file in `trusted_dir` must be an RSA public key in PEM of
        at least 2048 bits, one per file. `revoked_file` lists one fingerprint per line,
        optionally followed by a label (`#` starts a comment)."""
        try:
            names = sorted(os.listdir(trusted_dir))
        except OSError as e:
            raise refuse(NO_TRUST_STORE, trusted_dir,
                         f"cannot read the trusted-keys directory: {e.strerror}") from None
        keys = {}
        for name in names:
            path = os.path.join(trusted_dir, name)
            if name.startswith(".") or not os.path.isfile(path):
                continue
            key = load_public_key(path)
            keys.setdefault(fingerprint(key), key)
        revoked = set()
        if revoked_file is not None:
            try:
                with open(revoked_file, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise refuse(BAD_REVOCATION_LIST, revoked_file, str(e)) from None
            for lineno, line in enumerate(lines, 1):
                fields = line.split("#", 1)[0].split()
                if not fields:
                    continue
                where = f"{revoked_file}:{lineno}"
                try:
                    revoked.add(parse_fingerprint(fields[0]))
                except ValueError as e:
                    raise refuse(BAD_REVOCATION_LIST, where, str(e)) from None
                # A label may follow the fingerprint; a second fingerprint may not (it would
                # look revoked to whoever wrote it, and not be).
                for field in fields[1:]:
                    if _is_fingerprint(field):
                        raise refuse(BAD_REVOCATION_LIST, where, f"a second fingerprint {field!r} on one "
                                     "line; write one fingerprint per line")
        return cls(keys, revoked, source=trusted_dir)

    def status(self, fp):
        if fp in self.revoked:
            return REVOKED_KEY
        return "trusted" if fp in self.keys else UNKNOWN_KEY

    def is_trusted(self, fp):
        return fp in self.keys and fp not in self.revoked

    def trusted(self):
        return {fp: k for fp, k in self.keys.items() if fp not in self.revoked}

