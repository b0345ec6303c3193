"""/v1/rerank and /rerank through a real daemon serving signed rerankers (a BERT cross-encoder
and a Qwen3-Reranker-style decoder, tests/support/rerank_files.py): the bodies of llama-server's
own rerank tests (tools/server/tests/unit/test_rerank.py: Jina shape, TEI's `texts`, top_n,
invalid documents, usage), Jina's and Cohere's shapes ({"text"} documents, return_documents),
scores against llama.cpp's goldens, and the errors (limits, a plain encoder, embeddings asked
of a reranker)."""
import os

import numpy as np
import pytest

from conftest import testdata
import rerank_files
from daemon_support import Server, model_dir, request, signing_key
from edged.service.rerank import MAX_DOCUMENTS, MAX_TOKENS

# llama-server's tools/server/tests/unit/test_rerank.py
TEST_DOCUMENTS = [
    "A machine is a physical system that uses power to apply forces and control movement to perform an action. The term is commonly applied to artificial devices, such as those employing engines or motors, but also to natural biological macromolecules, such as molecular machines.",
    "Learning is the process of acquiring new understanding, knowledge, behaviors, skills, values, attitudes, and preferences. The ability to learn is possessed by humans, non-human animals, and some machines; there is also evidence for some kind of learning in certain plants.",
    "Machine learning is a field of study in artificial intelligence concerned with the development and study of statistical algorithms that can learn from data and generalize to unseen data, and thus perform tasks without explicit instructions.",
    "Paris, capitale de la France, est une grande ville européenne et un centre mondial de l'art, de la mode, de la gastronomie et de la culture. Son paysage urbain du XIXe siècle est traversé par de larges boulevards et la Seine."
]
GOLDENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "goldens")


@pytest.fixture(scope="module")
def golden():
    return rerank_files.goldens()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    testdata("models", "synthetic-qwen3-f32.gguf")
    testdata("models", "all-MiniLM-L6-v2.Q8_0.gguf")
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-rerank")
    build = str(tmp_path_factory.mktemp("build"))
    models = model_dir(tmp, key, {"ce": rerank_files.build("minilm-cross-encoder", build),
                                  "tiny": rerank_files.build("tiny-bert-dense", build),
                                  "qwen3rr": rerank_files.build("qwen3-reranker", build),
                                  "bert": os.path.join(GOLDENS, "embed-bert.gguf")})
    s = Server(tmp, models, trusted, default_model="ce",
               extra={"n_parallel": 2, "ctx_size": 512, "threads": 2, "auto_load": True})
    yield s
    assert s.stop() == 0, s.logtext()


def post(srv, body, path="/v1/rerank"):
    return request(srv.socket, "POST", path, body)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/reranking", "/v1/reranking"])
def test_llama_server_body(srv, path):
    st, _, r = post(srv, {"query": "Machine learning is", "documents": TEST_DOCUMENTS}, path)
    assert st == 200, r
    assert r["object"] == "list" and r["model"] == "ce"
    res = r["results"]
    assert sorted(x["index"] for x in res) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in res]
    assert scores == sorted(scores, reverse=True)
    assert r["usage"]["prompt_tokens"] == r["usage"]["total_tokens"] > 4


@pytest.mark.parametrize("name,model,tol", [("minilm-cross-encoder", "ce", 0.03),
                                            ("tiny-bert-dense", "tiny", 5e-4),
                                            ("qwen3-reranker", "qwen3rr", 5e-4)])
def test_scores_match_llama_cpp(srv, golden, name, model, tol):
    g = golden[name]
    st, _, r = post(srv, {"model": model, "query": g["query"], "documents": g["documents"]})
    assert st == 200, r
    want = np.array(g["scores"])[:, 0]
    got = np.zeros(len(want))
    for x in r["results"]:
        got[x["index"]] = x["relevance_score"]
    assert np.abs(got - want).max() < tol
    assert [x["index"] for x in r["results"]] == list(np.argsort(-want))
    assert r["usage"]["prompt_tokens"] == sum(len(t) for t in g["tokens"])


def test_tei_texts_give_a_bare_list(srv):
    st, _, r = post(srv, {"query": "Machine learning is", "texts": TEST_DOCUMENTS, "return_text": True},
                    "/rerank")
    assert st == 200 and isinstance(r, list) and len(r) == 4
    assert [x["score"] for x in r] == sorted((x["score"] for x in r), reverse=True)
    assert all(x["text"] == TEST_DOCUMENTS[x["index"]] for x in r)
    # TEI's raw_scores false: the sigmoid of the raw score (true, or absent: raw, as llama-server)
    st, _, s = post(srv, {"query": "Machine learning is", "texts": TEST_DOCUMENTS, "raw_scores": False})
    raw = {x["index"]: x["score"] for x in r}
    assert all(abs(x["score"] - 1 / (1 + np.exp(-raw[x["index"]]))) < 1e-6 for x in s)


@pytest.mark.parametrize("top_n,n", [(None, 4), (2, 2), (4, 4), (99, 4)])
def test_top_n(srv, top_n, n):
    body = {"query": "Machine learning is", "documents": TEST_DOCUMENTS}
    if top_n is not None:
        body["top_n"] = top_n
    st, _, r = post(srv, body)
    assert st == 200 and len(r["results"]) == n
    st, _, t = post(srv, dict(body, texts=body.pop("documents")), "/rerank")
    assert st == 200 and len(t) == n


@pytest.mark.parametrize("documents", [[], None, 123, [1, 2, 3]])
def test_invalid_documents(srv, documents):
    st, _, r = post(srv, {"query": "Machine learning is", "documents": documents})
    assert st == 400 and "documents" in r["error"]["message"]


def test_jina_body(srv):
    """Jina's shape: model, query, documents as strings or {"text"} objects, top_n,
    return_documents (results carry document.text)."""
    docs = [{"text": d} for d in TEST_DOCUMENTS[:3]] + [TEST_DOCUMENTS[3]]
    st, _, r = post(srv, {"model": "ce", "query": "Machine learning is", "documents": docs,
                          "top_n": 3, "return_documents": True})
    assert st == 200, r
    assert len(r["results"]) == 3
    for x in r["results"]:
        assert x["document"] == {"text": TEST_DOCUMENTS[x["index"]]}
        assert isinstance(x["relevance_score"], float)


def test_cohere_body(srv):
    """Cohere's v2 rerank body (model, query, documents, top_n; return_documents false): its SDK
    reads results[].index / relevance_score and an optional id."""
    st, _, r = post(srv, {"model": "ce", "query": "What is the capital of France?",
                          "documents": TEST_DOCUMENTS, "top_n": 2, "return_documents": False})
    assert st == 200 and r["id"].startswith("rerank-")
    assert [set(x) for x in r["results"]] == [{"index", "relevance_score"}] * 2


def test_limits_name_themselves(srv):
    st, _, r = post(srv, {"query": "q", "documents": ["d"] * (MAX_DOCUMENTS + 1)})
    assert st == 400 and str(MAX_DOCUMENTS) in r["error"]["message"]
    doc = "a b c d e f g h i j " * 7           # 74 tokens a pair with the query
    n = MAX_TOKENS // 72
    st, _, r = post(srv, {"query": "q", "documents": [doc] * n})
    assert st == 400 and str(MAX_TOKENS) in r["error"]["message"], r
    st, _, r = post(srv, {"query": "q", "documents": ["d"], "top_n": 0})
    assert st == 400 and "top_n" in r["error"]["message"]
    st, _, r = post(srv, {"query": "q", "documents": ["x " * 600]})
    assert st == 400 and "document 0" in r["error"]["message"]


def test_wrong_model_kinds(srv):
    st, _, r = post(srv, {"model": "bert", "query": "q", "documents": ["d"]})
    assert st == 400 and "not a reranker" in r["error"]["message"]
    st, _, r = request(srv.socket, "POST", "/v1/embeddings", {"model": "ce", "input": "hello"})
    assert st == 400 and "/v1/rerank" in r["error"]["message"]
    st, _, r = post(srv, {"query": "q", "documents": ["d"], "unknown": 1})
    assert st == 400 and "unknown" in r["error"]["message"]
    st, _, r = request(srv.socket, "GET", "/health")
    assert st == 200


@pytest.mark.parametrize("version", [1, 2])
def test_cohere_sdk(srv, version):
    """Cohere's own SDK (v1: /v1/rerank with return_documents; v2: /v2/rerank) over the socket."""
    cohere = pytest.importorskip("cohere")
    from daemon_support import uds_httpx
    kind = cohere.Client if version == 1 else cohere.ClientV2
    client = kind(api_key="unused", base_url="http://edged", httpx_client=uds_httpx(srv.socket))
    extra = {"return_documents": True} if version == 1 else {}
    r = client.rerank(model="ce", query="Machine learning is", documents=TEST_DOCUMENTS, top_n=3, **extra)
    assert len(r.results) == 3 and sorted({x.index for x in r.results}) == sorted(x.index for x in r.results)
    scores = [x.relevance_score for x in r.results]
    assert scores == sorted(scores, reverse=True)
    if version == 1:
        assert all(x.document.text == TEST_DOCUMENTS[x.index] for x in r.results)
