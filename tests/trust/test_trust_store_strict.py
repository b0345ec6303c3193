"""The trust store says exactly what its files say (issue 13.5), and the daemon and `edged
verify` share one revocation default (issue 13.6)."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from edged.cli import build_parser
from edged.errors import SignatureError
from edged.service import config
from edged.service.daemon import load_trust
from edged.trust import store
from edged.trust.rules import BAD_KEY, BAD_REVOCATION_LIST, REVOKED_KEY
from edged.trust.sign import sign_file
from edged.trust.store import TrustStore
from edged.trust.verify import open_verified
from signing_support import copy_model, keys, make_trust_dir, refused  # noqa: F401


def _pem(k):
    return open(k.public).read()


def test_public_key_followed_by_private_key_is_refused_at_its_line(tmp_path, keys):
    d = tmp_path / "trusted"
    d.mkdir()
    pub = _pem(keys["operator"])
    (d / "op.pem").write_text(pub + open(keys["operator"].private).read())
    with pytest.raises(SignatureError) as e:
        TrustStore.load(str(d))
    msg = refused(e, BAD_KEY)
    assert f"{d / 'op.pem'}:{pub.count(chr(10)) + 1}:" in msg and "PRIVATE KEY" in msg


def test_two_public_keys_in_one_file_are_refused_at_the_second(tmp_path, keys):
    d = tmp_path / "trusted"
    d.mkdir()
    first = _pem(keys["operator"])
    (d / "two.pem").write_text(first + _pem(keys["vendor"]))
    with pytest.raises(SignatureError) as e:
        TrustStore.load(str(d))
    msg = refused(e, BAD_KEY)
    assert f"{d / 'two.pem'}:{first.count(chr(10)) + 1}:" in msg and "second PEM block" in msg


def test_text_after_the_key_is_refused_at_its_line(tmp_path, keys):
    d = tmp_path / "trusted"
    d.mkdir()
    pub = _pem(keys["operator"])
    (d / "op.pem").write_text(pub + "\ntrailing words\n")
    with pytest.raises(SignatureError) as e:
        TrustStore.load(str(d))
    assert f"{d / 'op.pem'}:{pub.count(chr(10)) + 2}:" in refused(e, BAD_KEY)


def test_revocation_line_with_two_fingerprints_is_refused_at_its_line(tmp_path, keys):
    trusted, _ = make_trust_dir(tmp_path / "trusted", keys)
    bad = tmp_path / "revoked"
    bad.write_text(f"# rotation\n{keys['old'].fp} {keys['vendor'].fp}\n")
    with pytest.raises(SignatureError) as e:
        TrustStore.load(trusted, str(bad))
    msg = refused(e, BAD_REVOCATION_LIST)
    assert f"{bad}:2:" in msg and keys["vendor"].fp in msg
    # a label after the fingerprint (documented) is still fine
    bad.write_text(f"{keys['old'].fp} old-laptop-key\n")
    assert TrustStore.load(trusted, str(bad)).revoked == {keys["old"].fp}


def test_daemon_and_verify_share_the_revocation_default():
    args = build_parser({"verify"}).parse_args(["verify", "m.gguf"])
    assert config.defaults().revoked_keys == store.DEFAULT_REVOKED_FILE == args.revoked
    # the default counts only when it exists; another configured path must exist; "" is none
    assert store.revocation_file("") is None and store.revocation_file("/nonexistent/x") == "/nonexistent/x"


def test_key_revoked_in_the_default_list_is_refused_by_daemon_and_verify(tmp_path, keys, monkeypatch):
    """The README's rotation: add the old key's fingerprint to the revocation list. With no
    revoked_keys in the daemon's config and no --revoked for `edged verify`, both refuse it."""
    trusted, _ = make_trust_dir(tmp_path / "trusted", keys, revoked=())
    model = copy_model(tmp_path)
    sign_file(model, keys["old"].key)
    default = tmp_path / "etc-edged" / "revoked-keys"
    monkeypatch.setattr(store, "DEFAULT_REVOKED_FILE", str(default))
    cfg = config.load(None, {"trusted_keys": trusted, "revoked_keys": str(default)})
    # before the rotation the default list does not exist: the key is trusted
    assert open_verified(model, load_trust(cfg), True, cache=None).signer == keys["old"].fp
    default.parent.mkdir()
    default.write_text(f"{keys['old'].fp}  # rotated out\n")
    with pytest.raises(SignatureError) as e:
        open_verified(model, load_trust(cfg), True, cache=None)
    refused(e, REVOKED_KEY)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) to give the daemon a private /etc/edged")
def test_daemon_with_default_config_refuses_a_key_revoked_in_etc_edged(tmp_path, keys):
    """End to end, as the README's rotation steps do it: /etc/edged/revoked-keys (in a private
    mount namespace, so the host's /etc is untouched) lists the key; `edged verify` without
    --revoked and a daemon without revoked_keys both refuse the model."""
    trusted, _ = make_trust_dir(tmp_path / "trusted", keys, revoked=())
    model = copy_model(tmp_path)
    sign_file(model, keys["old"].key)
    etc = tmp_path / "etc"                    # a copy of /etc with edged/revoked-keys added,
    shutil.copytree("/etc", etc, symlinks=True, ignore_dangling_symlinks=True)   # mounted
    (etc / "edged").mkdir(exist_ok=True)      # over /etc only inside the namespace
    (etc / "edged" / "revoked-keys").write_text(keys["old"].fp + "\n")
    script = f"""
import sys
sys.path.insert(0, {ROOT!r})
from edged.service import config
from edged.service.daemon import load_trust
from edged.trust.verify import open_verified
cfg = config.load(None, {{"trusted_keys": {trusted!r}}})
try:
    open_verified({model!r}, load_trust(cfg), True, cache=None)
except Exception as e:
    print("daemon:", e)
"""
    (tmp_path / "daemon_check.py").write_text(script)
    cmd = (f"mount --bind {etc} /etc && "
           f"{sys.executable} -m edged verify --trusted {trusted} {model}; "
           f"{sys.executable} {tmp_path / 'daemon_check.py'}")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "edged verify: revoked key" in out, out
    assert "daemon: revoked key" in out, out


def test_the_daemon_does_not_import_key_generation_or_signing():
    code = ("import sys, edged.service.daemon, edged.trust.verify\n"
            "print(sorted(m for m in sys.modules if m.startswith('edged.trust')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    loaded = eval(r.stdout)
    assert "edged.trust.verify" in loaded and "edged.trust.store" in loaded
    assert "edged.trust.sign" not in loaded, loaded
