"""Key fingerprints, the trust store's refusals, and `edged keygen`."""
import hashlib
import os
import stat
import subprocess

import pytest

from edged.trust.rules import BAD_KEY, BAD_REVOCATION_LIST, KEY_TOO_SMALL, NO_TRUST_STORE, REVOKED_KEY, UNKNOWN_KEY
from edged.trust.keys import fingerprint, load_public_key
from edged.trust.store import TrustStore
from edged.trust.sign import load_private_key
from edged.errors import SignatureError
from signing_support import OPENSSL, edged, keys, make_trust_dir, needs_openssl, refused  # noqa: F401


@needs_openssl
def test_fingerprint_is_sha256_of_der_spki_as_openssl_computes_it(keys):
    for k in keys.values():
        der = subprocess.run([OPENSSL, "pkey", "-pubin", "-in", k.public, "-outform", "DER"],
                             check=True, capture_output=True).stdout
        assert k.fp == hashlib.sha256(der).hexdigest()
    assert fingerprint(load_public_key(keys["operator"].public)) == keys["operator"].fp
    assert len({k.fp for k in keys.values()}) == len(keys)


def test_trust_store_loads_keys_and_revocations(tmp_path, keys):
    trusted, revoked = make_trust_dir(tmp_path / "trusted", keys)
    (tmp_path / "trusted" / ".hidden").write_text("ignored")
    trust = TrustStore.load(trusted, revoked)
    assert set(trust.keys) == {keys[n].fp for n in ("operator", "vendor", "old")}
    assert trust.revoked == {keys["old"].fp}
    assert trust.is_trusted(keys["operator"].fp) and not trust.is_trusted(keys["old"].fp)
    assert trust.status(keys["stranger"].fp) == UNKNOWN_KEY
    assert trust.status(keys["old"].fp) == REVOKED_KEY


def test_revocation_list_accepts_prefix_colons_comments_and_names_a_bad_line(tmp_path, keys):
    trusted, _ = make_trust_dir(tmp_path / "trusted", keys)
    fp = keys["vendor"].fp
    good = tmp_path / "revoked"
    good.write_text(f"\n# comment\nsha256:{':'.join(fp[i:i + 2] for i in range(0, 64, 2)).upper()} vendor\n")
    assert TrustStore.load(trusted, str(good)).revoked == {fp}
    bad = tmp_path / "revoked-bad"
    bad.write_text(f"{fp}\nnot-a-fingerprint\n")
    with pytest.raises(SignatureError) as e:
        TrustStore.load(trusted, str(bad))
    assert f"{bad}:2" in refused(e, BAD_REVOCATION_LIST)
    with pytest.raises(SignatureError) as e:
        TrustStore.load(trusted, str(tmp_path / "missing"))
    refused(e, BAD_REVOCATION_LIST)


def test_small_key_in_trust_store_is_refused_naming_the_file(tmp_path, keys):
    trusted, revoked = make_trust_dir(tmp_path / "trusted", keys)
    small = os.path.join(trusted, "small.pem")
    with open(keys["small"].public, "rb") as src, open(small, "wb") as dst:
        dst.write(src.read())
    with pytest.raises(SignatureError) as e:
        TrustStore.load(trusted, revoked)
    msg = refused(e, KEY_TOO_SMALL)
    assert small in msg and "1024-bit" in msg


@needs_openssl
def test_non_rsa_key_is_refused_naming_the_file(tmp_path):
    d = tmp_path / "trusted"
    d.mkdir()
    priv = tmp_path / "ec.pem"
    subprocess.run([OPENSSL, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(priv)],
                   check=True, capture_output=True)
    subprocess.run([OPENSSL, "pkey", "-in", str(priv), "-pubout", "-out", str(d / "ec.pub.pem")],
                   check=True, capture_output=True)
    with pytest.raises(SignatureError) as e:
        TrustStore.load(str(d))
    msg = refused(e, BAD_KEY)
    assert str(d / "ec.pub.pem") in msg and "RSA" in msg


@pytest.mark.parametrize("content, hint", [
    (b"-----BEGIN PUBLIC KEY-----\nnot base64 at all\n-----END PUBLIC KEY-----\n", "not a PEM public key"),
    (b"just some notes about keys\n", "not a PEM public key"),
    (None, "private key"),
])
def test_malformed_pem_or_private_key_is_refused_naming_the_file(tmp_path, keys, content, hint):
    d = tmp_path / "trusted"
    d.mkdir()
    path = d / "broken.pem"
    path.write_bytes(content if content is not None else open(keys["operator"].private, "rb").read())
    with pytest.raises(SignatureError) as e:
        TrustStore.load(str(d))
    msg = refused(e, BAD_KEY)
    assert str(path) in msg and hint in msg


def test_missing_trust_directory_is_refused(tmp_path):
    with pytest.raises(SignatureError) as e:
        TrustStore.load(str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in refused(e, NO_TRUST_STORE)


def test_keygen_writes_private_0600_and_public_beside_it(tmp_path):
    out = tmp_path / "fleet.pem"
    r = edged("keygen", "--out", str(out), "--bits", "2048")
    assert r.returncode == 0, r.stderr
    pub = tmp_path / "fleet.pub.pem"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pub).st_mode) == 0o644
    private = load_private_key(str(out))
    assert private.key_size == 2048
    fp = fingerprint(load_public_key(str(pub)))
    assert fp == fingerprint(private)
    assert r.stdout.split()[0] == fp
    assert sorted(os.listdir(tmp_path)) == ["fleet.pem", "fleet.pub.pem"]  # no temp files left
    if OPENSSL:
        assert subprocess.run([OPENSSL, "pkey", "-in", str(out), "-check", "-noout"], capture_output=True).returncode == 0


def test_keygen_never_overwrites(tmp_path):
    out = tmp_path / "k.pem"
    out.write_text("precious")
    r = edged("keygen", "--out", str(out), "--bits", "2048")
    assert r.returncode == 2 and "exists" in r.stderr
    assert out.read_text() == "precious" and not (tmp_path / "k.pub.pem").exists()
    (tmp_path / "j.pub.pem").write_text("precious")
    r = edged("keygen", "--out", str(tmp_path / "j.pem"), "--bits", "2048")
    assert r.returncode == 2 and not (tmp_path / "j.pem").exists()


def test_keygen_refuses_small_keys(tmp_path):
    r = edged("keygen", "--out", str(tmp_path / "k.pem"), "--bits", "1024")
    assert r.returncode == 2 and KEY_TOO_SMALL in r.stderr
    assert os.listdir(tmp_path) == []
