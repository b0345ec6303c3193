"""Hyperparameters no trained model has are refused at load, naming the key (issue 13.8)."""
import math

import pytest

from hardening_files import ARCH, TOKENS, kv_f32, llama_file
from edged.errors import UnsupportedModelError
from edged.format.gguf import GGUFFile, Key

arch = pytest.importorskip("edged.engine.arch")


def validate(tmp_path, data):
    path = tmp_path / "hp.gguf"
    path.write_bytes(data)
    with GGUFFile.open(str(path)) as f:
        return arch.validate(f.metadata, f.tensors, len(TOKENS))


@pytest.mark.parametrize("key,value", [
    (Key.LAYERNORM_RMS_EPS, 0.0), (Key.LAYERNORM_RMS_EPS, -1e-5), (Key.LAYERNORM_RMS_EPS, math.nan),
    (Key.ROPE_FREQ_BASE, 0.0), (Key.ROPE_FREQ_BASE, -10000.0), (Key.ROPE_FREQ_BASE, math.nan),
    (Key.ROPE_FREQ_BASE, math.inf),
])
def test_impossible_hyperparameter_is_refused_with_its_key(tmp_path, key, value):
    name = Key.arch(key, ARCH)
    data = llama_file()
    if key == Key.LAYERNORM_RMS_EPS:
        old = kv_f32(name, 1e-5)
        assert data.count(old) == 1
        data = data.replace(old, kv_f32(name, value))
    else:
        data = llama_file(extra_kvs=[kv_f32(name, value)])
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate(tmp_path, data)


def test_sane_values_still_load(tmp_path):
    spec = validate(tmp_path, llama_file(extra_kvs=[kv_f32(Key.arch(Key.ROPE_FREQ_BASE, ARCH), 500000.0)]))
    assert spec.hp.rope_freq_base == 500000.0 and spec.hp.rms_eps == pytest.approx(1e-5)
