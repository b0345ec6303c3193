"""Shared helpers for tests/test_signing_*.py: session-wide keys, a trust store, the CLI."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, testdata
from edged.trust.keys import fingerprint
from edged.trust.store import TrustStore
from edged.trust.sign import private_pem, public_pem

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not installed")

# name -> bits; "old" is trusted but revoked, "stranger" is in no trust store
KEY_BITS = {"operator": 2048, "vendor": 2048, "old": 2048, "stranger": 2048, "small": 1024}
_KEYS = {}


class Key:
    def __init__(self, private, public):
        self.private, self.public = str(private), str(public)
        with open(self.private, "rb") as f:
            from cryptography.hazmat.primitives import serialization

            self.key = serialization.load_pem_private_key(f.read(), password=None)
        self.fp = fingerprint(self.key)


def make_keys(tmp_path_factory):
    """Keys generated once per test session, with the openssl CLI when it is installed."""
    if not _KEYS:
        d = tmp_path_factory.mktemp("keys")
        for name, bits in KEY_BITS.items():
            private, public = d / f"{name}.pem", d / f"{name}.pub.pem"
            if OPENSSL:
                subprocess.run([OPENSSL, "genpkey", "-algorithm", "RSA", "-pkeyopt", f"rsa_keygen_bits:{bits}",
                                "-out", str(private)], check=True, capture_output=True)
                subprocess.run([OPENSSL, "pkey", "-in", str(private), "-pubout", "-out", str(public)],
                               check=True, capture_output=True)
            else:
                from cryptography.hazmat.primitives.asymmetric import rsa

                k = rsa.generate_private_key(public_exponent=65537, key_size=bits)
                private.write_bytes(private_pem(k))
                public.write_bytes(public_pem(k))
            _KEYS[name] = Key(private, public)
    return _KEYS


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory)


@pytest.fixture
def trust(tmp_path, keys):
    """The default trust store: operator and vendor trusted, "old" trusted but revoked."""
    return TrustStore.load(*make_trust_dir(tmp_path / "trusted", keys))


def make_trust_dir(path, keys, names=("operator", "vendor", "old"), revoked=("old",)):
    """A trusted-keys directory with `names` and a revoked-keys file listing `revoked`."""
    path.mkdir()
    for name in names:
        shutil.copy(keys[name].public, path / f"{name}.pem")
    revoked_file = path.parent / (path.name + "-revoked")
    revoked_file.write_text("# revoked signing keys\n" + "".join(f"{keys[n].fp}  # {n}\n" for n in revoked))
    return str(path), str(revoked_file)


def copy_model(tmp_path, name="stories260K.gguf", as_name="model.gguf"):
    dst = tmp_path / as_name
    shutil.copyfile(testdata("models", name), dst)
    os.chmod(dst, 0o644)
    return str(dst)


def edged(*args, **kw):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, env=env, **kw)


def openssl(*args):
    return subprocess.run([OPENSSL, *args], capture_output=True, text=True)


def refused(excinfo, rule):
    """The SignatureError names `rule` both as its .rule and at the start of its message."""
    e = excinfo.value
    assert e.rule == rule, str(e)
    assert str(e).startswith(rule + ": "), str(e)
    return str(e)
