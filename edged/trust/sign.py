"""Making signatures (used by `edged sign` and `edged keygen`, never by the daemon): RSA key
generation and PEM output, signing a model with an appended block or a detached .sig, and
atomic writes, so nothing half-written is ever left behind."""
import errno
import os
import stat
import tempfile

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa, utils

from .blocks import HASH_CHUNK, encode_block, hash_fd
from .keys import MIN_RSA_BITS, PKCS1V15, PSS, check_rsa, fingerprint, padding_for
from .rules import BAD_KEY, CHANGED, KEY_TOO_SMALL, UNSAFE_PERMISSIONS, refuse
from .verify import stat_key


def load_private_key(path, password=None):
    """An RSA private key from a PEM file (PKCS#1 or PKCS#8, optionally encrypted)."""
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except TypeError as e:  # encrypted without a password, or a password for a plain key
        raise refuse(BAD_KEY, path, str(e)) from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise refuse(BAD_KEY, path, f"not a PEM private key: {e}") from None
    return check_rsa(key, path)


def sign_digest(private_key, digest, algorithm=PKCS1V15):
    check_rsa(private_key, "signing key")
    return private_key.sign(digest, padding_for(algorithm, True), utils.Prehashed(hashes.SHA256()))


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
    check_rsa(private_key, "signing key")
    fp = fingerprint(private_key)
    if not detached:
        path = os.path.realpath(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(UNSAFE_PERMISSIONS, path, "is not a regular file")
        if detached:
            digest = hash_fd(fd, [st.st_size], progress)[st.st_size]
            if stat_key(os.fstat(fd)) != stat_key(st):
                raise refuse(CHANGED, path, "the file changed while it was being signed")
            out = path + ".sig"
            write_file_atomic(out, sign_digest(private_key, digest, algorithm), 0o644)
            return out
        directory = os.path.dirname(os.path.abspath(path))
        tfd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            _copy_fd(fd, tfd, st.st_size)
            if stat_key(os.fstat(fd)) != stat_key(st):
                raise refuse(CHANGED, path, "the file changed while it was being copied for signing")
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
        raise refuse(KEY_TOO_SMALL, f"--bits {bits}", f"at least {MIN_RSA_BITS} bits required")
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
