"""`edged serve --listen` (no systemd, the sandbox on) serving the real SmolLM2-135M: litellm and
LangChain with the key, and what the transport refuses before any route runs (no key, a body
too large) in each protocol's own error shape. The openai, anthropic and ollama clients over --listen are
in test_api_tcp.py."""
import os

import pytest

from daemon_support import KEY, keys_file, listening_port, running, smol_models

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: api_keys_file must be owned by root")
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp, models, trusted = smol_models(tmp_path_factory, "listen-clients")
    with running(tmp, models, trusted, default_model="smol", args=["--listen", "127.0.0.1:0"],
                 extra={"api_keys_file": keys_file(tmp), "sandbox": "enforce", "ctx_size": 512,
                        "threads": 2}) as srv:
        yield f"http://127.0.0.1:{listening_port(srv)}"


def test_litellm(url):
    litellm = pytest.importorskip("litellm")
    r = litellm.completion(model="openai/smol", api_base=url + "/v1", api_key=KEY, max_tokens=6,
                           messages=ASK, temperature=0)
    assert r.choices[0].message.content


def test_langchain(url):
    lc = pytest.importorskip("langchain_openai")
    chat = lc.ChatOpenAI(model="smol", base_url=url + "/v1", api_key=KEY, max_tokens=6, temperature=0, max_retries=0)
    assert chat.invoke(ASK).content


def test_refusals_before_any_route_come_in_each_protocols_shape(url):
    """The transport's 401 (no key) and 413 (body over max_body_bytes) on each protocol's path:
    OpenAI's {"error": {...}}, Anthropic's {"type": "error", ...}, Ollama's {"error": MESSAGE}."""
    import httpx
    for path, shape in [("/v1/chat/completions", "openai"), ("/v1/responses", "openai"),
                        ("/v1/messages", "anthropic"), ("/api/chat", "ollama")]:
        for headers, body, status in [({}, b"{}", 401),
                                      ({"Authorization": f"Bearer {KEY}"}, b" " * (2 << 20), 413)]:
            r = httpx.post(url + path, content=body, headers=headers, timeout=120)
            assert r.status_code == status, (path, r.text)
            e = r.json()
            if shape == "openai":
                assert isinstance(e["error"], dict) and e["error"]["message"], (path, e)
            elif shape == "anthropic":
                assert e["type"] == "error" and e["error"]["type"] in ("authentication_error", "request_too_large"), e
            else:
                assert isinstance(e["error"], str) and e["error"], (path, e)
