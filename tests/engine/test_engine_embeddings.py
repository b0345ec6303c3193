"""Embeddings against llama.cpp's (tests/data/goldens/embed-*.embeddings.npz, made by
tools/make_embedding_goldens.py): BERT and nomic-bert encoders (synthetic, F32) and a decoder's
pooled final hidden states (stories260K), on the compiled and the reference backend; plus
the encoder's load-time validation and the request errors of Model.embed."""
import os

import numpy as np
import pytest

from conftest import testdata
from edged.engine.model import Model
from edged.errors import ConfigError, RequestError, UnsupportedModelError
from edged.format.gguf import GGUFFile, Key

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDENS = os.path.join(HERE, "..", "data", "goldens")
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog.",
         "a", "embeddings: mean, cls and last pooling; 12345 tokens!"]   # as the tool made them
# F32 files. Encoders have no KV cache: llama.cpp and edged differ only in summation order.
# The decoder's keys and values go through the F16 KV cache (both sides), which rounds them.
MIN_COSINE = 0.9999
MAX_ABS = {"bert": 1e-4, "nomic-bert": 1e-4, "stories260K": 1e-3}


def golden(name):
    return np.load(os.path.join(GOLDENS, f"embed-{name}.embeddings.npz"))


def model_path(name):
    if name == "stories260K":
        return testdata("models", "stories260K.gguf")
    return os.path.join(GOLDENS, f"embed-{name}.gguf")


CASES = [("bert", "mean"), ("bert", "cls"), ("nomic-bert", "mean"), ("nomic-bert", "cls"),
         ("stories260K", "last"), ("stories260K", "mean")]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("name,pooling", CASES)
def test_embeddings_match_llama_cpp(name, pooling, backend):
    g = golden(name)
    with Model.load(model_path(name), backend=backend) as m:
        for i, text in enumerate(TEXTS):        # the same token ids as llama.cpp
            assert m.tokenizer.encode(text) == g[f"tokens_{i}"].tolist(), text
        got = m.embed(TEXTS, pooling=pooling)
    want = g[f"emb_{pooling}"]
    assert got.shape == want.shape and got.dtype == np.float32
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= MIN_COSINE, cos
    assert np.abs(got - want).max() <= MAX_ABS[name]
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_pooling_defaults_to_the_file_and_batching_does_not_change_results():
    with Model.load(model_path("bert")) as m:
        assert m.pooling == "mean" and m.arch == "bert"
        together = m.embed(TEXTS)
        alone = np.stack([m.embed(t)[0] for t in TEXTS])
        assert np.array_equal(together, alone)       # same bits, batched or alone
        raw = m.embed(TEXTS[:1], normalize=False)
        assert abs(np.linalg.norm(raw) - 1.0) > 1e-3       # not normalised when asked
        rows = m.embed(TEXTS[:2], pooling="none")
        assert [r.shape[0] for r in rows] == [len(m.tokenizer.encode(t)) for t in TEXTS[:2]]
        ids = m.tokenizer.encode(TEXTS[1])
        assert np.abs(m.embed([ids]) - together[1:2]).max() < 1e-6   # token ids as input


def test_embed_errors_name_the_problem():
    with Model.load(model_path("bert")) as m:
        with pytest.raises(RequestError, match="limit of 128"):
            m.embed(["word " * 200])
        with pytest.raises(RequestError, match="input 1 is empty"):
            m.embed(["x", []])
        with pytest.raises(RequestError, match="out of range"):
            m.embed([[1, 99999]])
        with pytest.raises(RequestError, match="pooling 'max'"):
            m.embed(["x"], pooling="max")
        with pytest.raises(RequestError, match="encoder: it only embeds"):
            m.session()


def test_a_decoder_without_pooling_type_needs_one():
    with Model.load(model_path("stories260K")) as m:
        assert m.pooling == "none"
        rows = m.embed(["Once upon a time"])                   # per token, as llama.cpp's none
        assert isinstance(rows, list) and rows[0].shape == (5, m.hp.n_embd)


def _rewrite(src, dst, drop=(), md_update=None):
    """Copy a GGUF with some tensors dropped or metadata changed (the PyPI gguf writer)."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if md_update and f.name in md_update:
            continue
        w.add_key_value(f.name, f.contents(), f.types[0],
                        f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for k, (v, t) in (md_update or {}).items():
        w.add_key_value(k, v, t)
    for t in r.tensors:
        if t.name in drop:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_encoder_files_are_validated_at_load(tmp_path):
    gguf = pytest.importorskip("gguf")
    src = model_path("bert")
    bad = str(tmp_path / "missing.gguf")
    _rewrite(src, bad, drop={"blk.1.layer_output_norm.bias"})
    with pytest.raises(UnsupportedModelError, match="blk.1.layer_output_norm.bias"):
        Model.load(bad)
    rank = str(tmp_path / "rank.gguf")
    _rewrite(src, rank, md_update={"bert.pooling_type": (4, gguf.GGUFValueType.UINT32)})
    with pytest.raises(UnsupportedModelError, match="pooling_type = 4"):
        Model.load(rank)
    causal = str(tmp_path / "causal.gguf")
    _rewrite(src, causal, md_update={"bert.attention.causal": (True, gguf.GGUFValueType.BOOL)})
    with pytest.raises(UnsupportedModelError, match="causal"):
        Model.load(causal)
    with GGUFFile.open(src) as f:
        assert f.metadata[Key.arch(Key.POOLING_TYPE, "bert")] == 1


def test_an_encoder_takes_its_backend_by_the_same_rule_as_a_decoder(monkeypatch):
    """backend= and EDGED_BACKEND pick an encoder's backend as a decoder's (engine/backends.py):
    an unknown name is refused, not run on the compiled core."""
    with pytest.raises(ConfigError, match="'gpu': unknown backend"):
        Model.load(model_path("bert"), backend="gpu")
    monkeypatch.setenv("EDGED_BACKEND", "reference")
    with Model.load(model_path("bert")) as m:
        assert m.backend_name == "reference"
