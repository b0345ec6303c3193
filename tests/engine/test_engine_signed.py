"""Model.load verifies the signature on the descriptor it then maps."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, testdata

from edged import Model
from edged.errors import SignatureError


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
    m = Model.load(str(model), trusted_keys=str(keys), require_signature=True)
    assert m.signer
    out = [o.token for o in m.session(64).generate([1, 403, 407, 261, 378], max_tokens=5)]
    assert out == [432, 383, 286, 261, 376]
    m.close()


def test_unsigned_model_refused_when_required(signed):
    _, unsigned, keys = signed
    with pytest.raises(SignatureError, match="unsigned"):
        Model.load(str(unsigned), trusted_keys=str(keys), require_signature=True)


def test_tampered_model_refused(signed):
    model, _, keys = signed
    with open(model, "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(SignatureError, match="bad signature"):
        Model.load(str(model), trusted_keys=str(keys), require_signature=True)
