"""Gemma 4 (`gemma4`, text): hyperparameters as llama.cpp reads them, refusals naming the key or
tensor, and the NumPy reference forward pass (edged/engine/gemma4.py) against llama.cpp.

tests/data/goldens/reference-only/synthetic-gemma4 is a scaled-down Gemma 4 E2B (n_embd 64;
sliding layers 0, 1, 3 with head size 16, full layers 2 and 4 with head size 32 and
proportional RoPE; KV heads per layer; layers 3 and 4 reuse the KV of layers 1 and 2; layer 2
without attn_v; per-layer embeddings 8 wide; a scalar per layer; logits soft-capped at 30) with
llama.cpp's teacher-forced logits (a 40-token prompt past the window of 8, then 24 greedy
tokens), made by `tools/make_goldens.py --llama-teacher BIN --out
tests/data/goldens/reference-only gemma4`. It sits apart from the other goldens because the
compiled backend does not load gemma4 yet (test_engine_families runs those on it).
"""
import os

import numpy as np
import pytest

from conftest import ROOT
from edged.engine import gemma4
from edged.engine.arch import validate
from edged.errors import MetadataValueError, UnsupportedModelError
from edged.format.gguf import GGUFFile
from family_goldens import MAX_ABS, MEAN_ABS

BASE = os.path.join(ROOT, "tests", "data", "goldens", "reference-only", "synthetic-gemma4")


@pytest.fixture(scope="module")
def gguf():
    with GGUFFile.open(BASE + ".gguf") as f:
        yield f


def test_hparams_as_llama_cpp_reads_them(gguf):
    hp = gemma4.hparams(gguf.metadata, 512)
    assert hp.swa_layers == (True, True, False, True, False)
    assert (hp.head_dim, hp.head_dim_swa, hp.n_rot, hp.n_rot_swa) == (32, 16, 32, 16)
    assert hp.n_head_kv == (2, 2, 1, 2, 1) and hp.n_ff == (32, 32, 32, 64, 64)
    assert [hp.kv_layer(il) for il in range(5)] == [0, 1, 2, 1, 2]
    assert (hp.n_embd_per_layer, hp.final_logit_softcap, hp.n_swa) == (8, 30.0, 8)


def test_reference_forward_matches_llama_cpp(gguf):
    z = np.load(BASE + ".golden.npz")
    ref = z["logits"]
    w = gemma4.Weights(gguf, gemma4.hparams(gguf.metadata, 512))
    got = gemma4.forward(w, z["tokens"])
    d = np.abs(got - ref)
    top = np.sort(ref, 1)
    decided = top[:, -1] - top[:, -2] > 0.6
    misses = int((decided & (got.argmax(1) != ref.argmax(1))).sum())
    assert d.max() <= MAX_ABS and d.mean() <= MEAN_ABS and misses == 0, \
        f"max {d.max():.4f} mean {d.mean():.5f} top-1 misses {misses}"


@pytest.mark.parametrize("change, message", [
    ({"gemma4.attention.key_length_swa": None}, "missing required key 'gemma4.attention.key_length_swa'"),
    ({"gemma4.embedding_length_per_layer_input": None}, "embedding_length_per_layer_input"),
    ({"gemma4.attention.sliding_window_pattern": None}, "sliding_window_pattern"),
    ({"gemma4.attention.head_count_kv": [2, 2, 1]}, "head_count_kv has 3 entries for 5 layers"),
    ({"gemma4.attention.head_count_kv": [3, 2, 1, 2, 1]}, "not a multiple of head_count_kv 3"),
    ({"gemma4.attention.value_length_swa": 8}, "must be equal"),
    ({"gemma4.rope.dimension_count_swa": 18}, "rope.dimension_count_swa 18 invalid"),
    ({"gemma4.attention.shared_kv_layers": 4}, "shared_kv_layers = 4"),
    ({"gemma4.expert_count": 8}, "mixture-of-experts"),
])
def test_bad_metadata_is_refused_naming_the_key(gguf, change, message):
    md = dict(gguf.metadata)
    for k, v in change.items():
        if v is None:
            del md[k]
        else:
            md[k] = v
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(").replace("[", r"\[")):
        gemma4.hparams(md, 512)


def test_bad_value_type_is_refused(gguf):
    md = dict(gguf.metadata, **{"gemma4.attention.sliding_window_pattern": [1, 1, 0, 1, 0]})
    with pytest.raises(MetadataValueError, match="sliding_window_pattern"):
        gemma4.hparams(md, 512)


def test_missing_or_misshapen_tensor_is_refused(gguf):
    hp = gemma4.hparams(gguf.metadata, 512)
    tensors = dict(gguf.tensors)

    class Fake:
        pass
    f = Fake()
    f.tensors = dict(tensors)
    del f.tensors["blk.1.attn_k_norm.weight"]
    with pytest.raises(UnsupportedModelError, match="missing tensor 'blk.1.attn_k_norm.weight'"):
        gemma4.Weights(f, hp)
    f.tensors = dict(tensors)
    f.tensors["blk.2.attn_q.weight"] = tensors["blk.1.attn_q.weight"]    # a sliding layer's size
    with pytest.raises(UnsupportedModelError, match=r"'blk.2.attn_q.weight' has shape \(64, 64\)"):
        gemma4.Weights(f, hp)


def test_model_load_still_refuses_gemma4(gguf):
    """Until the compiled pass runs it, loading names the architecture instead of failing later."""
    with pytest.raises(UnsupportedModelError, match="unknown architecture 'gemma4'"):
        validate(gguf.metadata, gguf.tensors, 512)
