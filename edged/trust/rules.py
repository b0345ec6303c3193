"""The refusal vocabulary of edged's trust checks: every SignatureError message starts with
one of these rules, and the exception carries it as `.rule` so callers (the daemon's error
mapping, tests) can tell why without parsing text."""
from ..errors import SignatureError

UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad signature"
UNKNOWN_KEY = "unknown key"
REVOKED_KEY = "revoked key"
KEY_TOO_SMALL = "key too small"
CHANGED = "file changed during verification"
UNSAFE_PERMISSIONS = "unsafe permissions"
SYMLINK = "symbolic link"
MALFORMED_BLOCK = "malformed signature block"
BAD_KEY = "bad key"
BAD_REVOCATION_LIST = "bad revocation list"
NO_TRUST_STORE = "no trust store"


def refuse(rule, subject, detail):
    """A SignatureError "RULE: SUBJECT: DETAIL" carrying `rule`."""
    e = SignatureError(f"{rule}: {subject}: {detail}")
    e.rule = rule
    return e
