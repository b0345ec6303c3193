"""Handlers without a socket (docs/architecture.md, "The service"): ApiRequest in, Reply out."""
import asyncio
import json

import pytest

from conftest import testdata
from daemon_support import make_daemon
from edged.service.openai import parse
from edged.service.wire import ApiRequest, Peer, StreamReply
from edged.text.chat import render
from edged.errors import RequestError


def call(d, method, path, body=None, raw=None, peer=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    req = ApiRequest(method, path, data, peer)
    reply = asyncio.run(d.api.handle(req))
    assert not isinstance(reply, StreamReply)
    return reply.status, reply.body, reply.headers


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, needle", [
    ({**CHAT, "n": 9}, "'n' must be between 1 and 8"),
    ({**CHAT, "functions": [{"name": "f"}], "tools": []}, "give 'tools' or the legacy 'functions'"),
    ({**CHAT, "audio": {"voice": "alloy", "format": "wav"}}, "'audio' is not supported: no model here speaks"),
    ({**CHAT, "guided_json": {}, "grammar": "root ::= \"a\""}, "only one of"),
    ({**CHAT, "repetition_penalty": 1.2, "repeat_penalty": 1.1}, "'repetition_penalty' and 'repeat_penalty'"),
    ({**CHAT, "repetition_penalty": 0}, "'repetition_penalty' must be between"),
    ({**CHAT, "options": {"temperature": 0.5}, "temperature": 0.7}, "'options.temperature' and 'temperature'"),
    ({**CHAT, "options": {"top_k": "many"}}, "'options.top_k'"),
    ({**CHAT, "min_tokens": -1}, "'min_tokens' must be between"),
    ({**CHAT, "logprobs": "yes"}, "'logprobs' must be true or false"),
    ({**CHAT, "top_logprobs": 3}, "'top_logprobs' needs 'logprobs': true"),
    ({**CHAT, "top_logprobs": 21, "logprobs": True}, "'top_logprobs' must be between 0 and 20"),
    ({**CHAT, "tools": [{"type": "function"}]}, "'tools[0].function' is required"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "'tools[0].function.name'"),
    ({**CHAT, "tool_choice": "maybe"}, "'tool_choice' must be 'none', 'auto' or 'required'"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "g"}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "names function 'f'"),
    ({**CHAT, "response_format": {"type": "xml"}}, "'response_format.type' must be"),
    ({**CHAT, "response_format": {"type": "json_schema"}}, "'response_format.json_schema.schema' is required"),
    ({**CHAT, "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "only one of"),
    ({**CHAT, "chat_template_kwargs": []}, "'chat_template_kwargs'"),
    ({**CHAT, "stream_options": {"include_usage": 1}}, "'stream_options.include_usage' must be true or false"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "'messages[0].tool_call_id' is required"),
    ({"messages": [{"role": "user", "content": "x", "colour": {}}]}, "unsupported field 'messages[0].colour'"),
    ({**CHAT, "temperature": 3}, "'temperature' must be between"),
    ({**CHAT, "temperature": "hot"}, "'temperature' must be a number"),
    ({**CHAT, "max_tokens": 0}, "'max_tokens' must be a positive integer"),
    ({**CHAT, "max_tokens": 1.5}, "'max_tokens'"),
    ({**CHAT, "top_k": 2.5}, "'top_k' must be an integer"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "'stop'"),
    ({**CHAT, "logit_bias": {"x": 1}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"5": 1000}}, "logit_bias"),
    ({**CHAT, "seed": "42"}, "'seed'"),
    ({**CHAT, "stream": "yes"}, "'stream'"),
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "'messages[0].content[0].image_url' is required"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]},
     "'messages[0].content[0].image_url.url': only data: URLs and file:// paths under image_dirs are read; "
     "edged does not fetch https URLs"),
    ({**CHAT, "model": "../../etc/passwd"}, "invalid model name"),
    ({**CHAT, "model": ".hidden"}, "invalid model name"),
    ({**CHAT, "model": "a/b"}, "invalid model name"),
])
def test_chat_validation_400(tmp_path, body, needle):
    d = make_daemon(tmp_path)
    status, reply, _ = call(d, "POST", "/v1/chat/completions", body)
    assert status == 400, reply
    assert needle in reply["error"]["message"]
    assert reply["error"]["type"] == "invalid_request_error"
    if needle.startswith("'"):      # the field is named in OpenAI's error.param too
        assert reply["error"]["param"] == needle[1:].split("'")[0], reply


def test_fields_clients_send_are_accepted_and_ignored():
    """What OpenAI, llama-server and common clients send beside the fields edged uses."""
    from edged.service import openai_schema
    body = {**CHAT, **{k: None for k in openai_schema.IGNORED}, "user": "u", "cache_prompt": True,
            "parallel_tool_calls": False, "stream_options": {"include_usage": True}}
    r = parse(body, chat=True)
    assert r.messages == ({"role": "user", "content": "hi"},) and r.output.include_usage


def test_a_tool_without_description_or_parameters_renders_in_gpt_oss_template():
    """Both are optional in OpenAI's API; gpt-oss's template reads `tool.description` unguarded,
    so the request's tools reach templates with "" and {} filled in (as llama-server does)."""
    body = {**CHAT, "tools": [{"type": "function", "function": {"name": "get_time"}}]}
    r = parse(body, chat=True)
    assert r.tools.tools == ({"type": "function", "function": {"name": "get_time", "description": "",
                                                               "parameters": {}}},)
    with open(testdata("templates", "openai-gpt-oss-120b.jinja")) as f:
        template = f.read()
    assert "type get_time = () => any;" in render(template, list(r.messages), tools=list(r.tools.tools))


def test_completion_validation_and_accepted_fields():
    r = parse({"prompt": "x", "max_tokens": 5, "stop": "\n", "seed": 1, "top_k": 4, "user": "u",
               "stream": True, "stream_options": {"include_usage": True}, "logit_bias": {"7": -100}},
              chat=False)
    assert r.prompts == ("x",) and r.output.stop == ("\n",) and r.output.include_usage
    assert r.sampling.logit_bias == ((7, -100.0),) and r.sampling.top_k == 4 and r.sampling.seed == 1
    assert parse({"prompt": [1, 2, 3]}, chat=False).prompts == ([1, 2, 3],)
    assert parse({"prompt": ["a", "b"]}, chat=False).prompts == ("a", "b")
    assert parse({"prompt": [[1, 2], [3]]}, chat=False).prompts == ([1, 2], [3])
    with pytest.raises(RequestError, match="'echo'"):
        parse({"prompt": "x", "echo": True}, chat=False)
    with pytest.raises(RequestError, match="exceed 8 choices"):
        parse({"prompt": ["a", "b", "c"], "n": 3}, chat=False)
    with pytest.raises(RequestError, match="messages"):
        parse({"prompt": "x", "messages": []}, chat=False)
    with pytest.raises(RequestError, match="'prompt' must be a string, a list of token ids"):
        parse({"prompt": [1, "a"]}, chat=False)


def test_bad_json_body_too_large_unknown_model_and_route(tmp_path):
    d = make_daemon(tmp_path)
    st, body, _ = call(d, "POST", "/v1/chat/completions", raw=b"{not json")
    assert st == 400 and "not valid JSON" in body["error"]["message"]
    st, body, _ = call(d, "POST", "/v1/chat/completions", raw=b"[1, 2]")
    assert st == 400 and "JSON object" in body["error"]["message"]
    st, body, _ = call(d, "POST", "/v1/chat/completions", raw=b" " * 5000)
    assert st == 413 and body["error"]["code"] == "body_too_large"
    st, body, _ = call(d, "POST", "/v1/chat/completions", {**CHAT, "model": "missing"})
    assert st == 404 and body["error"]["code"] == "model_not_found"
    st, body, _ = call(d, "POST", "/v1/chat/completions", CHAT)
    assert st == 400 and "no default model" in body["error"]["message"]
    st, body, _ = call(d, "GET", "/v1/nothing")
    assert st == 404
    st, body, _ = call(d, "GET", "/v1/chat/completions")
    assert st == 405


def test_health_models_metrics_without_models(tmp_path):
    d = make_daemon(tmp_path)
    (tmp_path / "models" / "tiny.gguf").write_bytes(b"GGUF")
    (tmp_path / "models" / "tiny.gguf.sig").write_bytes(b"x")
    (tmp_path / "models" / ".hidden.gguf").write_bytes(b"GGUF")
    st, body, _ = call(d, "GET", "/health")
    assert st == 503 and body["error"]["message"] == "no model loaded"
    st, body, _ = call(d, "GET", "/v1/models")
    assert st == 200 and [m["id"] for m in body["data"]] == ["tiny"]
    assert body["data"][0]["loaded"] is False and body["data"][0]["signed"] is True
    status, text, _ = call(d, "GET", "/metrics")
    assert status == 200 and "edged_queue_depth 0" in text and "# TYPE edged_requests_total counter" in text


def test_peer_policy(tmp_path):
    d = make_daemon(tmp_path, allow_uids=[1000], allow_gids=[2000], admin_uids=[0], admin_gids=[3000])
    assert call(d, "GET", "/v1/models", peer=Peer(10, 1000, 1000))[0] == 200
    assert call(d, "GET", "/v1/models", peer=Peer(10, 1001, 2000))[0] == 200          # primary group
    assert call(d, "GET", "/v1/models", peer=Peer(10, 1001, 1001, (5, 2000)))[0] == 200  # supplementary
    st, body, _ = call(d, "GET", "/v1/models", peer=Peer(10, 1001, 1001, (5,)))
    assert st == 403 and body["error"]["type"] == "permission_error"
    assert call(d, "POST", "/v1/models/load", {"model": "x"}, peer=Peer(10, 1000, 1000))[0] == 403
    assert call(d, "POST", "/v1/models/load", {"model": "x"}, peer=Peer(10, 7, 7, (3000,)))[0] == 404
    assert d.metrics.peer_refused == 2


def test_completion_and_stream_without_a_socket(tmp_path):
    """The whole request path (registry, scheduler, engine) driven through Api.handle alone."""
    from daemon_support import add_chat_template, stories
    src = stories()
    d = make_daemon(tmp_path, default_model="tiny")
    add_chat_template(src, str(tmp_path / "models" / "tiny.gguf"))
    d.start_threads()

    async def main():
        body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
        r = await d.api.handle(ApiRequest("POST", "/v1/completions", json.dumps(body).encode()))
        assert r.status == 200 and r.body["choices"][0]["text"].startswith(", there was")
        s = await d.api.handle(ApiRequest("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode()))
        assert isinstance(s, StreamReply)
        chunks = [c async for c in s.chunks()]
        await s.close()
        assert chunks[-1] == b"data: [DONE]\n\n"
        text = "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks[:-1])
        assert text == r.body["choices"][0]["text"]
        # abandoning a stream after one chunk frees the slot and the model lease
        s = await d.api.handle(ApiRequest("POST", "/v1/completions",
                                          json.dumps({**body, "max_tokens": 100, "stream": True}).encode()))
        it = s.chunks().__aiter__()
        await it.__anext__()
        await s.close()
        assert d.slots.busy == 0 and d.registry.models["tiny"].refs == 0
        await d.registry.close_all()

    try:
        asyncio.run(main())
    finally:
        d.decoder.stop()


def test_long_prompt_chunked_prefill_matches_the_engine(tmp_path):
    """A prompt of several PREFILL_CHUNKs is evaluated chunk by chunk between decode rounds;
    the greedy text must be what the engine gives for the whole prompt at once."""
    from daemon_support import add_chat_template, stories
    from edged.engine.model import Model
    from edged.service.scheduler import PREFILL_CHUNK
    src = stories()
    d = make_daemon(tmp_path, default_model="tiny", ctx_size=1024, max_body_bytes=1 << 20)
    add_chat_template(src, str(tmp_path / "models" / "tiny.gguf"))
    prompt = "Once upon a time, there was a little girl named Lily." + " She liked to play in the park." * 40
    m = Model.load(src)
    ids = m.tokenizer.encode(prompt)
    assert len(ids) > 2 * PREFILL_CHUNK
    want = "".join(o.text for o in m.session(1024).generate(ids, max_tokens=12))
    m.close()
    d.start_threads()

    async def main():
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
        req = ApiRequest("POST", "/v1/completions", json.dumps(body).encode())
        r = await d.api.handle(req)
        assert r.status == 200, r.body
        assert r.body["usage"]["prompt_tokens"] == len(ids)
        assert r.body["choices"][0]["text"] == want
        # evaluated once, chunk by chunk: the engine's own prefill found the chunks in the cache
        assert (req.info["cached_tokens"], req.info["prompt_eval"]) == (0, len(ids))
        body["prompt"] = prompt + " The end."
        req2 = ApiRequest("POST", "/v1/completions", json.dumps(body).encode())
        r2 = await d.api.handle(req2)
        n2, cached = r2.body["usage"]["prompt_tokens"], r2.body["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= len(ids) - 2 and req2.info["prompt_eval"] == n2 - cached
        await d.registry.close_all()

    try:
        asyncio.run(main())
    finally:
        d.decoder.stop()


THINKING = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% else %}<think>{% endif %}{% endif %}")


def test_chat_template_kwargs_and_reasoning_split(tmp_path):
    """A template that opens <think> in the prompt unless enable_thinking is false: the reply
    is reasoning_content, or content when chat_template_kwargs turns thinking off."""
    from daemon_support import add_chat_template, stories
    d = make_daemon(tmp_path, default_model="tiny")
    add_chat_template(stories(), str(tmp_path / "models" / "tiny.gguf"), THINKING)
    d.start_threads()

    async def ask(**extra):
        body = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 8, "temperature": 0,
                **extra}
        return await d.api.handle(ApiRequest("POST", "/v1/chat/completions", json.dumps(body).encode()))

    async def main():
        r = await ask()
        msg = r.body["choices"][0]["message"]
        assert r.status == 200 and msg["reasoning_content"] and msg["content"] == "", msg
        off = (await ask(chat_template_kwargs={"enable_thinking": False})).body["choices"][0]["message"]
        assert off["content"] and "reasoning_content" not in off, off
        raw = (await ask(reasoning_format="none")).body["choices"][0]["message"]
        assert raw["content"].strip() == msg["reasoning_content"] and "reasoning_content" not in raw
        s = await ask(stream=True)
        chunks = [json.loads(c[6:]) async for c in s.chunks() if c != b"data: [DONE]\n\n"]
        await s.close()
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(x.get("reasoning_content", "") for x in deltas).strip() == msg["reasoning_content"]
        assert not "".join(x.get("content") or "" for x in deltas)
        bad = await ask(chat_template_kwargs={"messages": []})
        assert bad.status == 400 and bad.body["error"]["param"] == "chat_template_kwargs"
        await d.registry.close_all()

    try:
        asyncio.run(main())
    finally:
        d.decoder.stop()


def test_n_choices_over_a_chunked_prompt_equal_single_requests(tmp_path):
    """n=3 evaluates a prompt of several PREFILL_CHUNKs once and copies its KV cache: choice j
    equals a request with n=1 and seed + j; afterwards the slot, lease and sessions are free."""
    from daemon_support import add_chat_template, stories
    d = make_daemon(tmp_path, default_model="tiny", ctx_size=1024, max_body_bytes=1 << 20)
    add_chat_template(stories(), str(tmp_path / "models" / "tiny.gguf"))
    d.start_threads()
    prompt = "Once upon a time, there was a little girl named Lily." + " She liked to play in the park." * 40

    async def complete(**extra):
        body = {"prompt": prompt, "max_tokens": 10, "temperature": 1.0, "seed": 77, **extra}
        r = await d.api.handle(ApiRequest("POST", "/v1/completions", json.dumps(body).encode()))
        assert r.status == 200, r.body
        return [c["text"] for c in sorted(r.body["choices"], key=lambda c: c["index"])]

    async def main():
        many = await complete(n=3)
        single = [(await complete(seed=77 + j))[0] for j in range(3)]
        assert many == single and len(set(many)) > 1
        # an abandoned n=2 stream frees everything too
        s = await d.api.handle(ApiRequest("POST", "/v1/completions", json.dumps(
            {"prompt": prompt, "max_tokens": 200, "n": 2, "stream": True}).encode()))
        it = s.chunks().__aiter__()
        await it.__anext__()
        await s.close()
        lm = d.registry.models["tiny"]
        assert d.slots.busy == 0 and lm.refs == 0 and len(lm._sessions) == 1
        await d.registry.close_all()

    try:
        asyncio.run(main())
    finally:
        d.decoder.stop()
