"""Signed models: the trust store, detached and appended RSA signatures, and verified opening.

Every signature is RSA over the SHA-256 digest of a prefix of the model file (PKCS#1 v1.5 or
PSS with MGF1-SHA-256), so each one is exactly what `openssl dgst -sha256 -sign` makes:

- detached: `MODEL.gguf.sig` holds the raw signature over the whole file;
- appended: a signature block at the end of the file (layout below) holds the signature over
  every byte before the block. Blocks stack: a second block covers the file and the first
  block. GGUF readers stop at the last tensor, so a signed file still loads elsewhere.

Appended block, all integers little-endian (64-byte header, signature, 16-byte trailer):

    offset  size  field
    0       8     magic b"EDGEDSIG"
    8       2     format version, 1
    10      2     algorithm: 1 = RSASSA-PKCS1-v1_5 SHA-256, 2 = RSASSA-PSS SHA-256 (MGF1-SHA-256)
    12      4     S, signature length in bytes (the key's modulus size)
    16      8     signed length: bytes of the file covered, always the block's own offset
    24      32    SHA-256 fingerprint of the signing key's DER SubjectPublicKeyInfo
    56      8     reserved, zero
    64      S     signature over SHA-256(file[0:signed length])
    64+S    8     block length, 64 + S + 16
    72+S    8     magic b"EDGEDEND"

A reader finds the last block from the end of the file (trailer -> block length -> header)
and walks inwards. `open_verified` opens a model once, hashes that descriptor, and hands the
same descriptor to the caller, so what was verified is what gets mapped.
"""
import collections
import errno
import hashlib
import os
import stat
import struct
import tempfile
import threading
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils

from ..errors import SignatureError
from ..files import creation_mode

DEFAULT_TRUSTED_DIR = "/etc/edged/trusted-keys"
DEFAULT_REVOKED_FILE = "/etc/edged/revoked-keys"
MIN_RSA_BITS = 2048

# The rule a refusal names; every SignatureError message starts with one of these.
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

PKCS1V15, PSS = 1, 2
ALGORITHM_NAMES = {PKCS1V15: "RSA-PKCS1v15-SHA256", PSS: "RSA-PSS-SHA256"}

BLOCK_MAGIC = b"EDGEDSIG"
TRAILER_MAGIC = b"EDGEDEND"
BLOCK_VERSION = 1
_HEADER = struct.Struct("<8sHHIQ32s8x")  # magic, version, algorithm, sig len, signed len, fingerprint
_TRAILER = struct.Struct("<Q8s")  # block length, magic
MAX_SIGNATURE_BYTES = 2048  # a 16384-bit key
MAX_BLOCKS = 16
_TAIL_SCAN = 64 << 10  # how far back a damaged or displaced block is looked for
MAX_DETACHED_BYTES = 64 << 10
HASH_CHUNK = 1 << 20  # fits in L2: read() copies into cache, SHA-256 reads it from there
_CACHE_SETTLE_NS = 2_000_000_000  # files changed this recently are not cached (coarse clocks)


def _refuse(rule, subject, detail):
    e = SignatureError(f"{rule}: {subject}: {detail}")
    e.rule = rule
    return e


# --- keys ------------------------------------------------------------------------------------

def fingerprint(key):
    """SHA-256 of the DER SubjectPublicKeyInfo of `key` (public or private), lowercase hex.
    The same as `openssl pkey -pubin -in PUB.pem -outform DER | sha256sum`."""
    if isinstance(key, rsa.RSAPrivateKey):
        key = key.public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _check_rsa(key, source):
    if not isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        kind = type(key).__name__.lstrip("_")
        raise _refuse(BAD_KEY, source, f"{kind} is not an RSA key; edged accepts RSA keys only")
    if key.key_size < MIN_RSA_BITS:
        raise _refuse(KEY_TOO_SMALL, source,
                      f"{key.key_size}-bit RSA key; at least {MIN_RSA_BITS} bits required")
    return key


def load_public_key(path):
    """An RSA public key from a PEM file; refuses other key types and keys under 2048 bits."""
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        hint = " (a private key: put only public keys here)" if b"PRIVATE KEY" in data else ""
        raise _refuse(BAD_KEY, path, f"not a PEM public key{hint}: {e}") from None
    return _check_rsa(key, path)


def load_private_key(path, password=None):
    """An RSA private key from a PEM file (PKCS#1 or PKCS#8, optionally encrypted)."""
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except TypeError as e:  # encrypted without a password, or a password for a plain key
        raise _refuse(BAD_KEY, path, str(e)) from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise _refuse(BAD_KEY, path, f"not a PEM private key: {e}") from None
    return _check_rsa(key, path)


def parse_fingerprint(text):
    """A fingerprint as written by people: hex with optional `sha256:` prefix and colons."""
    s = text.strip().lower()
    if s.startswith("sha256:"):
        s = s[7:]
    s = s.replace(":", "")
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        raise ValueError(f"not a SHA-256 fingerprint (64 hex digits): {text.strip()!r}")
    return s


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
        at least 2048 bits. `revoked_file` lists one fingerprint per line (`#` comments)."""
        try:
            names = sorted(os.listdir(trusted_dir))
        except OSError as e:
            raise _refuse(NO_TRUST_STORE, trusted_dir,
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
                raise _refuse(BAD_REVOCATION_LIST, revoked_file, str(e)) from None
            for lineno, line in enumerate(lines, 1):
                fields = line.split("#", 1)[0].split()
                if not fields:
                    continue
                try:
                    revoked.add(parse_fingerprint(fields[0]))
                except ValueError as e:
                    raise _refuse(BAD_REVOCATION_LIST, f"{revoked_file}:{lineno}", str(e)) from None
        return cls(keys, revoked, source=trusted_dir)

    def status(self, fp):
        if fp in self.revoked:
            return REVOKED_KEY
        return "trusted" if fp in self.keys else UNKNOWN_KEY

    def is_trusted(self, fp):
        return fp in self.keys and fp not in self.revoked

    def trusted(self):
        return {fp: k for fp, k in self.keys.items() if fp not in self.revoked}


# --- signatures ------------------------------------------------------------------------------

def _padding(algorithm, signing):
    if algorithm == PKCS1V15:
        return padding.PKCS1v15()
    # Signing: salt as long as the digest (openssl's rsa_pss_saltlen:-1, the most widely
    # verifiable). Verifying: any salt length (openssl's "auto"), as openssl -2/max signers use.
    salt = padding.PSS.DIGEST_LENGTH if signing else padding.PSS.AUTO
    return padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=salt)


def sign_digest(private_key, digest, algorithm=PKCS1V15):
    _check_rsa(private_key, "signing key")
    return private_key.sign(digest, _padding(algorithm, True), utils.Prehashed(hashes.SHA256()))


def verify_digest(public_key, signature, digest, algorithms=(PKCS1V15, PSS)):
    """The algorithm under which `signature` verifies `digest`, or None."""
    for algorithm in algorithms:
        try:
            public_key.verify(signature, digest, _padding(algorithm, False),
                              utils.Prehashed(hashes.SHA256()))
            return algorithm
        except InvalidSignature:
            pass
    return None


def _mgf1_sha256(seed, length):
    blocks = (hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range((length + 31) // 32))
    return b"".join(blocks)[:length]


_SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")


MADE_PKCS1, MADE_PSS = 2, 1   # made_by's answers: certain, probable


def made_by(public_key, signature):
    """Whether `signature` was made with this key's private half over *some* SHA-256 digest:
    MADE_PKCS1 when its PKCS#1 v1.5 encoding opens (a fixed 200-odd-byte pattern: certain),
    MADE_PSS when its PSS encoding does (the 0xbc trailer and the 0x01 separator: about 1 in
    32768 signatures by another key pass this too, with a maximal salt), else 0. Tells "right
    key, wrong bytes" (bad signature) from "another key" (unknown key) for detached
    signatures, which name no key."""
    numbers = public_key.public_numbers()
    k = (public_key.key_size + 7) // 8
    s = int.from_bytes(signature, "big")
    if len(signature) != k or s >= numbers.n:
        return 0
    em = pow(s, numbers.e, numbers.n).to_bytes(k, "big")
    if em == b"\x00\x01" + b"\xff" * (k - 54) + b"\x00" + _SHA256_DIGEST_INFO + em[-32:]:
        return MADE_PKCS1
    em_bits = public_key.key_size - 1  # RFC 8017 9.1.2: EM = maskedDB || H || 0xbc
    em_len = (em_bits + 7) // 8
    if em[: k - em_len].strip(b"\x00") or em[-1] != 0xBC:
        return 0
    em = em[k - em_len:]
    h = em[-33:-1]
    db = bytearray(a ^ b for a, b in zip(em[: em_len - 33], _mgf1_sha256(h, em_len - 33)))
    db[0] &= 0xFF >> (8 * em_len - em_bits)
    rest = bytes(db).lstrip(b"\x00")
    return MADE_PSS if rest[:1] == b"\x01" else 0


@dataclass(frozen=True)
class SignatureBlock:
    offset: int  # where the block starts; also the number of bytes it signs
    algorithm: int
    fingerprint: str
    signature: bytes

    @property
    def length(self):
        return _HEADER.size + len(self.signature) + _TRAILER.size


def encode_block(offset, algorithm, fp, signature):
    """The appended block for a signature over file[0:offset] by the key with fingerprint `fp`."""
    length = _HEADER.size + len(signature) + _TRAILER.size
    header = _HEADER.pack(BLOCK_MAGIC, BLOCK_VERSION, algorithm, len(signature), offset,
                          bytes.fromhex(fp))
    return header + signature + _TRAILER.pack(length, TRAILER_MAGIC)


def _pread_exact(fd, n, offset):
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise EOFError(offset)
    return data


def read_blocks(fd, size, name):
    """The appended signature blocks of the open file, innermost (first appended) first.
    A damaged, truncated or displaced block raises SignatureError (MALFORMED_BLOCK)."""
    blocks = []
    end = size
    while end >= _HEADER.size + _TRAILER.size and len(blocks) < MAX_BLOCKS:
        length, magic = _TRAILER.unpack(_pread_exact(fd, _TRAILER.size, end - _TRAILER.size))
        if magic != TRAILER_MAGIC:
            break
        start = end - length
        framing = _HEADER.size + _TRAILER.size
        if not framing < length <= end or length - framing > MAX_SIGNATURE_BYTES:
            raise _refuse(MALFORMED_BLOCK, name,
                          f"trailer at offset {end - _TRAILER.size} states a block length of {length}")
        magic, version, algorithm, sig_len, signed, fp = _HEADER.unpack(_pread_exact(fd, _HEADER.size, start))
        where = f"block at offset {start} (trailer at {end - _TRAILER.size})"
        if magic != BLOCK_MAGIC:
            raise _refuse(MALFORMED_BLOCK, name,
                          f"{where}: no block header where the trailer's length {length} points")
        if version != BLOCK_VERSION:
            raise _refuse(MALFORMED_BLOCK, name, f"{where}: unsupported block version {version}")
        if algorithm not in ALGORITHM_NAMES:
            raise _refuse(MALFORMED_BLOCK, name, f"{where}: unknown algorithm {algorithm}")
        if sig_len != length - framing:
            raise _refuse(MALFORMED_BLOCK, name,
                          f"{where}: signature length {sig_len} disagrees with block length {length}")
        if signed != start:
            raise _refuse(MALFORMED_BLOCK, name,
                          f"{where}: signs {signed} bytes, but a block signs exactly the bytes before it")
        signature = _pread_exact(fd, sig_len, start + _HEADER.size)
        blocks.append(SignatureBlock(start, algorithm, fp.hex(), signature))
        end = start
    if not blocks:
        _look_for_displaced_block(fd, size, name)
    return blocks[::-1]


def _look_for_displaced_block(fd, size, name):
    """The file does not end in a block trailer; if a block header sits near the end anyway,
    the file was truncated, had data appended, or its trailer was damaged: say which."""
    tail_start = max(0, size - _TAIL_SCAN)
    tail = os.pread(fd, size - tail_start, tail_start)
    at = tail.rfind(BLOCK_MAGIC + struct.pack("<H", BLOCK_VERSION))
    if at < 0:
        return
    start = tail_start + at
    sig_len = _HEADER.unpack_from(tail, at)[3] if at + _HEADER.size <= len(tail) else 0
    block_end = start + _HEADER.size + min(sig_len, MAX_SIGNATURE_BYTES) + _TRAILER.size
    if size < block_end:
        detail = f"signature block at offset {start} needs {block_end} bytes, the file has {size}: truncated"
    elif size > block_end:
        detail = (f"{size - block_end} bytes of data after the signature block at offset {start} "
                  f"(which ends at {block_end})")
    else:
        detail = f"signature block at offset {start} has a damaged trailer"
    raise _refuse(MALFORMED_BLOCK, name, detail)


# --- hashing ---------------------------------------------------------------------------------

def hash_fd(fd, lengths, progress=None, chunk_size=HASH_CHUNK):
    """SHA-256 of each prefix file[0:n] for n in `lengths`, in one pass over the descriptor.

    A plain blocking function that a server runs in a worker thread; the GIL is free during
    each read. The digest comes from `cryptography`'s OpenSSL, which hashes about 1.3x
    faster than hashlib's on the same CPU (SHA extensions). `progress(done, total)` is
    called after every chunk. Raises EOFError if the file is shorter than the longest prefix."""
    targets = sorted(set(lengths))
    total = targets[-1] if targets else 0
    h = hashes.Hash(hashes.SHA256())
    digests = {}
    buf = memoryview(bytearray(min(chunk_size, max(total, 1))))
    if hasattr(os, "posix_fadvise") and total:
        os.posix_fadvise(fd, 0, total, os.POSIX_FADV_SEQUENTIAL)
    done = 0
    for target in targets:
        while done < target:
            n = os.preadv(fd, [buf[: min(len(buf), target - done)]], done)
            if n == 0:
                raise EOFError(done)
            h.update(buf[:n])
            done += n
            if progress is not None:
                progress(done, total)
        digests[target] = h.copy().finalize()
    return digests


# --- verified opening ------------------------------------------------------------------------

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
    `signer`: the accepted key's fingerprint, or None when the file was not verified."""

    def __init__(self, fd, path, size, signed_length, signer=None, kind=None, algorithm=None):
        self.fd, self.path, self.size, self.signed_length = fd, path, size, signed_length
        self.signer, self.kind, self.algorithm = signer, kind, algorithm

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


def _stat_key(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _check_owner_and_mode(st, what, name):
    if st.st_uid not in (0, os.geteuid()):
        raise _refuse(UNSAFE_PERMISSIONS, name,
                      f"{what} is owned by uid {st.st_uid}, neither root nor uid {os.geteuid()} "
                      "that verifies it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(UNSAFE_PERMISSIONS, name,
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
                raise _refuse(SYMLINK, path, "is a symbolic link; open models by their real path") from None
            raise OSError(e.errno, e.strerror, path) from None  # name the path, not the basename
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(UNSAFE_PERMISSIONS, path, "is not a regular file")
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
            raise _refuse(BAD_SIGNATURE, path + ".sig", "is not a regular file")
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
        raise _refuse(NO_TRUST_STORE, path, "signatures are required but no trusted keys were given")

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
    key = _stat_key(st)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and trust.is_trusted(hit[0]):
        signer, kind, algorithm, payload_end = hit
        return VerifiedFile(fd, path, size, payload_end, signer, kind, algorithm)

    try:
        blocks = read_blocks(fd, size, path)
    except EOFError:
        raise _refuse(CHANGED, path, "file shrank while its signature blocks were read") from None
    payload_end = blocks[0].offset if blocks else size
    detached = _read_detached(dfd, path)
    if detached is not None and len(detached) > MAX_DETACHED_BYTES:
        raise _refuse(BAD_SIGNATURE, path + ".sig", f"over {MAX_DETACHED_BYTES} bytes, not a signature")
    if not blocks and detached is None:
        if require_signature:
            raise _refuse(UNSIGNED, path, f"no appended signature block and no {os.path.basename(path)}.sig")
        return VerifiedFile(fd, path, size, size)

    lengths = [b.offset for b in blocks] + ([size] if detached is not None else [])
    try:
        digests = hash_fd(fd, lengths, progress)
    except EOFError as e:
        raise _refuse(CHANGED, path, f"file ended at offset {e.args[0]}, before {max(lengths)}") from None
    after = os.fstat(fd)
    if _stat_key(after) != key:
        raise _refuse(CHANGED, path, "size, modification time, change time or inode differ after hashing")

    signer, kind, algorithm = _judge(path, trust, blocks, detached, digests, size)
    # A file changed within the file system's timestamp granularity of now could change again
    # without a new timestamp: such results are not cached (as git does with "racy" entries).
    if cache is not None and time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > _CACHE_SETTLE_NS:
        cache.put(key, (signer, kind, algorithm, payload_end))
    return VerifiedFile(fd, path, size, payload_end, signer, kind, algorithm)


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
    raise _refuse(refusals[0][0], path, "; ".join(detail for _, detail in refusals))


# --- signing ---------------------------------------------------------------------------------

def _fsync_dir(directory):
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_file_atomic(path, data, mode=0o644, overwrite=True):
    """Write `data` to a temporary file beside `path`, fsync, then rename (or, with
    overwrite=False, hard-link so an existing file is never replaced). Readers see the old
    file or the complete new one, never a partial write."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # FileExistsError if it exists
            os.unlink(tmp)
        _fsync_dir(directory)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _copy_fd(src, dst, size):
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(src, dst, size - done, done, done)
            if n == 0:
                raise EOFError(done)
            done += n
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        while done < size:
            chunk = os.pread(src, min(HASH_CHUNK, size - done), done)
            if not chunk:
                raise EOFError(done) from None
            done += os.pwrite(dst, chunk, done)


def sign_file(path, private_key, *, detached=False, pss=False, progress=None):
    """Sign a model file; returns the path written. Appended: the file is copied to a temporary
    file beside it, the copy hashed and its block appended, then renamed over the original.
    Detached: PATH.sig is written the same way. Nothing half-written is ever left behind.
    Signing through a symlink appends to the file it points to and keeps the link."""
    algorithm = PSS if pss else PKCS1V15
    _check_rsa(private_key, "signing key")
    fp = fingerprint(private_key)
    if not detached:
        path = os.path.realpath(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(UNSAFE_PERMISSIONS, path, "is not a regular file")
        if detached:
            digest = hash_fd(fd, [st.st_size], progress)[st.st_size]
            if _stat_key(os.fstat(fd)) != _stat_key(st):
                raise _refuse(CHANGED, path, "the file changed while it was being signed")
            out = path + ".sig"
            write_file_atomic(out, sign_digest(private_key, digest, algorithm), creation_mode())
            return out
        directory = os.path.dirname(os.path.abspath(path))
        tfd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            _copy_fd(fd, tfd, st.st_size)
            if _stat_key(os.fstat(fd)) != _stat_key(st):
                raise _refuse(CHANGED, path, "the file changed while it was being copied for signing")
            digest = hash_fd(tfd, [st.st_size], progress)[st.st_size]
            block = encode_block(st.st_size, algorithm, fp, sign_digest(private_key, digest, algorithm))
            os.pwrite(tfd, block, st.st_size)
            os.fchmod(tfd, stat.S_IMODE(st.st_mode))
            os.fsync(tfd)
            os.close(tfd)
            tfd = -1
            os.replace(tmp, path)
            _fsync_dir(directory)
        except BaseException:
            if tfd >= 0:
                os.close(tfd)
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
        return path
    finally:
        os.close(fd)


def generate_key(bits=3072):
    if bits < MIN_RSA_BITS:
        raise _refuse(KEY_TOO_SMALL, f"--bits {bits}", f"at least {MIN_RSA_BITS} bits required")
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def public_key_path(private_path):
    """KEY.pem -> KEY.pub.pem (any other name gets .pub.pem appended)."""
    base = private_path[:-4] if private_path.endswith(".pem") else private_path
    return base + ".pub.pem"


def private_pem(private_key):
    return private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())


def public_pem(key):
    if isinstance(key, rsa.RSAPrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
