"""Anthropic's Messages API with the real `anthropic` SDK against a real daemon serving the real,
signed SmolLM2-135M-Instruct: messages.create, messages.stream (the events in Anthropic's order,
the streamed text equal to the whole reply's), a tool round trip (a forced tool_use, then its
tool_result), count_tokens, stop_sequences, thinking blocks (the same model behind a template
that opens <think>), refusals in Anthropic's error shape, and TCP with `x-api-key`.

A 135M model cannot pick tools sensibly: the call is forced with tool_choice; what is checked is
that it arrives well-formed and in Anthropic's shape."""
import importlib
import json
import os
import shutil

import pytest

from conftest import testdata
from daemon_support import Server, signing_key, socket_activated

pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# ChatML, opening <think> in the generation prompt unless enable_thinking is false
THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
            "not enable_thinking %}<think></think>{% else %}<think>{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}         # the SDK no longer types temperature: sent as extra_body
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-anthropic")
    models = tmp / "models"
    models.mkdir()
    for name in ("smol", "smolthink"):
        dst = models / f"{name}.gguf"
        shutil.copyfile(testdata("models", SMOL), dst)
        sign_file(str(dst), key)
    (models / "smolthink.jinja").write_text(THINKING)
    s = Server(tmp, str(models), trusted, default_model="smol",
               extra={"n_parallel": 2, "ctx_size": 1024, "max_queue": 16, "threads": 2, "max_loaded_models": 2})
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def client(srv):
    # the SDK takes a client of its own HTTP library (httpx, httpx2 in newer releases)
    base = next(c for c in anthropic.DefaultHttpxClient.__mro__ if c.__module__.split(".")[0] in ("httpx", "httpx2"))
    lib = importlib.import_module(base.__module__.split(".")[0])
    return anthropic.Anthropic(base_url="http://edged", api_key="unused", max_retries=0,
                               http_client=anthropic.DefaultHttpxClient(transport=lib.HTTPTransport(uds=srv.socket),
                                                                        timeout=300))


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket), base_url="http://edged",
                      timeout=300) as c:
        yield c


def raw_events(http, body):
    """(event name, data) of a streamed /v1/messages reply, as sent."""
    with http.stream("POST", "/v1/messages", json=dict(body, stream=True),
                     headers={"anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for chunk in text.strip().split("\n\n"):
        name, data = chunk.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        payload = json.loads(data[len("data: "):])
        assert payload["type"] == name[len("event: "):]
        out.append((payload["type"], payload))
    return out


def test_create_and_stream_agree(client, http):
    m = client.messages.create(model="smol", max_tokens=24, messages=ASK, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == "smol" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 5 < m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) and 0 < m.usage.output_tokens <= 24
    with client.messages.stream(model="smol", max_tokens=24, messages=ASK,
                                extra_body=GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == final.content[0].text == m.content[0].text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    # Anthropic's order of events, ping after the first block opens
    events = raw_events(http, {"model": "smol", "max_tokens": 24, "messages": ASK, **GREEDY})
    kinds = [k for k, _ in events]
    n = kinds.count("content_block_delta")
    assert kinds == ["message_start", "content_block_start", "ping"] + ["content_block_delta"] * n + \
        ["content_block_stop", "message_delta", "message_stop"], kinds
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta") == m.content[0].text
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": m.stop_reason, "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == m.usage.output_tokens


def test_system_blocks_and_count_tokens(client):
    system = [{"type": "text", "text": "You answer in one word.", "cache_control": {"type": "ephemeral"}}]
    m = client.messages.create(model="smol", max_tokens=8, system=system, messages=ASK, extra_body=GREEDY,
                               metadata={"user_id": "u-1"})
    n = client.messages.count_tokens(model="smol", system=system, messages=ASK).input_tokens
    assert n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    longer = [{"type": "text", "text": "You answer in one word."}, {"type": "text", "text": "Never more than one."}]
    assert client.messages.count_tokens(model="smol", system=longer, messages=ASK).input_tokens > n
    with_tools = client.messages.count_tokens(model="smol", messages=ASK, tools=[WEATHER]).input_tokens
    assert with_tools > client.messages.count_tokens(model="smol", messages=ASK).input_tokens + 10


def test_stop_sequences(client, http):
    full = client.messages.create(model="smol", max_tokens=24, messages=ASK, extra_body=GREEDY).content[0].text
    words = full.split()
    assert len(words) >= 4, full
    stop = " " + words[2]
    m = client.messages.create(model="smol", max_tokens=24, messages=ASK, stop_sequences=["never-appears", stop],
                               extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == full[:full.index(stop)]
    events = raw_events(http, {"model": "smol", "max_tokens": 24, "messages": ASK, "stop_sequences": [stop], **GREEDY})
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_tool_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model="smol", max_tokens=60, messages=ask, tools=[WEATHER], extra_body=GREEDY,
                               tool_choice={"type": "tool", "name": "get_weather"})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and m.stop_reason == "tool_use", m
    use = uses[0]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and isinstance(use.input["city"], str)
    # the same forced call streamed: input_json_delta adds up to the same input ("any" would let
    # a 135M model call it again and again until max_tokens)
    with client.messages.stream(model="smol", max_tokens=60, messages=ask, tools=[WEATHER], extra_body=GREEDY,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content if b.type == "tool_use"] == ["tool_use"]
    assert final.stop_reason == "tool_use" and next(b for b in final.content if b.type == "tool_use").input == use.input
    # the round trip: the assistant's content as the SDK returned it, then the tool's result
    turns = ask + [{"role": "assistant", "content": m.content},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                 "content": [{"type": "text", "text": "Sunny, 21 C"}]}]}]
    r = client.messages.create(model="smol", max_tokens=24, messages=turns, tools=[WEATHER], extra_body=GREEDY)
    assert r.content and r.content[0].type == "text" and r.stop_reason in ("end_turn", "max_tokens")
    assert client.messages.count_tokens(model="smol", messages=turns, tools=[WEATHER]).input_tokens > \
        client.messages.count_tokens(model="smol", messages=ask, tools=[WEATHER]).input_tokens


def test_structured_output(client):
    fmt = {"type": "json_schema", "schema": {"type": "object", "properties": {"city": {"type": "string",
                                                                                        "maxLength": 20}},
                                             "required": ["city"], "additionalProperties": False}}
    m = client.messages.create(model="smol", max_tokens=40, messages=ASK,
                               extra_body={"output_config": {"format": fmt}, **GREEDY})
    assert set(json.loads(m.content[0].text)) == {"city"}


def test_thinking_blocks(client, http):
    body = dict(model="smolthink", max_tokens=16, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024})
    m = client.messages.create(**body, extra_body=GREEDY)
    assert m.content[0].type == "thinking" and m.content[0].thinking and m.content[0].signature == ""
    with client.messages.stream(**body, extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == m.content[0].thinking
    events = raw_events(http, {**body, **GREEDY})
    assert events[1][1]["content_block"]["type"] == "thinking"
    assert {e["delta"]["type"] for k, e in events if k == "content_block_delta"} == {"thinking_delta"}
    off = client.messages.create(**dict(body, thinking={"type": "disabled"}), extra_body=GREEDY)
    assert [b.type for b in off.content] == ["text"], off


def test_refusals_in_anthropic_shape(client, http):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smol", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[1]" in body["error"]["message"] and "image" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-no-such-model", max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    for bad, field in [({"messages": ASK}, "max_tokens"), ({"messages": ASK, "max_tokens": 8, "seed": 1}, "seed"),
                       ({"messages": ASK, "max_tokens": 8, "tool_choice": {"type": "any"}}, "tool_choice"),
                       ({"messages": ASK + [{"role": "assistant", "content": "Paris is"}], "max_tokens": 8},
                        "messages[1]")]:
        r = http.post("/v1/messages", json=bad)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert f"'{field}'" in r.json()["error"]["message"] or field in r.json()["error"]["message"], r.text
    r = http.post("/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": [image]}]})
    assert r.status_code == 400 and "image" in r.json()["error"]["message"]
    assert client.messages.create(model="smol", max_tokens=2, messages=ASK).usage.output_tokens <= 2   # still serving


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: api_keys_file must be owned by root")
@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing")
def test_tcp_with_x_api_key(tmp_path, tmp_path_factory):
    from daemon_support import KEY, free_port, keys_file
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(testdata("models", SMOL), models / "smol.gguf")
    sign_file(str(models / "smol.gguf"), key)
    port = free_port()
    srv, _ = socket_activated(tmp_path, str(models), trusted, port, default_model="smol",
                              extra={"api_keys_file": keys_file(tmp_path), "ctx_size": 512})
    try:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(anthropic.AuthenticationError):     # the first connection starts the daemon
            anthropic.Anthropic(base_url=url, api_key="z" * 24, max_retries=0, timeout=120).messages.create(
                model="smol", max_tokens=4, messages=ASK)
        srv.wait_ready(60)
        # Anthropic's docs (curl) and older SDKs send the key as x-api-key; newer SDKs as a Bearer token
        body = {"model": "smol", "max_tokens": 4, "messages": ASK}
        for headers, status in [({"x-api-key": KEY}, 200), ({"x-api-key": KEY[:-1]}, 401), ({}, 401)]:
            r = httpx.post(url + "/v1/messages", json=body, timeout=120,
                           headers={"anthropic-version": "2023-06-01", **headers})
            assert r.status_code == status and (r.json()["content"] if status == 200 else r.json()["error"]), r.text
        c = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
        m = c.messages.create(**body)
        assert m.content and m.usage.output_tokens <= 4
        assert c.messages.count_tokens(model="smol", messages=ASK).input_tokens > 5
    finally:
        srv.stop()


def test_stop_matcher_names_the_stop_string():
    from edged.text.sampling import StopMatcher
    m = StopMatcher(["world", "lo w"])
    assert m.push("He") == ("He", False) and m.hit is None
    assert m.push("llo world") == ("l", True) and m.hit == "lo w"     # the earliest in the text


def test_blocks_map_to_chat_turns():
    """No daemon: the chat turns a conversation with thinking, a tool call and its result becomes
    (tool results before the text that follows them, named after their call)."""
    from edged.service.anthropic import parse
    r = parse({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."},
                                                         {"type": "text", "text": "Use tools."}],
               "tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
               "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"}, "messages": [
                   ASK[0],
                   {"role": "assistant", "content": [{"type": "thinking", "thinking": "Paris?", "signature": "s"},
                                                     {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                      "input": {"city": "Paris"}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                                {"type": "text", "text": "And"}, {"type": "text", "text": "tomorrow?"}]}]})
    assert r.messages == (
        {"role": "system", "content": "Be brief.\n\nUse tools."}, ASK[0],
        {"role": "assistant", "content": "", "reasoning_content": "Paris?", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny", "name": "get_weather"},
        {"role": "user", "content": "And\n\ntomorrow?"})
    assert (r.tools.choice, r.tools.parallel, r.template_kwargs) == ("required", False, {"enable_thinking": False})
    assert r.tools.tools[0]["function"]["parameters"] == WEATHER["input_schema"]


def test_stream_blocks_open_close_and_add_up():
    """No daemon: thinking, then text, then a tool call as one stream's blocks: indexes in
    order, a ping after the first start, blank text before a block held back, thinking stripped
    at both ends as the whole reply strips it."""
    from edged.service.anthropic import _Blocks
    b = _Blocks()
    for kind, text in [("thinking", "\n Hmm,"), ("thinking", " Paris. \n"), ("text", "\n"), ("thinking", " "),
                       ("text", "It is"), ("text", " Paris.")]:
        getattr(b, kind)(text)
    b.tool_use({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}})
    b.close()
    events = [(e.split(b"\n", 1)[0].decode()[len("event: "):], json.loads(e.split(b"data: ", 1)[1]))
              for e in b.take()]
    assert [(k, d.get("index")) for k, d in events] == [
        ("content_block_start", 0), ("ping", None), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
        ("content_block_stop", 1), ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2)]
    deltas = [d["delta"] for k, d in events if k == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "Hmm, Paris."
    assert "".join(d.get("text", "") for d in deltas) == "\nIt is Paris."
    assert events[-3][1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    assert deltas[-1] == {"type": "input_json_delta", "partial_json": '{"a": 1}'}
