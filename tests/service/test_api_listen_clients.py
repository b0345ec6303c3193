"""Every protocol's own client over TCP with `edged serve --listen` (no systemd, the sandbox
on), against the real SmolLM2-135M: the openai SDK (chat completions and Responses), the
anthropic SDK (its key as x-api-key), the ollama client and litellm, each with the key, and
each refused without it, in its own protocol's error shape."""
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


def test_openai_chat_and_responses(url):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    r = c.chat.completions.create(model="smol", messages=ASK, max_tokens=6, temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 6
    r = c.responses.create(model="smol", input="What is the capital of France?", max_output_tokens=6)
    assert r.output_text and r.usage.output_tokens <= 6
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="z" * 24, max_retries=0).responses.create(
            model="smol", input="Hi", max_output_tokens=2)


def test_anthropic(url):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    m = c.messages.create(model="smol", max_tokens=6, messages=ASK)
    assert m.content[0].text and m.usage.output_tokens <= 6
    with c.messages.stream(model="smol", max_tokens=6, messages=ASK) as s:
        assert "".join(s.text_stream)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="z" * 24, max_retries=0).messages.create(
            model="smol", max_tokens=2, messages=ASK)


def test_ollama(url):
    ollama = pytest.importorskip("ollama")
    c = ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
    r = c.chat(model="smol", messages=ASK, options={"num_predict": 6, "temperature": 0})
    assert r.message.content and r.eval_count <= 6
    assert "".join(p.message.content for p in c.chat(model="smol", messages=ASK, stream=True,
                                                     options={"num_predict": 6}))
    assert [m.model for m in c.list().models] == ["smol:latest"]     # as Ollama names a tag
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).chat(model="smol", messages=ASK)
    assert e.value.status_code == 401


def test_litellm(url):
    litellm = pytest.importorskip("litellm")
    r = litellm.completion(model="openai/smol", api_base=url + "/v1", api_key=KEY, max_tokens=6,
                           messages=ASK, temperature=0)
    assert r.choices[0].message.content


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
