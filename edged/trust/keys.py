"""RSA keys and signatures over SHA-256 digests: fingerprints, PEM public keys (strictly one
per file), verification with PKCS#1 v1.5 or PSS, and telling which key made a signature that
names none. What the daemon needs to check a signature, and nothing to make one."""
import hashlib
import re

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils

from .rules import BAD_KEY, KEY_TOO_SMALL, refuse

MIN_RSA_BITS = 2048
PKCS1V15, PSS = 1, 2
ALGORITHM_NAMES = {PKCS1V15: "RSA-PKCS1v15-SHA256", PSS: "RSA-PSS-SHA256"}
MAX_KEY_FILE_BYTES = 1 << 20
_PEM_BEGIN = re.compile(rb"^-----BEGIN ([A-Z0-9 ]+)-----\s*$")
_PEM_END = re.compile(rb"^-----END ([A-Z0-9 ]+)-----\s*$")


def fingerprint(key):
    """SHA-256 of the DER SubjectPublicKeyInfo of `key` (public or private), lowercase hex.
    The same as `openssl pkey -pubin -in PUB.pem -outform DER | sha256sum`."""
    if isinstance(key, rsa.RSAPrivateKey):
        key = key.public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def check_rsa(key, source):
    if not isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        kind = type(key).__name__.lstrip("_")
        raise refuse(BAD_KEY, source, f"{kind} is not an RSA key; edged accepts RSA keys only")
    if key.key_size < MIN_RSA_BITS:
        raise refuse(KEY_TOO_SMALL, source,
                     f"{key.key_size}-bit RSA key; at least {MIN_RSA_BITS} bits required")
    return key


def load_public_key(path):
    """The one RSA public key (PEM, at least 2048 bits) a key file holds. Refused, with the file
    and line named: other key types, a private key, a second PEM block (say a public key
    followed by a private one), and any text outside the block."""
    with open(path, "rb") as f:
        data = f.read(MAX_KEY_FILE_BYTES + 1)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise refuse(BAD_KEY, path, f"over {MAX_KEY_FILE_BYTES} bytes, not a public key file")
    begin = end = stray = None
    for lineno, line in enumerate(data.splitlines(), 1):
        if begin is not None and end is None:
            if m := _PEM_END.match(line):
                end = lineno
            continue
        if m := _PEM_BEGIN.match(line):
            label = m.group(1).decode()
            if begin is not None:
                raise refuse(BAD_KEY, f"{path}:{lineno}", f"a second PEM block ({label}) after the one "
                             f"at line {begin}; a key file holds exactly one public key")
            if "PRIVATE" in label:
                raise refuse(BAD_KEY, f"{path}:{lineno}",
                             f"{label}: a private key; put only public keys in the trust store")
            begin = lineno
        elif line.strip() and stray is None:
            stray = lineno
    if begin is None or end is None:
        raise refuse(BAD_KEY, path, "not a PEM public key: no complete -----BEGIN/END----- block")
    if stray is not None:
        raise refuse(BAD_KEY, f"{path}:{stray}", "not a PEM public key file: text outside its PEM "
                     "block; a key file holds exactly one PEM public key and nothing else")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise refuse(BAD_KEY, f"{path}:{begin}", f"not a PEM public key: {e}") from None
    return check_rsa(key, path)


def parse_fingerprint(text):
    """A fingerprint as written by people: hex with optional `sha256:` prefix and colons."""
    s = text.strip().lower()
    if s.startswith("sha256:"):
        s = s[7:]
    s = s.replace(":", "")
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        raise ValueError(f"not a SHA-256 fingerprint (64 hex digits): {text.strip()!r}")
    return s


def padding_for(algorithm, signing):
    if algorithm == PKCS1V15:
        return padding.PKCS1v15()
    # Signing: salt as long as the digest (openssl's rsa_pss_saltlen:-1, the most widely
    # verifiable). Verifying: any salt length (openssl's "auto"), as openssl -2/max signers use.
    salt = padding.PSS.DIGEST_LENGTH if signing else padding.PSS.AUTO
    return padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=salt)


def verify_digest(public_key, signature, digest, algorithms=(PKCS1V15, PSS)):
    """The algorithm under which `signature` verifies `digest`, or None."""
    for algorithm in algorithms:
        try:
            public_key.verify(signature, digest, padding_for(algorithm, False),
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

