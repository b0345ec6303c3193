"""Prompt-cache files (engine/statefile.py): a restored session gives the bits of recomputation,
and a file that does not match, is damaged, or was MAC'd with another key is refused whole."""
import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT
from small_fs import small_tmpfs
from edged import Model
from edged.engine import statefile
from edged.engine.model import Session
from edged.errors import ConfigError, StateFileError

pytest.importorskip("edged._core")

KVQ = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-kv-q8_0.gguf")  # head_dim 32
OTHER = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-gemma2.gguf")
PROMPT = [1, 5, 9, 200, 17, 3, 44, 81, 2, 7, 300, 12, 64, 99, 5, 6, 250, 11, 18, 40]
NEXT = [33, 71, 8]
KEY = bytes(range(32))


def load(ck="f16", cv="f16", path=KVQ):
    return Model.load(path, n_threads=2, cache_type_k=ck, cache_type_v=cv)


def saved(tmp_path, ck="f16", cv="f16", n_ctx=64):
    path = tmp_path / "p.edkv"
    with load(ck, cv) as m, m.session(n_ctx=n_ctx) as s:
        s.eval(PROMPT)
        size = s.save(path, KEY)
    assert size == os.path.getsize(path)
    return path


@pytest.mark.parametrize("ck, cv", [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "f16")])
def test_restored_session_gives_the_bits_of_recomputation(tmp_path, ck, cv):
    path = tmp_path / "p.edkv"      # saved by another process: a restart
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from edged import Model
        with Model.load({KVQ!r}, n_threads=2, cache_type_k={ck!r}, cache_type_v={cv!r}) as m:
            s = m.session(n_ctx=64)
            s.eval({PROMPT!r})
            s.save({str(path)!r}, {KEY!r})
    """)], check=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    with load(ck, cv) as m:
        with m.session(n_ctx=64) as fresh:
            fresh.eval(PROMPT)
            want = fresh.eval(NEXT, logits="all")
        with Session.load(m, path, KEY) as s:
            assert s.tokens == PROMPT and s.n_ctx == 64
            assert np.array_equal(s.eval(NEXT, logits="all"), want)
        # a prefix of the file: the first 12 rows, the rest evaluated again
        with m.session(n_ctx=64) as s:
            assert statefile.restore(s, path, KEY, n_tokens=12) == 12
            s.eval(PROMPT[12:])
            assert np.array_equal(s.eval(NEXT, logits="all"), want)


def test_file_holds_the_used_rows_only(tmp_path):
    path = saved(tmp_path, "q8_0", "q8_0")
    with load("q8_0", "q8_0") as m:
        hp = m.hp
        row = hp.n_head_kv * hp.head_dim // 32 * 34          # q8_0: 34 bytes per 32 values
        assert os.path.getsize(path) == (statefile.HEADER.size + 4 * len(PROMPT) + hp.n_kv_layers
                                         * len(PROMPT) * 2 * row + statefile.MAC_BYTES)


def _refused(path, match, ck="f16", cv="f16", n_ctx=64, key=KEY, model=KVQ):
    with load(ck, cv, model) as m, m.session(n_ctx=n_ctx) as s:
        s.eval([4, 4, 4])
        with pytest.raises(StateFileError, match=match):
            statefile.restore(s, path, key)
        assert s.n_past == 0        # nothing of the file, nothing of before: recomputed


def _at(field):
    """Offset of a u32 header field (the last ones of the header are u32)."""
    return statefile.HEADER.size - 4 * (len(statefile._NAMES) - statefile._NAMES.index(field))


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_flipped_bits_anywhere_are_refused(tmp_path):
    path = saved(tmp_path)
    good = path.read_bytes()
    size, H = len(good), statefile.HEADER.size
    cases = [(3, "magic"), (40, "model_sha256"), (_at("n_tokens"), "truncated or padded"),
             (H + 5, "HMAC"), (H + 4 * len(PROMPT) + 7, "HMAC"), (size // 2, "HMAC"),
             (size - 40, "HMAC"), (size - 1, "HMAC")]               # tokens, K, V, the MAC
    for offset, match in cases:
        path.write_bytes(good)
        _flip(path, offset)
        _refused(path, match)


def test_truncated_and_padded_files_are_refused(tmp_path):
    path = saved(tmp_path)
    good = path.read_bytes()
    for data in (good[:-1], good[:len(good) // 2], good[:100], good + b"\0"):
        path.write_bytes(data)
        _refused(path, "too short|truncated or padded")


def test_another_model_cache_type_context_key_or_build_is_refused(tmp_path):
    path = saved(tmp_path)
    _refused(path, "model_sha256", model=OTHER)
    _refused(path, "type_k f16 differs from this session's q8_0", ck="q8_0")
    _refused(path, "type_v", cv="q4_0")
    _refused(path, "n_ctx 64 differs from this session's 128", n_ctx=128)
    _refused(path, "HMAC does not verify", key=bytes(32))
    real = dict(statefile._builds)
    try:   # a file written by another build of the compiled core
        statefile._builds.update({k: b"\x01" * 32 for k in real})
        _refused(path, "build_id")
    finally:
        statefile._builds.clear()
        statefile._builds.update(real)


def test_key_is_made_once_private_and_checked(tmp_path):
    key = statefile.load_key(tmp_path / "state")
    kf = tmp_path / "state" / statefile.KEY_FILE
    assert len(key) == 32 and (kf.stat().st_mode & 0o777) == 0o600
    assert statefile.load_key(tmp_path / "state") == key
    kf.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644.*must be 0600"):
        statefile.load_key(tmp_path / "state")
    kf.chmod(0o600)
    kf.write_bytes(b"short")
    with pytest.raises(ConfigError, match="not a regular file of 32 bytes"):
        statefile.load_key(tmp_path / "state")
    kf.unlink()                     # rotation: a new key, and the old files fail their MAC
    assert statefile.load_key(tmp_path / "state") != key


def test_a_full_filesystem_leaves_no_file(tmp_path):
    with small_tmpfs(tmp_path / "small") as d, load() as m, m.session(n_ctx=512) as s:
        s.eval(list(range(1, 400)))     # ~100 KB of f16 rows: more than the 64 KB
        with pytest.raises(OSError) as e:
            s.save(d / "p.edkv", KEY)
        assert e.value.errno == errno.ENOSPC
        assert os.listdir(d) == []      # neither the file nor its temporary
        s.save(d / "small.edkv", KEY, n_tokens=8)   # room for a small one afterwards


def test_kill_during_a_write_leaves_the_old_file(tmp_path):
    path = saved(tmp_path)
    old = path.read_bytes()
    child = textwrap.dedent(f"""
        import os, sys
        from edged import Model
        m = Model.load({KVQ!r}, n_threads=1)
        s = m.session(n_ctx=64)
        s.eval(list(range(1, 30)))
        real = os.fsync
        def stall(fd):      # everything written to the temporary file, not yet renamed
            print("writing", flush=True)
            sys.stdin.readline()
        os.fsync = stall
        s.save({str(path)!r}, {KEY!r})
    """)
    p = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert p.stdout.readline() == b"writing\n"
        p.kill()
    finally:
        p.wait()
    assert path.read_bytes() == old         # the old file, whole
    with load() as m, Session.load(m, path, KEY) as s:
        assert s.tokens == PROMPT
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]   # only a hidden temporary


def test_generate_prompt_cache_creates_then_reuses_then_recomputes_a_bad_file(tmp_path):
    cache = tmp_path / "story.edkv"
    env = {**os.environ, "PYTHONPATH": ROOT, "EDGED_STATE_DIR": str(tmp_path / "state")}

    def generate():
        r = subprocess.run([sys.executable, "-m", "edged", "generate", "-m", KVQ, "-p",
                            "a b c d e f g h i j k l m n o p", "-n", "8", "--temp", "0",
                            "--json", "--prompt-cache", str(cache), "-t", "2"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), r.stderr

    first, _ = generate()
    assert cache.exists() and first["timings"]["prompt_tokens"] == first["n_prompt"]
    again, err = generate()
    assert "tokens restored" in err and again["timings"]["prompt_tokens"] == 1
    assert again["tokens"] == first["tokens"]           # the same bits, so the same text
    _flip(cache, os.path.getsize(cache) // 2)
    third, err = generate()
    assert "refused (HMAC does not verify" in err and "recomputing" in err
    assert third["tokens"] == first["tokens"] and third["timings"]["prompt_tokens"] == first["n_prompt"]
    _, err = generate()             # the recomputed state was saved again
    assert "tokens restored" in err


def test_a_signed_model_files_carry_its_digest_and_signer(tmp_path):
    from edged.trust import verify
    os.chmod(tmp_path, 0o755)
    (tmp_path / "trusted").mkdir(mode=0o755)

    def edged(*args):
        subprocess.run([sys.executable, "-m", "edged", *args], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    edged("keygen", "--bits", "2048", "--out", str(tmp_path / "k.pem"))
    os.rename(tmp_path / "k.pub.pem", tmp_path / "trusted" / "k.pub.pem")
    model = tmp_path / "m.gguf"
    model.write_bytes(open(KVQ, "rb").read())
    os.chmod(model, 0o644)
    unsigned_digest = hashlib.sha256(model.read_bytes()).digest()
    edged("sign", "--key", str(tmp_path / "k.pem"), str(model))
    os.utime(model, (1e9, 1e9))     # an old file: its verification is cached
    path = tmp_path / "p.edkv"
    for _ in range(2):      # the second open answers from the verification cache
        vf = verify.open_verified(model, str(tmp_path / "trusted"), require_signature=True)
        assert vf.sha256 == unsigned_digest         # the signed bytes: the file before its block
        with Model.load(str(model), verified=vf) as m, m.session(n_ctx=64) as s:
            assert statefile.model_digest(m) == unsigned_digest
            s.eval(PROMPT)
            s.save(path, KEY)
            s.reset()
            assert statefile.restore(s, path, KEY) == len(PROMPT)
    # the same bytes loaded without their signature: another signer field, refused
    _refused(path, "the file's signer '[0-9a-f]{64}' differs from this session's ''", model=KVQ)


def test_load_checks_the_header_before_allocating_its_context(tmp_path):
    path = saved(tmp_path)
    data = bytearray(path.read_bytes())
    n_ctx_at = _at("n_ctx")
    data[n_ctx_at:n_ctx_at + 4] = (1 << 31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with load("q8_0", "f16") as m:                      # another cache type: refused first
        with pytest.raises(StateFileError, match="type_k"):
            Session.load(m, path, KEY)
    with load() as m:           # the model's file, for a context of 2^31 tokens
        with pytest.raises(StateFileError, match="20 tokens for a context of 2147483648"):
            Session.load(m, path, KEY)


def test_the_reference_build_id_covers_every_family_pass(tmp_path, monkeypatch):
    """The reference backend's rows come from several modules (gemma3n's and granitehybrid's
    passes live beside reference.py): a change in any of them is another build."""
    from edged.engine.reference import ReferenceBackend
    paths = ReferenceBackend.code_files.fget(None)
    files = {os.path.basename(f) for f in paths}
    assert {"reference.py", "reference_gemma3n.py", "reference_granite.py", "recurrent.py"} <= files
    with Model.load(KVQ, backend="reference") as m:
        before = statefile.build_id(m.backend)
        changed = tmp_path / "reference_granite.py"
        changed.write_text("# another version\n")
        other = tuple(str(changed) if os.path.basename(f) == "reference_granite.py" else f for f in paths)
        monkeypatch.setattr(ReferenceBackend, "code_files", property(lambda self: other))
        monkeypatch.setattr(statefile, "_builds", {})
        assert statefile.build_id(m.backend) != before


@pytest.mark.parametrize("ck", ["f16", "q8_0"])
def test_reference_backend_files_round_trip_and_are_not_the_cpu_backends(tmp_path, ck):
    path = tmp_path / "p.edkv"
    with Model.load(KVQ, backend="reference", cache_type_k=ck, cache_type_v=ck) as m:
        with m.session(n_ctx=64) as s:
            s.eval(PROMPT)
            want = s.eval(NEXT, logits="all")
            s.save(path, KEY, n_tokens=len(PROMPT))
        with Session.load(m, path, KEY) as s:
            assert np.array_equal(s.eval(NEXT, logits="all"), want)
    _refused(path, "the file's backend 'reference' differs from this session's 'cpu'", ck, ck)


def test_mutated_files_raise_only_state_file_errors(tmp_path):
    """Overwrites, truncations and insertions anywhere: each refused with StateFileError (never
    another exception, an allocation from a bad size, or a half-restored session)."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    good = saved(tmp_path).read_bytes()
    path = tmp_path / "m.edkv"
    with load() as m, m.session(n_ctx=64) as s:
        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.integers(0, len(good) - 1), st.binary(min_size=1, max_size=8),
               st.sampled_from(["overwrite", "truncate", "insert"]))
        def check(at, data, how):
            if how == "overwrite":
                b = good[:at] + data + good[at + len(data):]
                b = b[:len(good)]
            elif how == "truncate":
                b = good[:at]
            else:
                b = good[:at] + data + good[at:]
            if b == good:
                return
            path.write_bytes(b)
            s.reset()
            s.eval([4, 4])
            with pytest.raises(StateFileError):
                statefile.restore(s, path, KEY)
            assert s.n_past == 0
        check()
