"""Rerankers (issue 44.2) against llama.cpp: files built by tests/support/rerank_files.py (a
seeded head on a tiny synthetic BERT, on the real all-MiniLM-L6-v2 and on the synthetic qwen3)
and the token ids and head outputs `llama-embedding --pooling rank` recorded for them
(tests/data/goldens/rerank.json, tools/make_rerank_goldens.py)."""
import json

import numpy as np
import pytest

from conftest import testdata
import rerank_files
from edged.engine.model import Model
from edged.errors import RequestError, UnsupportedModelError

# |edged - llama.cpp| of a score: F32 files differ in summation order only; the Q8_0 MiniLM
# quantizes activations like llama.cpp, its pooled [CLS] row agrees to cosine ~0.9999, and the
# head's logit (scores within +-1.5) then to ~0.012
TOLERANCE = {"tiny-bert-dense": 5e-4, "minilm-cross-encoder": 0.03, "qwen3-reranker": 5e-4}


@pytest.fixture(scope="module")
def golden():
    return rerank_files.goldens()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    testdata("models", "all-MiniLM-L6-v2.Q8_0.gguf")
    tmp = str(tmp_path_factory.mktemp("rerank"))
    return {name: rerank_files.build(name, tmp) for name in rerank_files.NAMES}


@pytest.mark.parametrize("name", rerank_files.NAMES)
def test_ids_and_scores_match_llama_cpp(files, golden, name):
    g = golden[name]
    with Model.load(files[name]) as m:
        assert m.pooling == "rank"
        assert [m.rerank_ids(g["query"], d) for d in g["documents"]] == g["tokens"]
        got = m.rerank(g["query"], g["documents"])
        want = np.array(g["scores"], np.float32)
        assert got.shape == (len(g["documents"]),)
        assert np.abs(got - want[:, 0]).max() <= TOLERANCE[name]
        assert list(np.argsort(-got)) == list(np.argsort(-want[:, 0]))
        # every output of the head (Qwen3: P(yes), P(no)), as llama.cpp's embd_seq holds them
        steps = m.embed_steps(m.tokenize_inputs([(g["query"], d) for d in g["documents"]]), "rank")
        for _ in steps:
            pass
        assert steps.result.shape == want.shape
        assert np.abs(steps.result - want).max() <= TOLERANCE[name]


def test_reference_backend_is_the_slow_twin(files, golden):
    g = golden["tiny-bert-dense"]
    with Model.load(files["tiny-bert-dense"], backend="reference") as m:
        got = m.rerank(g["query"], g["documents"])
    assert np.abs(got - np.array(g["scores"])[:, 0]).max() <= TOLERANCE["tiny-bert-dense"]


def test_qwen3_template_keeps_texts_plain(files):
    """The rerank template's own text is tokenized with its control tokens; a query that
    spells the template's placeholder is not filled in again (llama.cpp replaces in turn)."""
    with Model.load(files["qwen3-reranker"]) as m:
        a = m.rerank_ids("{document}", "x")
        b = m.rerank_ids("y", "x")
        assert len(a) > len(b)      # "{document}" stayed text in the query's place
        assert m.rerank_template.startswith("<|im_start|>system")


def test_a_reranker_does_not_embed_by_default(files):
    with Model.load(files["tiny-bert-dense"]) as m:
        with pytest.raises(RequestError, match="reranker"):
            m.embed(["hello"])
        assert m.embed(["hello"], pooling="cls").shape == (1, m.hp.n_embd)


def test_a_plain_encoder_does_not_rank(tmp_path):
    with Model.load(rerank_files.tiny_bert(str(tmp_path / "t.gguf"))) as m:
        assert m.rank_head is None
        with pytest.raises(RequestError, match="not a reranker"):
            m.rerank("q", ["d"])


def test_rank_without_a_head_is_refused_at_load(tmp_path):
    """pooling_type 4 on a file whose architecture or tensors give no head."""
    import gguf
    from gguf_clone import clone
    src = rerank_files.tiny_bert(str(tmp_path / "t.gguf"))
    dst = clone(src, tmp_path / "r.gguf", meta={"{arch}.pooling_type": (4, gguf.GGUFValueType.UINT32)},
                drop_meta=("bert.pooling_type",))
    with pytest.raises(UnsupportedModelError, match="no classification head"):
        Model.load(dst)


def test_head_shape_checked_at_load(tmp_path):
    from gguf_clone import clone
    src = rerank_files.tiny_bert(str(tmp_path / "t.gguf"))
    dst = clone(src, tmp_path / "r.gguf", add={"cls.output.weight": np.zeros((3, 32), np.float32)})
    with pytest.raises(UnsupportedModelError, match="cls.output.weight"):
        Model.load(dst)


def test_cli_prints_scores_highest_first(files, golden):
    import subprocess
    import sys
    from conftest import ROOT
    g = golden["tiny-bert-dense"]

    def edged(*args):
        return subprocess.run([sys.executable, "-m", "edged", "rerank", "-m", files["tiny-bert-dense"],
                               "-t", "1", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    r = edged("-q", g["query"], *g["documents"], "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"]
    want = np.array(g["scores"])[:, 0]
    assert [x["index"] for x in res] == list(np.argsort(-want))
    assert all(abs(x["relevance_score"] - want[x["index"]]) <= 5e-4 for x in res)
    r = edged("-q", g["query"], *g["documents"], "--top-n", "2")
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith(g["documents"][int(np.argmax(want))])
    r = edged("-q", "q")
    assert r.returncode == 2 and "at least one DOC" in r.stderr
