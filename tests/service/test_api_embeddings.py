"""Embeddings through a real daemon serving signed models: a BERT encoder (the synthetic
embed-bert golden model), a nomic-bert one, and a decoder (stories260K): the openai SDK's
embeddings.create (float and base64), LangChain's OpenAIEmbeddings, curl --unix-socket, and
llama-server's /embedding, compared with Model.embed and llama.cpp's golden vectors; plus the
errors a client gets (over-long input, bad fields, dimensions, a chat request to an encoder)."""
import base64
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import testdata
from daemon_support import Server, openai_client, signing_key, uds_httpx

pytest.importorskip("httpx")

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDENS = os.path.join(HERE, "..", "data", "goldens")
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog.",
         "a", "embeddings: mean, cls and last pooling; 12345 tokens!"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-embeddings")
    models = tmp / "models"
    models.mkdir()
    for name, src in (("bert", os.path.join(GOLDENS, "embed-bert.gguf")),
                      ("nomic", os.path.join(GOLDENS, "embed-nomic-bert.gguf")),
                      ("stories", testdata("models", "stories260K.gguf")),
                      ("minilm", testdata("models", "all-MiniLM-L6-v2.Q8_0.gguf"))):
        shutil.copyfile(src, models / f"{name}.gguf")
        sign_file(str(models / f"{name}.gguf"), key)
    s = Server(tmp, str(models), trusted, default_model="bert",
               extra={"n_parallel": 2, "ctx_size": 256, "threads": 2, "auto_load": True})
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def http(srv):
    with uds_httpx(srv.socket) as c:
        yield c


@pytest.fixture(scope="module")
def client(srv):
    return openai_client(srv.socket)


def golden(name, pooling):
    return np.load(os.path.join(GOLDENS, f"embed-{name}.embeddings.npz"))[f"emb_{pooling}"]


def close_to(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    return got.shape == want.shape and cos.min() >= 0.9999 and np.abs(got - want).max() < 1e-4


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_openai_sdk_embeddings_match_llama_cpp(client, fmt):
    r = client.embeddings.create(model="bert", input=TEXTS, encoding_format=fmt)
    got = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
    if fmt == "base64":                 # the SDK hands base64 back as the string it got
        got = [np.frombuffer(base64.b64decode(e), "<f4") if isinstance(e, str) else e for e in got]
    assert close_to(got, golden("bert", "mean"))
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(TEXTS) * 2
    assert r.model == "bert"


def test_openai_sdk_default_call_and_nomic(client):
    # the SDK asks for base64 by default and decodes it itself
    r = client.embeddings.create(model="nomic", input=TEXTS[1])
    assert close_to([r.data[0].embedding], golden("nomic-bert", "mean")[1:2])


def test_langchain_openai_embeddings(srv):
    lc = pytest.importorskip("langchain_openai")
    emb = lc.OpenAIEmbeddings(model="bert", base_url="http://edged/v1", api_key="unused",
                              check_embedding_ctx_length=False, max_retries=0,
                              http_client=uds_httpx(srv.socket))
    docs = emb.embed_documents(TEXTS)
    assert close_to(docs, golden("bert", "mean"))
    assert close_to([emb.embed_query(TEXTS[0])], golden("bert", "mean")[:1])


def test_langchain_openai_embeddings_on_minilm(srv, http):
    """A real sentence-embedding model (all-MiniLM-L6-v2) through LangChain as docs/api.md says to
    set it up: check_embedding_ctx_length=False sends the texts, which the daemon tokenizes
    with the model's own WordPiece vocabulary, against llama.cpp's vectors. The default sends
    tiktoken's cl100k ids instead (docs/api.md): ids past MiniLM's 30,522 are a 400 that names
    the token, as here."""
    lc = pytest.importorskip("langchain_openai")
    with open(testdata("models", "all-MiniLM-L6-v2.Q8_0.reference.json")) as f:
        rows = json.load(f)["rows"][:4]
    emb = lc.OpenAIEmbeddings(model="minilm", base_url="http://edged/v1", api_key="unused",
                              check_embedding_ctx_length=False, max_retries=0,
                              http_client=uds_httpx(srv.socket))
    got = np.array(emb.embed_documents([r["text"] for r in rows]))
    want = np.array([r["embedding"] for r in rows])
    assert got.shape == want.shape and ((got * want).sum(1) / np.linalg.norm(want, axis=1)).min() > 0.999
    # the same model's ids, as a list of lists, give the same vectors
    r = http.post("/v1/embeddings", json={"model": "minilm", "input": [r["tokens"] for r in rows]})
    assert np.abs(np.array([d["embedding"] for d in r.json()["data"]]) - got).max() < 1e-5
    # cl100k's ids for "hello world" ([15339, 1917]) are MiniLM ids of other words: no error can
    # tell; an id past the vocabulary is refused, naming where it is
    r = http.post("/v1/embeddings", json={"model": "minilm", "input": [[101, 7592, 102], [15339, 31373, 1917]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert "input 1, token 1: id 31373 out of range: the model's vocabulary is [0, 30522)" in r.text


def test_many_texts_in_one_request_give_the_bits_of_each_alone(http):
    """/v1/embeddings with 32 texts runs them through shared encoder passes (512-token units);
    each vector (base64: the float32 bytes) is the one its text gets in a request of its own."""
    texts = [f"text {i}: " + "the quick brown fox " * (i % 9) for i in range(32)]

    def vecs(inputs):
        r = http.post("/v1/embeddings", json={"model": "minilm", "input": inputs,
                                              "encoding_format": "base64"})
        assert r.status_code == 200, r.text
        return [base64.b64decode(d["embedding"]) for d in r.json()["data"]]

    together = vecs(texts)
    assert len(together) == 32 and all(len(v) == 384 * 4 for v in together)
    assert together == [vecs([t])[0] for t in texts]


def test_curl_token_ids_dimensions_and_pooling(srv, http):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl not installed")
    body = json.dumps({"model": "bert", "input": TEXTS[0], "pooling": "cls"})
    out = subprocess.run([curl, "-sS", "--unix-socket", srv.socket, "-H",
                          "Content-Type: application/json", "-d", body,
                          "http://edged/v1/embeddings"], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert close_to([r["data"][0]["embedding"]], golden("bert", "cls")[:1])
    ids = json.loads(http.post("/tokenize", json={"model": "bert", "content": TEXTS[1],
                                                 "add_special": True}).content)["tokens"]
    r = http.post("/v1/embeddings", json={"model": "bert", "input": [ids, ids]}).json()
    assert close_to([d["embedding"] for d in r["data"]], golden("bert", "mean")[[1, 1]])
    r = http.post("/v1/embeddings", json={"model": "bert", "input": TEXTS[1], "dimensions": 8}).json()
    v = np.array(r["data"][0]["embedding"])
    want = golden("bert", "mean")[1, :8]
    assert v.shape == (8,) and abs(np.linalg.norm(v) - 1) < 1e-5
    assert np.abs(v - want / np.linalg.norm(want)).max() < 1e-4


def test_a_decoder_embeds_with_a_pooling(http):
    r = http.post("/v1/embeddings", json={"model": "stories", "input": TEXTS, "pooling": "last"})
    assert r.status_code == 200, r.text
    got = [d["embedding"] for d in r.json()["data"]]
    want = np.load(os.path.join(GOLDENS, "embed-stories260K.embeddings.npz"))["emb_last"]
    cos = (np.array(got) * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999
    # without one: the file has no pooling type, as llama-server says
    r = http.post("/v1/embeddings", json={"model": "stories", "input": "x"})
    assert r.status_code == 400 and "no pooling type" in r.json()["error"]["message"]


def test_llama_server_embedding_route(http):
    r = http.post("/embedding", json={"model": "bert", "content": TEXTS[:2]}).json()
    assert [x["index"] for x in r] == [0, 1]
    assert close_to([x["embedding"][0] for x in r], golden("bert", "mean")[:2])
    r = http.post("/embedding", json={"model": "bert", "content": TEXTS[0], "pooling": "none"}).json()
    ids = http.post("/tokenize", json={"model": "bert", "content": TEXTS[0],
                                       "add_special": True}).json()["tokens"]
    assert ids[0] == 2 and ids[-1] == 3         # [CLS] ... [SEP] of the synthetic vocabulary
    assert len(r[0]["embedding"]) == len(ids)   # one row per token


@pytest.mark.parametrize("body, status, words", [
    ({"model": "bert", "input": "word " * 200}, 400, "limit of 128"),
    ({"model": "bert", "input": []}, 400, "'input' must not be empty"),
    ({"model": "bert", "input": ["ok", ""]}, 400, "'input[1]' is empty"),
    ({"model": "bert", "input": {"a": 1}}, 400, "'input' must be a string"),
    ({"model": "bert", "input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
    ({"model": "bert", "input": "x", "dimensions": 33}, 400, "more than the model's 32"),
    ({"model": "bert", "input": "x", "pooling": "none"}, 400, "/embedding"),
    ({"model": "bert", "input": [[5, 99999]]}, 400, "out of range"),
    ({"model": "bert", "input": "x", "temperature": 1}, 400, "unsupported field"),
])
def test_errors_name_what_is_wrong(http, body, status, words):
    r = http.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


def test_chat_to_an_encoder_is_refused_and_the_daemon_keeps_serving(http):
    r = http.post("/v1/chat/completions", json={"model": "bert", "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "only embeds" in r.json()["error"]["message"], r.text
    r = http.post("/v1/completions", json={"model": "bert", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert http.post("/v1/embeddings", json={"model": "bert", "input": "x"}).status_code == 200
