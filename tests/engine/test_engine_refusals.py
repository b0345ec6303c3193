"""Models edged cannot run are refused at load, with a message naming what is wrong."""
import numpy as np
import pytest

from conftest import testdata

gguf = pytest.importorskip("gguf")

from edged import Model  # noqa: E402
from edged.errors import CapacityError, UnsupportedModelError  # noqa: E402
from gguf_clone import clone  # noqa: E402


STORIES = "stories260K.gguf"


def refuse(path, pattern, **kw):
    with pytest.raises(UnsupportedModelError, match=pattern):
        Model.load(path, **kw)


def test_clone_itself_loads(tmp_path):
    p = clone(testdata("models", STORIES), tmp_path / "ok.gguf")
    m = Model.load(p)
    assert m.session(16).eval([1, 403]).shape == (1, 512)
    m.close()


def test_unknown_architecture(tmp_path):
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf", arch="mamba")
    refuse(p, "unknown architecture 'mamba'")


def test_missing_tensor(tmp_path):
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf", drop=["blk.3.ffn_down.weight"])
    refuse(p, "missing tensor 'blk.3.ffn_down.weight'")


def test_wrong_shape(tmp_path):
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf",
              reshape={"blk.1.attn_k.weight": (64, 64)})
    refuse(p, r"tensor 'blk.1.attn_k.weight' has shape \(64, 64\), expected \(64, 32\)")


def test_unknown_rope_scaling_refused(tmp_path):
    # YaRN runs (tests/engine/test_engine_families.py); a scaling type llama.cpp does not
    # know is refused by name
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf",
              meta={"{arch}.rope.scaling.type": ("dynamic", gguf.GGUFValueType.STRING),
                    "{arch}.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)})
    refuse(p, "'dynamic' is not supported")


def test_tokenizer_size_must_match_embedding_rows(tmp_path):
    r = gguf.GGUFReader(testdata("models", STORIES))
    toks = r.fields["tokenizer.ggml.tokens"].contents()[:500]
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf", tokens=toks)
    refuse(p, "tokenizer has 500 tokens but token_embd.weight has 512 rows")


def test_hyperparameters_contradicting_shapes(tmp_path):
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf", drop_meta=["llama.feed_forward_length"],
              meta={"{arch}.feed_forward_length": (200, gguf.GGUFValueType.UINT32)})
    refuse(p, r"blk.0.ffn_gate.weight' has shape \(64, 172\), expected \(64, 200\)")


def test_missing_required_key(tmp_path):
    p = clone(testdata("models", STORIES), tmp_path / "x.gguf", drop_meta=["llama.block_count"])
    refuse(p, "llama.block_count")


def test_over_budget_memory_refused_with_numbers():
    with pytest.raises(CapacityError, match=r"needs \d+ bytes .*weights .*budget"):
        Model.load(testdata("models", STORIES), max_memory=100_000)
    m = Model.load(testdata("models", STORIES), max_memory=3_000_000)
    with pytest.raises(CapacityError, match="KV cache"):
        m.session(n_ctx=100_000)
    m.close()


def test_verbose_load_logs_tensors_and_plan():
    lines = []
    m = Model.load(testdata("models", STORIES), log=lines.append, n_ctx_plan=256)
    m.close()
    text = "\n".join(lines)
    assert "blk.4.ffn_down.weight" in text and "F32" in text and "offset" in text
    assert "memory plan (n_ctx 256)" in text
