"""API keys for the opt-in TCP listener. Peers on the Unix socket are admitted by their
credentials (SO_PEERCRED); a TCP peer has none, so every request on TCP must carry
`Authorization: Bearer KEY` (or `x-api-key: KEY`, as Anthropic's clients send it) with a key
from `api_keys_file`: one key per line (blank lines and `#` comments skipped), in a file owned
by root that nobody else may write or other users read.
Keys are compared in constant time.
"""
import hashlib
import hmac
import os
import stat

from ..errors import ConfigError

MIN_KEY_CHARS = 16


def load(path):
    """The keys in `path` (a tuple of bytes); ConfigError naming the file and what is wrong."""
    where = f"config key 'api_keys_file': {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{where}: cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{where}: not a regular file")
        if st.st_uid != 0:
            raise ConfigError(f"{where}: must be owned by root (owner uid {st.st_uid})")
        if st.st_mode & 0o022 or st.st_mode & 0o004:
            raise ConfigError(f"{where}: mode {stat.S_IMODE(st.st_mode):04o} lets others write or read "
                              "it; use 0600 or 0640")
        with os.fdopen(os.dup(fd), "rb") as fh:
            text = fh.read(1 << 20)
    finally:
        os.close(fd)
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(b"#"):
            continue
        if len(line) < MIN_KEY_CHARS or any(c <= 32 or c >= 127 for c in line):
            raise ConfigError(f"{where}: line {n}: a key is at least {MIN_KEY_CHARS} printable ASCII "
                              "characters without spaces")
        keys.append(line)
    if not keys:
        raise ConfigError(f"{where}: no keys")
    return tuple(keys)


def _tokens(authorization, api_key):
    scheme, _, token = (authorization or "").partition(" ")
    tokens = [token] if scheme.lower() == "bearer" else []
    if api_key is not None:
        tokens.append(api_key)
    return [t.strip().encode("ascii", "replace") for t in tokens]


def key_id(authorization, keys, api_key=None):
    """A stand-in for the key of `keys` that an Authorization header value (Bearer) or an
    x-api-key header value carries (a digest, so the key itself is not kept with the request),
    None when neither carries one: what is stored for one key is its alone. Every key is
    compared, in constant time, whatever matches."""
    for t in _tokens(authorization, api_key):
        if any([hmac.compare_digest(t, k) for k in keys]):
            return hashlib.sha256(t).hexdigest()[:32]
    return None


def admitted(authorization, keys, api_key=None):
    """Whether the headers carry one of `keys` (key_id)."""
    return key_id(authorization, keys, api_key) is not None
