"""The trust layer opens and verifies a model (verify.open_verified); Model.load maps that very
descriptor and owns it from then on."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, testdata

from edged import Model
from edged.errors import CapacityError, ConfigError, SignatureError
from edged.trust import verify


def edged(*args):
    r = subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def signed(tmp_path):
    os.chmod(tmp_path, 0o755)
    keys = tmp_path / "trusted"
    keys.mkdir(mode=0o755)
    edged("keygen", "--bits", "2048", "--out", str(tmp_path / "k.pem"))
    shutil.move(str(tmp_path / "k.pub.pem"), str(keys / "k.pub.pem"))
    model = tmp_path / "stories.gguf"
    shutil.copyfile(testdata("models", "stories260K.gguf"), model)
    os.chmod(model, 0o644)
    unsigned = tmp_path / "unsigned.gguf"
    shutil.copyfile(model, unsigned)
    os.chmod(unsigned, 0o644)
    edged("sign", "--key", str(tmp_path / "k.pem"), str(model))
    return model, unsigned, keys


def test_signed_model_loads_and_runs(signed):
    model, _, keys = signed
    vf = verify.open_verified(model, str(keys), require_signature=True)
    m = Model.load(str(model), verified=vf)
    assert m.signer == vf.signer and m.signer
    assert m.file.file_size == vf.signed_length < os.path.getsize(model)   # the block is not mapped
    out = [o.token for o in m.session(64).generate([1, 403, 407, 261, 378], max_tokens=5)]
    assert out == [432, 383, 286, 261, 376]
    m.close()
    assert vf.fd == -1      # the model owned the descriptor


def test_unsigned_model_refused_when_required(signed):
    _, unsigned, keys = signed
    with pytest.raises(SignatureError, match="unsigned"):
        verify.open_verified(unsigned, str(keys), require_signature=True)


def test_tampered_model_refused(signed):
    model, _, keys = signed
    with open(model, "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(SignatureError, match="bad signature"):
        verify.open_verified(model, str(keys), require_signature=True)


def test_a_failed_load_closes_the_verified_descriptor(signed):
    model, unsigned, keys = signed
    vf = verify.open_verified(model, str(keys), require_signature=True)
    with pytest.raises(CapacityError, match="does not fit"):
        Model.load(str(model), verified=vf, max_memory=1024)
    assert vf.fd == -1
    vf = verify.open_verified(model, str(keys), require_signature=True)
    with pytest.raises(ConfigError, match="the verified file is"):
        Model.load(str(unsigned), verified=vf)     # a descriptor of another file is not mapped
    assert vf.fd == -1


def test_generate_checks_the_signature_when_asked(signed):
    model, unsigned, keys = signed
    r = edged("generate", "-m", str(model), "-p", "Once", "-n", "3", "--trusted-keys", str(keys),
              "--require-signature", "--verbose")
    assert "signature: signed by" in r.stderr
    r = subprocess.run([sys.executable, "-m", "edged", "generate", "-m", str(unsigned), "-p", "Once",
                        "--trusted-keys", str(keys), "--require-signature"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unsigned" in r.stderr and "Traceback" not in r.stderr, r.stderr
