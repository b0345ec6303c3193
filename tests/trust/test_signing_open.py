"""open_verified: one descriptor opened without following links, safe permissions, hashing that
descriptor, changes during verification, the verification cache; CLI progress and atomicity."""
import hashlib
import io
import os
import threading

import pytest

from edged.trust.rules import BAD_SIGNATURE, CHANGED, NO_TRUST_STORE, REVOKED_KEY, SYMLINK, UNSAFE_PERMISSIONS
from edged.trust.store import TrustStore
from edged.trust.blocks import hash_fd
from edged.trust.verify import VerificationCache, open_verified, stat_key
from edged.trust.sign import sign_file
from edged.errors import SignatureError
from edged.commands.progress import ProgressBar
from signing_support import copy_model, edged, keys, make_trust_dir, refused, trust  # noqa: F401


@pytest.fixture
def signed(tmp_path, keys):
    path = copy_model(tmp_path)
    sign_file(path, keys["operator"].key)
    return path


def refusal(path, trust, rule, **kw):
    with pytest.raises(SignatureError) as e:
        open_verified(path, trust, True, cache=None, **kw)
    return refused(e, rule)


def test_hash_fd_digests_every_prefix_in_one_pass(tmp_path):
    data = os.urandom(100_003)
    p = tmp_path / "f"
    p.write_bytes(data)
    seen = []
    with open(p, "rb") as f:
        got = hash_fd(f.fileno(), [100_003, 7, 50_000, 7], lambda d, t: seen.append((d, t)), chunk_size=4097)
    assert got == {n: hashlib.sha256(data[:n]).digest() for n in (7, 50_000, 100_003)}
    assert seen[-1] == (100_003, 100_003) and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    with open(p, "rb") as f, pytest.raises(EOFError):
        hash_fd(f.fileno(), [100_004])


def test_descriptor_is_the_verified_file_even_if_the_path_is_replaced(tmp_path, signed, keys, trust):
    original = open(signed, "rb").read()
    with open_verified(signed, trust, True, cache=None) as vf:
        assert vf.signer == keys["operator"].fp
        assert os.fstat(vf.fd).st_ino == os.stat(signed).st_ino
        replacement = tmp_path / "evil"
        replacement.write_bytes(b"GGUF" + bytes(100))
        os.replace(replacement, signed)  # swapped after verification: the descriptor keeps the old file
        assert os.pread(vf.fd, len(original) + 1, 0) == original
        assert vf.signed_length == len(original) - 336 and vf.size == len(original)
    assert vf.fd == -1


def test_symlink_is_refused(tmp_path, signed, trust):
    link = tmp_path / "link.gguf"
    os.symlink(signed, link)
    assert "symbolic link" in refusal(str(link), trust, SYMLINK)


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_file_writable_by_group_or_others_is_refused(signed, trust, mode):
    os.chmod(signed, mode)
    assert f"mode {mode:04o}" in refusal(signed, trust, UNSAFE_PERMISSIONS)
    os.chmod(signed, 0o644)
    open_verified(signed, trust, True, cache=None).close()


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_directory_writable_by_group_or_others_is_refused(tmp_path, signed, trust, mode):
    d = tmp_path / "models"
    d.mkdir()
    path = d / "m.gguf"
    os.replace(signed, path)
    os.chmod(d, mode)
    assert str(d) in refusal(str(path), trust, UNSAFE_PERMISSIONS)
    os.chmod(d, 0o755)
    open_verified(str(path), trust, True, cache=None).close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_file_owned_by_another_user_is_refused(signed, trust):
    os.chown(signed, 4242, -1)
    assert "uid 4242" in refusal(signed, trust, UNSAFE_PERMISSIONS)


def test_fifo_is_refused_without_blocking(tmp_path, trust):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo, 0o644)
    assert "not a regular file" in refusal(str(fifo), trust, UNSAFE_PERMISSIONS)


def _wait_for_new_timestamp():
    # File times come from a coarse clock (a few ms): let the next write get a new one.
    threading.Event().wait(0.05)


def test_file_changed_during_verification_is_refused(signed, trust):
    _wait_for_new_timestamp()

    def tamper(done, total):
        with open(signed, "r+b") as f:
            f.seek(20000)
            f.write(b"\x00")

    assert "after hashing" in refusal(signed, trust, CHANGED, progress=tamper)


def test_file_grown_during_verification_is_refused(tmp_path, keys, trust):
    path = copy_model(tmp_path, as_name="d.gguf")
    sign_file(path, keys["operator"].key, detached=True)
    _wait_for_new_timestamp()

    def grow(done, total):
        with open(path, "ab") as f:
            f.write(b"more")

    refusal(path, trust, CHANGED, progress=grow)


def test_cache_skips_rehashing_until_anything_changes(monkeypatch, tmp_path, signed, keys, trust):
    monkeypatch.setattr("edged.trust.verify._CACHE_SETTLE_NS", 0)
    cache = VerificationCache()
    calls = []
    n = os.path.getsize(signed) - 336

    def open_once(trust=trust):
        calls.clear()
        with open_verified(signed, trust, True, cache=cache, progress=lambda d, t: calls.append(d)) as vf:
            assert (vf.kind, vf.algorithm, vf.signed_length) == ("appended", "RSA-PKCS1v15-SHA256", n)
            return vf.signer, bool(calls)

    assert open_once() == (keys["operator"].fp, True)
    assert open_once() == (keys["operator"].fp, False)  # cached: not hashed again
    os.utime(signed)  # any change of the stat key misses the cache
    assert open_once() == (keys["operator"].fp, True)
    assert open_once()[1] is False
    revoked = tmp_path / "revoke-operator"
    revoked.write_text(keys["operator"].fp + "\n")
    revoking = TrustStore.load(trust.source, str(revoked))
    with pytest.raises(SignatureError) as e:  # trust is checked on every hit
        open_verified(signed, revoking, True, cache=cache)
    refused(e, REVOKED_KEY)
    _wait_for_new_timestamp()
    with open(signed, "r+b") as f:
        f.seek(20000)
        f.write(b"\x55")
    with pytest.raises(SignatureError) as e:
        open_verified(signed, trust, True, cache=cache)
    refused(e, BAD_SIGNATURE)


def test_recently_changed_files_are_not_cached(signed, trust):
    cache = VerificationCache()
    open_verified(signed, trust, True, cache=cache).close()
    assert cache.get(stat_key(os.stat(signed))) is None


def test_verification_runs_in_threads(tmp_path, keys, trust):
    paths = [copy_model(tmp_path, as_name=f"m{i}.gguf") for i in range(3)]
    for p in paths:
        sign_file(p, keys["vendor"].key, pss=True)
    results = [None] * len(paths)

    def work(i):
        with open_verified(paths[i], trust, True, cache=None) as vf:
            results[i] = vf.signer

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [keys["vendor"].fp] * len(paths)


def test_sign_preserves_mode_leaves_no_temp_files_and_fails_cleanly(tmp_path, keys):
    path = copy_model(tmp_path)
    os.chmod(path, 0o640)
    before = sorted(os.listdir(tmp_path))
    r = edged("sign", "--key", keys["operator"].private, path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == before and oct(os.stat(path).st_mode & 0o777) == "0o640"
    content = open(path, "rb").read()
    r = edged("sign", "--key", keys["small"].private, path)  # refused before anything is written
    assert r.returncode == 2 and open(path, "rb").read() == content and sorted(os.listdir(tmp_path)) == before
    r = edged("sign", "--key", str(tmp_path / "missing.pem"), path)
    assert r.returncode != 0 and open(path, "rb").read() == content and sorted(os.listdir(tmp_path)) == before
    r = edged("sign", "--key", keys["operator"].private, "--detached", "--append", path)
    assert r.returncode == 2 and "not allowed with" in r.stderr


def test_signing_through_a_symlink_signs_the_target_and_keeps_the_link(tmp_path, keys, trust):
    target = copy_model(tmp_path)
    link = tmp_path / "current.gguf"
    os.symlink("model.gguf", link)
    r = edged("sign", "--key", keys["operator"].private, str(link))
    assert r.returncode == 0, r.stderr
    assert os.readlink(link) == "model.gguf"
    with open_verified(target, trust, True, cache=None) as vf:
        assert vf.signer == keys["operator"].fp


def test_sign_failure_midway_removes_the_temporary_file(monkeypatch, tmp_path, keys):
    path = copy_model(tmp_path)
    before = sorted(os.listdir(tmp_path))

    def boom(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", boom)
    with pytest.raises(OSError):
        sign_file(path, keys["operator"].key)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before
    with pytest.raises(SignatureError):
        open_verified(path, TrustStore({}), True)


def test_cli_verify_output(signed, keys, trust):
    r = edged("verify", "--trusted", trust.source, signed)
    assert r.returncode == 0 and r.stderr == ""  # no progress bar without a terminal
    assert r.stdout.split()[:2] == [keys["operator"].fp, signed]
    assert "appended, RSA-PKCS1v15-SHA256" in r.stdout
    os.chmod(signed, 0o666)
    r = edged("verify", "--trusted", trust.source, signed)
    assert r.returncode == 1 and UNSAFE_PERMISSIONS in r.stderr


def test_cli_verify_without_a_trust_store_or_model(tmp_path, signed):
    r = edged("verify", "--trusted", str(tmp_path / "no-such-dir"), signed)
    assert r.returncode == 1 and NO_TRUST_STORE in r.stderr and r.stdout == ""
    (tmp_path / "empty").mkdir()
    r = edged("verify", "--trusted", str(tmp_path / "empty"), str(tmp_path / "missing.gguf"))
    assert r.returncode == 2 and str(tmp_path / "missing.gguf") in r.stderr


def test_progress_bar_draws_on_a_terminal_only():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    bar = ProgressBar("verify m.gguf", stream=out, min_bytes=10)
    bar(5, 10)
    bar(10, 10)
    bar.finish()
    assert "100%" in out.getvalue() and out.getvalue().endswith("\n")
    plain = io.StringIO()
    bar = ProgressBar("verify m.gguf", stream=plain, min_bytes=10)
    bar(10, 10)
    bar.finish()
    assert plain.getvalue() == ""
