"""Verified opening, what the daemon imports: open a model once (no symlinks, safe owner and
mode), hash that descriptor, accept it when a trusted, unrevoked key signed it (appended
blocks outermost first, then MODEL.gguf.sig), and hand the same descriptor back to be mapped,
so what was verified is what is used. Successful checks are cached by file identity.

Every signature is RSA over the SHA-256 digest of a prefix of the model file (PKCS#1 v1.5 or
PSS with MGF1-SHA-256), so each one is exactly what `openssl dgst -sha256 -sign` makes:

- detached: `MODEL.gguf.sig` holds the raw signature over the whole file;
- appended: a signature block at the end of the file (edged/trust/blocks.py) holds the
  signature over every byte before the block. Blocks stack: a second block covers the file
  and the first block. GGUF readers stop at the last tensor, so a signed file still loads
  elsewhere.
"""
import collections
import errno
import os
import stat
import threading
import time

from .blocks import hash_fd, read_blocks
from .keys import ALGORITHM_NAMES, MIN_RSA_BITS, made_by, verify_digest
from .rules import (BAD_SIGNATURE, CHANGED, KEY_TOO_SMALL, NO_TRUST_STORE, REVOKED_KEY, SYMLINK,
                    UNKNOWN_KEY, UNSAFE_PERMISSIONS, UNSIGNED, refuse)
from .store import TrustStore
from ..errors import SignatureError

MAX_DETACHED_BYTES = 64 << 10
_CACHE_SETTLE_NS = 2_000_000_000  # files changed this recently are not cached (coarse clocks)


class VerificationCache:
    """Successful verifications by (device, inode, size, mtime_ns, ctime_ns): switching back to
    a big model does not hash it again, and any change to the file misses the cache. Trust is
    re-checked on every hit, so revoking a key takes effect at once."""

    def __init__(self, max_entries=64):
        self._entries = collections.OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, key):
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value):
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self):
        with self._lock:
            self._entries.clear()


CACHE = VerificationCache()


class VerifiedFile:
    """An open model file: `fd` is the very descriptor that was hashed (map this one).
    `signed_length`: bytes of model data covered by the signature; appended blocks start there.
    `signer`: the accepted key's fingerprint, or None when the file was not verified.
    `sha256`: the digest of the signed bytes when they were hashed (prompt-cache files name it)."""

    def __init__(self, fd, path, size, signed_length, signer=None, kind=None, algorithm=None,
                 sha256=None):
        self.fd, self.path, self.size, self.signed_length = fd, path, size, signed_length
        self.signer, self.kind, self.algorithm, self.sha256 = signer, kind, algorithm, sha256

    def fileno(self):
        return self.fd

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"VerifiedFile({self.path!r}, size={self.size}, signed_length={self.signed_length}, "
                f"signer={self.signer!r}, kind={self.kind!r})")


def stat_key(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _check_owner_and_mode(st, what, name):
    if st.st_uid not in (0, os.geteuid()):
        raise refuse(UNSAFE_PERMISSIONS, name,
                     f"{what} is owned by uid {st.st_uid}, neither root nor uid {os.geteuid()} "
                      "that verifies it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise refuse(UNSAFE_PERMISSIONS, name,
                     f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")


def _open_checked(path):
    """Open `path` read-only without following a final symlink, after checking the directory
    that holds it; returns (file descriptor, its fstat, directory descriptor)."""
    directory = os.path.dirname(os.path.abspath(path))
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_owner_and_mode(os.fstat(dfd), f"directory {directory}", path)
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO
            fd = os.open(os.path.basename(path), flags, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise refuse(SYMLINK, path, "is a symbolic link; open models by their real path") from None
            raise OSError(e.errno, e.strerror, path) from None  # name the path, not the basename
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise refuse(UNSAFE_PERMISSIONS, path, "is not a regular file")
            _check_owner_and_mode(st, "file", path)
        except BaseException:
            os.close(fd)
            raise
        return fd, st, dfd
    except BaseException:
        os.close(dfd)
        raise


def _read_detached(dfd, path):
    try:
        sfd = os.open(os.path.basename(path) + ".sig", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC,
                      dir_fd=dfd)
    except FileNotFoundError:
        return None
    with os.fdopen(sfd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise refuse(BAD_SIGNATURE, path + ".sig", "is not a regular file")
        return f.read(MAX_DETACHED_BYTES + 1)


def open_verified(path, trust, require_signature, *, progress=None, cache=CACHE):
    """Open a model for mapping after checking its signature against `trust`.

    - trust is None and not require_signature: opened as is, nothing checked.
    - otherwise the file is opened once with O_NOFOLLOW (symlinks refused), must be a regular
      file owned by root or this user and, like its directory, not writable by group or others;
      that descriptor is hashed, and the file is accepted when one of its signatures (appended
      blocks, then MODEL.sig) verifies with a trusted, unrevoked key. An unsigned file passes
      only when signatures are not required; a signature that fails is always refused.
    Raises SignatureError whose message starts with the rule that failed."""
    path = os.fspath(path)
    if trust is not None and not isinstance(trust, TrustStore):
        trust = TrustStore.load(os.fspath(trust))
    if trust is None and not require_signature:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            blocks = read_blocks(fd, size, path)
        except (SignatureError, EOFError):
            blocks = []
        except BaseException:
            os.close(fd)
            raise
        return VerifiedFile(fd, path, size, blocks[0].offset if blocks else size)
    if trust is None:
        raise refuse(NO_TRUST_STORE, path, "signatures are required but no trusted keys were given")

    fd, st, dfd = _open_checked(path)
    try:
        result = _verify_fd(fd, st, dfd, path, trust, require_signature, progress, cache)
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.close(dfd)
    return result


def _verify_fd(fd, st, dfd, path, trust, require_signature, progress, cache):
    size = st.st_size
    key = stat_key(st)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and trust.is_trusted(hit[0]):
        signer, kind, algorithm, payload_end, digest = hit
        return VerifiedFile(fd, path, size, payload_end, signer, kind, algorithm, digest)

    try:
        blocks = read_blocks(fd, size, path)
    except EOFError:
        raise refuse(CHANGED, path, "file shrank while its signature blocks were read") from None
    payload_end = blocks[0].offset if blocks else size
    detached = _read_detached(dfd, path)
    if detached is not None and len(detached) > MAX_DETACHED_BYTES:
        raise refuse(BAD_SIGNATURE, path + ".sig", f"over {MAX_DETACHED_BYTES} bytes, not a signature")
    if not blocks and detached is None:
        if require_signature:
            raise refuse(UNSIGNED, path, f"no appended signature block and no {os.path.basename(path)}.sig")
        return VerifiedFile(fd, path, size, size)

    lengths = [b.offset for b in blocks] + ([size] if detached is not None else [])
    try:
        digests = hash_fd(fd, lengths, progress)
    except EOFError as e:
        raise refuse(CHANGED, path, f"file ended at offset {e.args[0]}, before {max(lengths)}") from None
    after = os.fstat(fd)
    if stat_key(after) != key:
        raise refuse(CHANGED, path, "size, modification time, change time or inode differ after hashing")

    signer, kind, algorithm = _judge(path, trust, blocks, detached, digests, size)
    # A file changed within the file system's timestamp granularity of now could change again
    # without a new timestamp: such results are not cached (as git does with "racy" entries).
    if cache is not None and time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > _CACHE_SETTLE_NS:
        cache.put(key, (signer, kind, algorithm, payload_end, digests[payload_end]))
    return VerifiedFile(fd, path, size, payload_end, signer, kind, algorithm, digests[payload_end])


def _judge(path, trust, blocks, detached, digests, size):
    """(signer, kind, algorithm name) of the first signature a trusted key verifies, appended
    blocks outermost first, then the detached one; otherwise refuse with the most telling rule."""
    refusals = []  # (rule, detail)
    for b in reversed(blocks):
        where = f"appended signature at offset {b.offset}"
        status = trust.status(b.fingerprint)
        if len(b.signature) * 8 < MIN_RSA_BITS:
            refusals.append((KEY_TOO_SMALL, f"{where} is {len(b.signature) * 8} bits, from key "
                                            f"{b.fingerprint} under the {MIN_RSA_BITS}-bit minimum"))
        elif status == "trusted":
            if verify_digest(trust.keys[b.fingerprint], b.signature, digests[b.offset], (b.algorithm,)):
                return b.fingerprint, "appended", ALGORITHM_NAMES[b.algorithm]
            refusals.append((BAD_SIGNATURE, f"{where} by key {b.fingerprint} does not match "
                                            f"the {b.offset} bytes it covers"))
        elif status == REVOKED_KEY:
            refusals.append((REVOKED_KEY, f"{where} is by revoked key {b.fingerprint}"))
        else:
            refusals.append((UNKNOWN_KEY, f"{where} is by key {b.fingerprint}, "
                                          f"which is not in the trust store {trust.source}"))
    if detached is not None:
        where = f"detached signature {os.path.basename(path)}.sig"
        for fp, public_key in trust.trusted().items():
            algorithm = verify_digest(public_key, detached, digests[size])
            if algorithm:
                return fp, "detached", ALGORITHM_NAMES[algorithm]
        # It names no key: find out whether a known key made it (over other bytes) at all.
        # certain answers first: a PSS-shaped opening by another key must not outrank the key
        # whose PKCS#1 v1.5 encoding opened
        made = {fp: made_by(public_key, detached) for fp, public_key in trust.keys.items()}
        makers = sorted((fp for fp in made if made[fp]), key=lambda fp: -made[fp])
        if makers and makers[0] in trust.revoked:
            refusals.append((REVOKED_KEY, f"{where} is by revoked key {makers[0]}"))
        elif makers:
            refusals.append((BAD_SIGNATURE, f"{where} is by key {makers[0]} "
                                            f"but does not match the file's {size} bytes"))
        elif len(detached) * 8 < MIN_RSA_BITS:
            refusals.append((KEY_TOO_SMALL, f"{where} is {len(detached) * 8} bits, "
                                            f"from a key under the {MIN_RSA_BITS}-bit minimum"))
        else:
            refusals.append((UNKNOWN_KEY, f"{where} was not made by any key in the trust store "
                                          f"{trust.source} (made by another key, or damaged)"))
    order = (BAD_SIGNATURE, REVOKED_KEY, KEY_TOO_SMALL, UNKNOWN_KEY)
    refusals.sort(key=lambda r: order.index(r[0]))
    raise refuse(refusals[0][0], path, "; ".join(detail for _, detail in refusals))

