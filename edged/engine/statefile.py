"""Prompt-cache files: a session's tokens, KV cache rows and recurrent states on disk, bound to
what computed them.

    key = statefile.load_key(state_dir)          # 32 random bytes, made on first use, 0600
    statefile.save(session, path, key)           # atomic: temp file, fsync, rename, fsync dir
    n = statefile.restore(session, path, key)    # StateFileError (nothing used) or n tokens

Layout (little-endian; docs/daemon.md, "Prompt cache on disk"):

    header   HEADER (248 bytes): magic, version, header size, model SHA-256, signer, architecture,
             backend, kernel path, build id, K/V cache types, attention layers, n_ctx, bytes of
             one position's K and V rows over every attention layer, n_tokens, convolution
             layers and their row bytes, recurrent states and their floats
    tokens   n_tokens x uint32
    K rows   per attention layer: n_tokens rows of the layer's K row bytes (the used rows only,
             position order). A layer's row is its own size (gemma4: head size and KV heads
             per layer); a layer that reads an earlier layer's cache has none
    V rows   per attention layer: n_tokens rows of the layer's V row bytes
    conv     per convolution layer (lfm2; none for other models): n_tokens rows of
             row_bytes_conv, the convolution cache kept per position beside the K/V rows
    states   per recurrent state (qwen35's DeltaNet layers; none for other models), ascending
             positions, at most the live state and its checkpoints: uint32 position, then
             state_floats float32 (engine/recurrent.py's layout). A state cannot be cut back
             to an earlier position: a session restored to fewer tokens than the newest state's
             restores the newest one at or before them and replays the rest
    mac      HMAC-SHA256 with the installation's key over every byte before it

A file is used only when every header field equals the session's (model bytes, signer, cache
types, context size, backend, kernel path and the build of the code that computed the rows:
the reproducibility guarantee is per kernel path and build, docs/engine.md), its size is
exactly what the header says, and the MAC verifies. Sizes are checked against the header and
the file size before anything is read; the rows are read straight into the session's cache
and the session holds no tokens until the MAC has verified, so a refused file is never half
used.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import struct
import weakref

import numpy as np

from .recurrent import N_CHECKPOINTS
from .vision import id_limit
from ..errors import ConfigError, StateFileError
from ..format.gguf import GGMLType

MAGIC = b"EDGEDKV\x00"
VERSION = 4     # 3: K/V rows of the attention layers only, recurrent states; 4: rows of each
                # layer's own size (row_bytes_k/v: one position's over every attention layer)
KEY_BYTES = 32
MAC_BYTES = 32
KEY_FILE = "cache.key"
SUFFIX = ".edkv"
# magic, version, header bytes, model sha256, signer, arch, backend, kernel path, build id,
# type_k, type_v, n_kv_layers, n_ctx, row_bytes_k, row_bytes_v, n_tokens, n_conv, row_bytes_conv,
# n_states, state_floats, reserved
HEADER = struct.Struct("<8sII32s64s24s16s16s32sIIIIIIIIIIII")
_NAMES = ("magic", "version", "header_bytes", "model_sha256", "signer", "arch", "backend",
          "kernel_path", "build_id", "type_k", "type_v", "n_kv_layers", "n_ctx", "row_bytes_k",
          "row_bytes_v", "n_tokens", "n_conv", "row_bytes_conv", "n_states", "state_floats",
          "reserved")
_TEXT = {"signer": 64, "arch": 24, "backend": 16, "kernel_path": 16}
_CHUNK = 1 << 22

_digests = weakref.WeakKeyDictionary()   # Model -> SHA-256 of its file (hashed once)
_builds = {}                             # backend class -> build id


def model_digest(model):
    """SHA-256 of the model file's bytes (up to the signed length): the trust layer's digest
    when it hashed the file, else hashed once from the mapping."""
    d = _digests.get(model)
    if d is None:
        d = getattr(model._verified, "sha256", None)
        if d is None:
            h = hashlib.sha256()
            view = memoryview(model.file._map)[:model.file.file_size]
            for i in range(0, len(view), _CHUNK):
                h.update(view[i:i + _CHUNK])
            view.release()
            d = h.digest()
        _digests[model] = d
    return d


def build_id(backend):
    """SHA-256 of the code that computes the rows: the compiled core for the cpu backend, the
    engine's Python modules for the reference backend (its families' passes live in several).
    Another build gives another id, and its files are recomputed."""
    cls = type(backend)
    d = _builds.get(cls)
    if d is None:
        h = hashlib.sha256()
        for path in backend.code_files:
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        d = _builds[cls] = h.digest()
    return d


def _model_fields(m):
    """The header fields that depend on the model and its configuration only."""
    be = m.backend
    return {"model_sha256": model_digest(m), "signer": m.signer or "", "arch": m.arch,
            "backend": be.name, "kernel_path": be.kernel_path, "build_id": build_id(be),
            "type_k": int(m.cache.k), "type_v": int(m.cache.v), "n_kv_layers": m.hp.n_kv_layers,
            "n_conv": m.hp.n_conv_layers, "state_floats": m.hp.recurrent_state_floats()}


def _caches(session):
    """The session's row caches in file order, each a uint8 view (n_ctx, row bytes): the K rows
    of each attention layer, then their V rows, then each convolution layer's rows."""
    be = session.model.backend
    kv = be.kv_layers(session._buf)
    conv = be.conv_cache(session._buf) if session.model.hp.n_conv_layers else ()
    return [("K rows", k) for k, _ in kv] + [("V rows", v) for _, v in kv] + \
        [("convolution rows", c) for c in conv]


def _states(session, n):
    """The recurrent states a file of `session`'s first n tokens carries, [(position, float32
    array)] ascending: the checkpoints at or before n and the live state when it is there too
    (a session truncated and not yet evaluated again holds a live state past its tokens)."""
    rs = session.model.backend.recurrent(session._buf)
    if rs is None:
        return []
    states = [(p, c) for p, c in rs.checkpoints if p <= n]
    if 0 < rs.pos <= min(n, session.n_past) and (not states or states[-1][0] < rs.pos):
        states.append((rs.pos, rs.live))
    return states


def _header(session, n_tokens, n_states=0):
    """The header fields a file of `session`'s first n_tokens would carry (a dict)."""
    row = {"K rows": 0, "V rows": 0, "convolution rows": 0}
    for what, rows in _caches(session):
        row[what] = rows.shape[1] if what == "convolution rows" else row[what] + rows.shape[1]
    return {"magic": MAGIC, "version": VERSION, "header_bytes": HEADER.size,
            **_model_fields(session.model), "n_ctx": session.n_ctx, "row_bytes_k": row["K rows"],
            "row_bytes_v": row["V rows"], "n_tokens": n_tokens,
            "row_bytes_conv": row["convolution rows"], "n_states": n_states, "reserved": 0}


def _compare(h, want):
    for field, value in want.items():
        if h[field] != value:
            raise StateFileError(f"the file's {field} {_describe(field, h[field])} differs "
                                 f"from this session's {_describe(field, value)}")


def check_model(h, model):
    """StateFileError unless header h (read_header) was made by this model and configuration,
    and its token count fits its context: what Session.load checks before it allocates."""
    _compare(h, _model_fields(model))
    if not 0 < h["n_tokens"] <= h["n_ctx"] <= model.n_ctx_train:
        raise StateFileError(f"{h['n_tokens']} tokens for a context of {h['n_ctx']} (the "
                             f"model's is at most {model.n_ctx_train})")


def _pack(h):
    t = {f: h[f].encode("ascii") for f in _TEXT}
    for f, n in _TEXT.items():
        if len(t[f]) > n:
            raise StateFileError(f"{f} {h[f]!r} is longer than the header's {n} bytes")
    return HEADER.pack(h["magic"], h["version"], h["header_bytes"], h["model_sha256"],
                       t["signer"], t["arch"], t["backend"], t["kernel_path"], h["build_id"],
                       *(h[f] for f in _NAMES[9:]))


def _unpack(raw):
    h = dict(zip(_NAMES, HEADER.unpack(raw)))
    for f in _TEXT:
        b = h[f].rstrip(b"\x00")
        try:
            h[f] = b.decode("ascii")
        except UnicodeDecodeError:
            raise StateFileError(f"header field {f} is not ASCII") from None
    return h


def _describe(f, value):
    if f in ("type_k", "type_v"):
        return GGMLType(value).name.lower() if value in GGMLType._value2member_map_ else str(value)
    if isinstance(value, bytes):
        return value.hex()[:16] if f != "magic" else repr(value)
    return repr(value)


def file_size(h):
    """Bytes of the file header h describes: the format's one size formula."""
    n = h["n_tokens"]
    return HEADER.size + 4 * n + n * (h["row_bytes_k"] + h["row_bytes_v"]) + \
        h["n_conv"] * n * h["row_bytes_conv"] + h["n_states"] * 4 * (1 + h["state_floats"]) + \
        MAC_BYTES


# --- writing ------------------------------------------------------------------------------

def fsync_dir(d):
    fd = os.open(d or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(session, path, key, n_tokens=None):
    """Write the first n_tokens (default all) of `session`'s tokens and KV rows to `path`,
    atomically: a temporary file in the same directory (mode 0600), fsync, rename, fsync of the
    directory. On any failure (a full disk) the temporary file is removed and the error raised;
    `path` is then what it was before. Returns the file's size."""
    n = session.n_past if n_tokens is None else int(n_tokens)
    if not 0 < n <= session.n_past:
        raise StateFileError(f"cannot save {n} tokens of a session holding {session.n_past}")
    _check_key(key)
    states = _states(session, n)
    h = _header(session, n, len(states))
    path = os.fspath(path)
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        mac = hmac.new(key, digestmod=hashlib.sha256)
        with os.fdopen(fd, "wb", closefd=False) as f:
            def put(b):
                mac.update(b)
                f.write(b)
            put(_pack(h))
            put(np.asarray(session.tokens[:n], dtype="<u4").tobytes())
            for _, rows in _caches(session):      # uint8 (n_ctx, row bytes) per layer
                put(rows[:n])             # (n, row bytes): contiguous, written without a copy
            for pos, state in states:
                put(struct.pack("<I", pos))
                put(np.ascontiguousarray(state, "<f4"))
            f.write(mac.digest())
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)
    return file_size(h)


# --- reading ------------------------------------------------------------------------------

def _read_exact(f, buf, what):
    view = memoryview(buf).cast("B")
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise StateFileError(f"file ends inside the {what}")
        got += n


def read_header(path):
    """(header dict, tokens list, file size) of a cache file, unverified (an index's hint; the
    MAC is checked by restore). Raises StateFileError or OSError."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        h = _read_header(f, size)
        tokens = np.empty(h["n_tokens"], "<u4")
        _read_exact(f, tokens, "tokens")
        return h, tokens.tolist(), size


def _open(path):
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StateFileError("not a regular file")
    return os.fdopen(fd, "rb", buffering=0)


def _read_header(f, size):
    if size < HEADER.size + MAC_BYTES:
        raise StateFileError(f"{size} bytes is too short for the header and MAC "
                             f"({HEADER.size + MAC_BYTES})")
    raw = bytearray(HEADER.size)
    _read_exact(f, raw, "header")
    h = _unpack(bytes(raw))
    if h["magic"] != MAGIC:
        raise StateFileError(f"bad magic {h['magic']!r} (not a prompt-cache file)")
    if h["version"] != VERSION or h["header_bytes"] != HEADER.size or h["reserved"]:
        raise StateFileError(f"format version {h['version']} (header {h['header_bytes']} bytes): "
                             f"this build reads version {VERSION} ({HEADER.size} bytes)")
    if h["n_states"] > 1 + N_CHECKPOINTS:
        raise StateFileError(f"{h['n_states']} recurrent states: a session keeps at most "
                             f"{1 + N_CHECKPOINTS}")
    want = file_size(h)
    if want != size:
        raise StateFileError(f"file is {size} bytes, its header describes {want} "
                             f"({h['n_tokens']} tokens): truncated or padded")
    h["raw"] = bytes(raw)
    return h


def restore(session, path, key, n_tokens=None):
    """Replace `session`'s contents with the file's first n_tokens (default all) tokens and KV
    rows. Returns the number of tokens restored. StateFileError when the file does not match
    the session's model and configuration, is truncated, or its MAC does not verify: the
    session then holds no tokens (its previous contents are gone, nothing of the file is used).
    OSError (a missing file) leaves the session as it was."""
    _check_key(key)
    try:
        return _restore(session, path, key, n_tokens)
    except StateFileError:
        session.tokens = []
        raise


def _restore(session, path, key, n_tokens):
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        h = _read_header(f, size)
        _compare(h, _header(session, h["n_tokens"], h["n_states"]))
        n = h["n_tokens"]
        if not 0 < n <= session.n_ctx:
            raise StateFileError(f"{n} tokens for a context of {session.n_ctx}")
        mac = hmac.new(key, h["raw"], hashlib.sha256)
        tokens = np.empty(n, "<u4")
        _read_exact(f, tokens, "tokens")
        mac.update(tokens)
        session.tokens = []         # from here the cache rows are overwritten: nothing is held
        for what, rows in _caches(session):
            dst = rows[:n]
            _read_exact(f, dst, what)
            mac.update(dst)
        states = []
        for _ in range(h["n_states"]):   # read aside: the live state changes after the MAC
            pos, state = np.empty(1, "<u4"), np.empty(h["state_floats"], "<f4")
            for what, a in (("state position", pos), ("recurrent state", state)):
                _read_exact(f, a, what)
                mac.update(a)
            states.append((int(pos[0]), state))
        tag = bytearray(MAC_BYTES)
        _read_exact(f, tag, "MAC")
        if not hmac.compare_digest(mac.digest(), bytes(tag)):
            raise StateFileError("HMAC does not verify (the file was altered, or written with "
                                 "another key)")
    nv = session.model.hp.n_vocab
    if int(tokens.max()) >= id_limit(nv):   # image rows are ids >= n_vocab (engine/vision.py)
        raise StateFileError(f"token id {int(tokens.max())} out of range [0, {nv}) and not an "
                             "image row")
    where = [p for p, _ in states]
    if where != sorted(set(where)) or not all(0 < p <= n for p in where):
        raise StateFileError(f"recurrent states at positions {where}: not ascending within "
                             f"the file's {n} tokens")
    rs = session.model.backend.recurrent(session._buf)
    if rs is not None:
        rs.rewind(0)
        if states:       # Session replays from the newest state at or before what it keeps
            rs.pos, rs.live[:] = states[-1][0], states[-1][1]
            rs.checkpoints = states[-N_CHECKPOINTS:]
    keep = n if n_tokens is None else max(0, min(int(n_tokens), n))
    session.tokens = tokens[:keep].tolist()
    return keep


# --- the installation's key ---------------------------------------------------------------

def _check_key(key):
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ConfigError(f"prompt-cache key: expected {KEY_BYTES} bytes")


def default_state_dir():
    """Where the command line and the Python API keep their key: $EDGED_STATE_DIR, else
    $XDG_STATE_HOME/edged, else ~/.local/state/edged. (The daemon's is its cache_dir.)"""
    d = os.environ.get("EDGED_STATE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "edged")


def load_key(state_dir=None):
    """The installation's 32-byte MAC key, STATE_DIR/cache.key: created (0600, atomically) when
    missing. Refused (ConfigError) when it is not a regular file of 32 bytes owned by this user
    and unreadable by group and others. Deleting it rotates it: every cache file then fails its
    MAC and is recomputed."""
    d = os.fspath(state_dir or default_state_dir())
    path = os.path.join(d, KEY_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        os.makedirs(d, mode=0o700, exist_ok=True)
        tmp = os.path.join(d, f".{KEY_FILE}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
            os.close(fd)
            try:
                os.link(tmp, path)      # never replaces a key another process made meanwhile
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        fsync_dir(d)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"prompt-cache key {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != KEY_BYTES:
            raise ConfigError(f"prompt-cache key {path}: not a regular file of {KEY_BYTES} bytes "
                              "(delete it to make a new one)")
        if st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise ConfigError(f"prompt-cache key {path}: mode {stat.S_IMODE(st.st_mode):04o}, "
                              f"owner {st.st_uid}: must be 0600 and owned by uid {os.geteuid()}")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ConfigError(f"prompt-cache key {path}: read {len(key)} bytes, expected {KEY_BYTES}")
    return key
