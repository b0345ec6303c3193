"""The OpenAI Responses API (/v1/responses) with the clients that speak it, against a real
daemon serving the real, signed SmolLM2-135M-Instruct: the openai SDK (create with a string,
with items and instructions, streamed events in order, `.stream`, `.parse` with a pydantic
model, a function tool round trip, previous_response_id, store false, retrieve and delete),
openai-agents' default model running an agent with a function tool, pydantic-ai's
OpenAIResponsesModel and litellm.responses. Then, without a socket: reasoning items from a
template that thinks, and the store's ownership (another peer or API key gets 404).

A 135M model does not choose tools on its own: calls are forced with tool_choice."""
import asyncio
import json
import os
import re
import shutil
import socket
import time

import pytest

from daemon_support import (KEY, SMOL_CONFIG, keys_file, listening_port, make_daemon, openai_client,
                            smol_models, smol_server, socket_activated)
from edged.service.wire import ApiRequest, Peer, StreamReply

pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
FORCE = {"type": "function", "name": "get_weather"}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "max_output_tokens": 16}


@pytest.fixture(scope="module", params=["unix", "tcp"])
def srv(request, tmp_path_factory):
    """The daemon, reached over its Unix socket or over TCP (`edged serve --listen`, with an API
    key): `srv.url`, `srv.key` and transport(srv, cls) say how."""
    if request.param == "unix":
        s = smol_server(tmp_path_factory, "api-responses")
        s.url, s.key = "http://edged", "unused"
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root: api_keys_file must be owned by root")
        keys = keys_file(tmp_path_factory.mktemp("responses-keys"))
        s = smol_server(tmp_path_factory, "api-responses-tcp", args=["--listen", "127.0.0.1:0"], api_keys_file=keys)
        s.url, s.key = f"http://127.0.0.1:{listening_port(s)}", KEY
    yield s
    assert s.stop() == 0, s.logtext()


def transport(srv, cls=httpx.HTTPTransport):
    """An httpx transport (cls: sync or async) to the daemon the way `srv` reaches it."""
    return cls(uds=srv.socket) if srv.url == "http://edged" else cls()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(transport=transport(srv), base_url=srv.url, timeout=300,
                      headers={"Authorization": f"Bearer {srv.key}"}) as c:
        yield c


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.key, max_retries=0,
                         http_client=httpx.Client(transport=transport(srv), timeout=300))


def async_client(srv):
    return openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=srv.key, max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport(srv, httpx.AsyncHTTPTransport),
                                                            timeout=300))


# --- the openai SDK ------------------------------------------------------------------------

def test_string_input_with_instructions(client, http):
    r = client.responses.create(model="smol", input="What is the capital of France?",
                                instructions="Answer in one short sentence.", **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "smol"
    assert r.status in ("completed", "incomplete") and r.output_text
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    u = r.usage
    assert 0 < u.output_tokens <= 16 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0
    # the instructions are a system turn: the prompt chat completions makes of them
    chat = http.post("/v1/chat/completions", json={"messages": [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 16}).json()
    assert u.input_tokens == chat["usage"]["prompt_tokens"]
    assert r.output_text == chat["choices"][0]["message"]["content"]
    assert r.instructions == "Answer in one short sentence."
    # max_output_tokens reached: incomplete, and says why
    short = client.responses.create(model="smol", input="Tell me a long story.", temperature=0, max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 3


def test_items_input_as_the_chat_equivalent(client, http):
    """Easy messages, typed messages with input_text parts and a developer turn give the reply
    chat completions gives for the same conversation."""
    items = [{"role": "developer", "content": "You are terse."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a "},
                                                              {"type": "input_text", "text": "colour."}]}]
    r = client.responses.create(model="smol", input=items, **GREEDY)
    chat = http.post("/v1/chat/completions", json={
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
        "temperature": 0, "max_tokens": 16}).json()
    assert r.output_text == chat["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]


# response.created, response.in_progress, then per item: added, (content part added, deltas,
# text done, content part done) or (arguments delta, arguments done), item done; then the end.
MESSAGE_EVENTS = (r"response\.output_item\.added response\.content_part\.added (response\.output_text\.delta )*"
                  r"response\.output_text\.done response\.content_part\.done response\.output_item\.done ")
CALL_EVENTS = (r"response\.output_item\.added response\.function_call_arguments\.delta "
               r"response\.function_call_arguments\.done response\.output_item\.done ")


def test_stream_events_in_order(client):
    events = list(client.responses.create(model="smol", input="Say hello.", stream=True, **GREEDY))
    kinds = " ".join(e.type for e in events) + " "
    assert re.fullmatch(r"response\.created response\.in_progress " + MESSAGE_EVENTS +
                        r"response\.(completed|incomplete) ", kinds), kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == final.output_text == events[-4].text
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {final.output[0].id}
    whole = client.responses.create(model="smol", input="Say hello.", **GREEDY)
    assert whole.output_text == text and whole.usage.output_tokens == final.usage.output_tokens
    # the SDK's stream helper: text deltas, then the final response
    with client.responses.stream(model="smol", input="Say hello.", temperature=0, max_output_tokens=64) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        done = s.get_final_response()
    assert done.status == "completed" and "".join(deltas) == done.output_text


def cancelled(srv):
    """The log lines of /v1/responses requests whose generation was cancelled."""
    return [line for line in srv.logtext().splitlines() if "POST /v1/responses" in line and "finish=cancelled" in line]


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_closes_the_generation(srv, stream):
    """Streamed, once the first delta has come; whole, once the request is in flight."""
    before = len(cancelled(srv))
    data = json.dumps({"model": "smol", "input": "Count from 1 to 300, one number a line.", "stream": stream,
                       "temperature": 0, "max_output_tokens": 300}).encode()
    if srv.url == "http://edged":
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(srv.socket)
    else:
        sock = socket.create_connection(("127.0.0.1", int(srv.url.rsplit(":", 1)[1])))
    with sock:
        sock.sendall(f"POST /v1/responses HTTP/1.1\r\nHost: edged\r\nAuthorization: Bearer {srv.key}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        if stream:
            got = b""
            while b"response.output_text.delta" not in got:
                got += sock.recv(65536)
        else:
            while srv.request("GET", "/health")[2]["in_flight"] == 0:
                time.sleep(0.01)
    deadline, lines = time.monotonic() + 60, []
    while len(lines) <= before and time.monotonic() < deadline:
        lines = cancelled(srv)
        time.sleep(0.1)
    assert len(lines) > before, srv.logtext()[-2000:]
    assert int(lines[-1].split("completion_tokens=")[1].split()[0]) < 300
    assert srv.request("GET", "/health")[2]["in_flight"] == 0


def test_parse_with_a_pydantic_model(client):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    r = client.responses.parse(model="smol", input="Describe Paris as JSON.", text_format=City,
                               temperature=0, max_output_tokens=60)
    assert r.status == "completed" and isinstance(r.output_parsed, City), r.output_text
    assert r.text.format.type == "json_schema"
    with client.responses.stream(model="smol", input="Describe Paris as JSON.", text_format=City,
                                 temperature=0, max_output_tokens=60) as st:
        assert st.get_final_response().output_parsed == r.output_parsed
    # sampled, not only greedy: each reply is a City (its two strings of up to 30 characters and
    # the JSON around them fit in 100 tokens, whatever is sampled)
    for seed in range(3):
        s = client.responses.parse(model="smol", input="Describe a city you like as JSON.", text_format=City,
                                   temperature=1, extra_body={"seed": seed}, max_output_tokens=100)
        assert s.status == "completed" and isinstance(s.output_parsed, City), s.output_text
    o = client.responses.create(model="smol", input="Describe Paris as JSON.", temperature=0,
                                max_output_tokens=80, text={"format": {"type": "json_object"}})
    assert o.status == "completed" and isinstance(json.loads(o.output_text), dict), o.output_text


# no additionalProperties: closed, as llama.cpp's converter reads it; the integer is bounded
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}, "population": {"type": "integer"}},
        "required": ["city", "population"]}


def test_text_format_json_schema_whole_and_streamed(client):
    ask = dict(model="smol", input="Paris as JSON, with its population.", temperature=0, max_output_tokens=80,
               text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    r = client.responses.create(**ask)
    assert r.status == "completed" and r.text.format.name == "city" and r.text.format.schema_ == CITY
    value = json.loads(r.output_text)
    assert set(value) == {"city", "population"}, value
    assert isinstance(value["city"], str) and type(value["population"]) is int
    events = list(client.responses.create(**ask, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].type == "response.completed"


def test_function_tool_round_trip(client, http):
    r = client.responses.create(model="smol", input=ASK, tools=[WEATHER], tool_choice=FORCE,
                                temperature=0, max_output_tokens=40)
    [call] = r.output
    assert r.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.call_id and set(json.loads(call.arguments)) == {"city"}
    # the call sent back as the SDK returned it, and its output: the model answers in text
    items = ASK + [call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    after = client.responses.create(model="smol", input=items, tools=[WEATHER], tool_choice="none", **GREEDY)
    assert after.output[0].type == "message" and after.output_text
    # ... as chat completions answers the same turns
    calls = [{"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]
    chat = http.post("/v1/chat/completions", json={"messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"}],
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        "tool_choice": "none", "temperature": 0, "max_tokens": 16}).json()
    assert after.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert after.output_text == chat["choices"][0]["message"]["content"]
    # streamed: the call as one item with its arguments
    events = list(client.responses.create(model="smol", input=ASK, tools=[WEATHER], tool_choice=FORCE,
                                          temperature=0, max_output_tokens=40, stream=True))
    kinds = " ".join(e.type for e in events) + " "
    assert re.fullmatch(r"response\.created response\.in_progress " + CALL_EVENTS + r"response\.completed ", kinds)
    assert events[-1].response.output[0].arguments == call.arguments == events[3].delta == events[4].arguments
    # allowed_tools narrows what is offered (to a tool the question does not call for);
    # "required" with one call at most
    clock = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    only = client.responses.create(model="smol", input=ASK, tools=[WEATHER, clock], parallel_tool_calls=False,
                                   tool_choice={"type": "allowed_tools", "mode": "required",
                                                "tools": [{"type": "function", "name": "get_time"}]},
                                   temperature=0, max_output_tokens=40)
    assert [(o.type, o.name) for o in only.output] == [("function_call", "get_time")]
    assert only.tool_choice.type == "allowed_tools"


def test_previous_response_id_store_false_retrieve_delete(client):
    first = client.responses.create(model="smol", input="My name is Ada.", **GREEDY)
    second = client.responses.create(model="smol", input="What is my name?", previous_response_id=first.id,
                                     **GREEDY)
    # the second prompt holds the first turn and its reply
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id),
                 lambda: client.responses.create(model="smol", input="Hi", previous_response_id=first.id)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert first.id in str(e.value)
    off = client.responses.create(model="smol", input="Hi", store=False, **GREEDY)
    assert off.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(off.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_unknown")


def test_input_items_listed_paged_and_owned(client):
    """GET /v1/responses/{id}/input_items through the SDK: the request's input items with ids,
    newest first by default, `order`, `limit` and `after` paging; 404 once deleted."""
    items = [{"role": "developer", "content": "Answer briefly."},
             {"type": "message", "role": "user", "id": "msg_mine", "content": [{"type": "input_text", "text": "Hi"}]},
             {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}]
    r = client.responses.create(model="smol", input=items, **GREEDY)
    page = client.responses.input_items.list(r.id)
    assert [x.role for x in page.data] == ["user", "assistant", "user", "developer"]
    assert page.data[2].id == "msg_mine" and page.data[0].content[0].text == "Name a colour."
    assert page.data[1].content[0].type == "output_text" and page.has_more is False
    asc = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [x.id for x in asc.data] == [page.data[3].id, "msg_mine"] and asc.has_more is True
    rest = client.responses.input_items.list(r.id, order="asc", after="msg_mine")
    assert [x.id for x in rest.data] == [page.data[1].id, page.data[0].id]
    assert [x.id for x in client.responses.input_items.list(r.id, order="asc")] == [x.id for x in reversed(page.data)]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.input_items.list(r.id, limit=101)
    assert "limit" in str(e.value)
    one = client.responses.create(model="smol", input="Hi", **GREEDY)
    assert [x.content[0].text for x in client.responses.input_items.list(one.id).data] == ["Hi"]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(r.id)


def test_logprobs_whole_and_streamed(client):
    ask = dict(model="smol", input="Say hello.", temperature=0, max_output_tokens=6,
               include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**ask)
    lps = r.output[0].content[0].logprobs
    assert r.status == "incomplete" and len(lps) == r.usage.output_tokens == 6
    assert "".join(x.token for x in lps) == r.output_text
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob >= x.logprob - 1e-6 for x in lps)
    events = list(client.responses.create(**ask, stream=True))
    streamed = [x for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    assert [(x.token, round(x.logprob, 4)) for x in streamed] == [(x.token, round(x.logprob, 4)) for x in lps]
    assert len(events[-1].response.output[0].content[0].logprobs) == 6
    assert client.responses.create(**{**ask, "include": [], "top_logprobs": None}).output[0].content[0].logprobs == []


@pytest.mark.parametrize("body, param, needle", [
    ({"input": "x", "conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"input": "x", "background": True}, "background", "stream"),
    ({"input": "x", "truncation": "auto"}, "truncation", "disabled"),
    ({"input": "x", "context_management": [{"type": "compaction"}]}, "context_management", "shorten"),
    ({"input": "x", "moderation": {"model": "omni-moderation-latest"}}, "moderation", "yourself"),
    ({"input": "x", "tools": [{**WEATHER, "allowed_callers": ["robots"]}]}, "tools[0].allowed_callers[0]", "programmatic"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include", "no built-in tools"),
    ({"input": "x", "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"input": "x", "frobnicate": 1}, "frobnicate", "unsupported field"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].image_url", "does not fetch relative URLs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url", "file ids are not kept"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role", "must be"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "required"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema", "required"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "bogus"}}}},
     "text.format.schema", "bogus"),
    ({"input": "x", "tools": [{**WEATHER, "parameters": {"type": "bogus"}}], "tool_choice": "required"}, "tools",
     "bogus"),
    ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort", "'high'"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice",
     "not in 'tools'"),
    ({"input": "x", "temperature": 3}, "temperature", "between"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "positive"),
    ({"input": []}, "input", "non-empty"),
    ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata", "512"),
])
def test_refusals_name_the_field(http, body, param, needle):
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_fields_with_no_meaning_here_are_accepted(http):
    r = http.post("/v1/responses", json={
        "input": "Hi", **GREEDY, "metadata": {"k": "v"}, "user": "u", "parallel_tool_calls": True,
        "truncation": "disabled", "service_tier": "auto", "store": True, "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto", "context": "auto", "mode": "standard"}, "text": {"verbosity": "low"},
        "prompt_cache_key": "p", "access_programs": {"cyber": "standard"}, "image": {"context_compression": "auto"},
        "background_options": {"completion_window": "soonest"}, "context_management": [], "moderation": None})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"k": "v"}
    # what newer SDKs put in items and tools, sent back as they return them
    tool = {**WEATHER, "defer_loading": False, "allowed_callers": ["direct"], "async": False,
            "output_schema": {"type": "string"}}
    items = ASK + [{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}',
                    "caller": {"type": "direct"}, "async": False, "namespace": "x", "status": "completed"},
                   {"type": "function_call_output", "call_id": "call_1", "output": "sunny", "caller": None,
                    "namespace": None},
                   {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?",
                                                 "prompt_cache_breakpoint": {"mode": "explicit"}}]}]
    r = http.post("/v1/responses", json={"input": items, "tools": [tool], "tool_choice": "none", **GREEDY})
    assert r.status_code == 200, r.text
    assert r.json()["tools"][0]["async"] is False
    assert http.get("/v1/responses").status_code == 405
    assert http.post("/v1/responses/x").status_code == 404


def test_docs_table_names_every_field():
    """docs/api.md's Responses table names every field a body may have, and every field of the
    installed openai SDK's responses.create is one of them (honoured, ignored or refused)."""
    import typing
    from conftest import ROOT
    from edged.service import responses_schema
    from openai.types.responses.response_create_params import ResponseCreateParamsBase
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        doc = f.read()
    section = doc[doc.index("## Responses API"):]
    section = section[:section.index("\n## ")]
    named = set(re.findall(r"`([a-z_]+)[`:.]", section))
    fields = responses_schema.FIELDS | set(responses_schema.REFUSED)
    assert not fields - named, sorted(fields - named)
    sdk = set(typing.get_type_hints(ResponseCreateParamsBase))
    assert not sdk - fields, f"classify in responses_schema and docs/api.md: {sorted(sdk - fields)}"


# --- agent frameworks and litellm ------------------------------------------------------------

def test_openai_agents_default_model_runs_a_tool(srv):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    # the provider an agent gets by default, given the daemon's client (no global state)
    provider = agents.OpenAIProvider(openai_client=async_client(srv))
    assert isinstance(provider.get_model("smol"), agents.OpenAIResponsesModel)
    asked = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    # the first turn is forced to call the tool (the SDK then resets tool_choice): the second
    # gets the call and its output back as items and answers in text
    agent = agents.Agent(name="weather", instructions="Answer briefly.", model="smol", tools=[get_weather],
                         model_settings=agents.ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=60))
    r = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3,
                                      run_config=agents.RunConfig(model_provider=provider)))
    assert len(asked) == 1 and isinstance(r.final_output, str) and r.final_output
    assert len(r.raw_responses) == 2 and all(x.response_id.startswith("resp_") for x in r.raw_responses)
    kinds = [type(i).__name__ for i in r.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds

    async def streamed():           # the same run streamed: the model's events, then the same items
        fresh = agents.OpenAIProvider(openai_client=async_client(srv))      # a client of this loop
        run = agents.Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3,
                                         run_config=agents.RunConfig(model_provider=fresh))
        raw = [e.data.type async for e in run.stream_events() if e.type == "raw_response_event"]
        return run, raw

    run, raw = asyncio.run(streamed())
    assert len(asked) == 2 and run.final_output == r.final_output
    assert [type(i).__name__ for i in run.new_items] == kinds
    assert raw.count("response.completed") == 2 and "response.output_text.delta" in raw
    assert "response.function_call_arguments.delta" in raw


def test_pydantic_ai_responses_model(srv):
    pytest.importorskip("pydantic_ai")
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    model = OpenAIResponsesModel("smol", provider=OpenAIProvider(openai_client=async_client(srv)))
    settings = {"temperature": 0, "max_tokens": 60}
    text = Agent(model, instructions="Answer in one short sentence.").run_sync(
        "What is the capital of France?", model_settings=settings)
    assert isinstance(text.output, str) and text.output
    city = Agent(model, output_type=NativeOutput(City)).run_sync("Describe Paris.", model_settings=settings)
    assert isinstance(city.output, City)

    async def streamed():
        fresh = OpenAIResponsesModel("smol", provider=OpenAIProvider(openai_client=async_client(srv)))
        agent = Agent(fresh, instructions="Answer in one short sentence.")
        async with agent.run_stream("What is the capital of France?", model_settings=settings) as run:
            return [d async for d in run.stream_text(delta=True, debounce_by=None)]

    deltas = asyncio.run(streamed())
    assert len(deltas) > 1 and "".join(deltas) == text.output


def test_litellm_responses(srv):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")     # offline: its own copy
    litellm = pytest.importorskip("litellm")
    from litellm.llms.custom_httpx.http_handler import HTTPHandler
    handler = HTTPHandler(client=httpx.Client(transport=transport(srv), timeout=300))
    common = dict(model="openai/smol", api_base=srv.url + "/v1", api_key=srv.key, client=handler, **GREEDY)
    r = litellm.responses(input="What is the capital of France?", **common)
    assert r.status in ("completed", "incomplete") and r.output[0].content[0].text
    events = list(litellm.responses(input="What is the capital of France?", stream=True, **common))
    assert str(events[0].type).endswith(("RESPONSE_CREATED", "response.created"))
    assert "".join(getattr(e, "delta", "") or "" for e in events) == r.output[0].content[0].text


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-socket-activate") is None,
                    reason="needs root (api_keys_file owned by root) and systemd-socket-activate")
def test_over_tcp_a_stored_response_belongs_to_its_api_key(tmp_path_factory):
    """Two API keys on the TCP listener: what one stored, the other cannot see or continue."""
    from daemon_support import KEY, free_port, keys_file
    tmp, models, trusted = smol_models(tmp_path_factory, "api-responses-tcp")
    other = "responses-second-key-0123456789"
    port = free_port()
    srv, path = socket_activated(tmp, models, trusted, port, default_model="smol",
                                 extra={**SMOL_CONFIG, "api_keys_file": keys_file(tmp, f"{KEY}\n{other}\n")})
    try:                    # the first connection starts the daemon
        one, two = (openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=k, max_retries=0, timeout=120)
                    for k in (KEY, other))
        first = one.responses.create(model="smol", input="Hi", **GREEDY)
        assert one.responses.retrieve(first.id).id == first.id
        with pytest.raises(openai.NotFoundError):
            two.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            two.responses.create(model="smol", input="Go on.", previous_response_id=first.id, **GREEDY)
        with pytest.raises(openai.NotFoundError):       # nor does a Unix peer
            openai_client(path).responses.retrieve(first.id)
        assert one.responses.create(model="smol", input="Go on.", previous_response_id=first.id, **GREEDY).output_text
    finally:
        srv.stop()


# --- without a socket: reasoning items, the store's owners ----------------------------------

THINKING = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% else %}<think>{% endif %}{% endif %}")


@pytest.fixture
def tiny(tmp_path):
    """A daemon in this process serving stories260K with a template that opens <think>."""
    from daemon_support import add_chat_template, stories
    d = make_daemon(tmp_path, default_model="tiny", allow_uids=[1000, 1001], allow_gids=[])
    add_chat_template(stories(), str(tmp_path / "models" / "tiny.gguf"), THINKING)
    d.start_threads()
    yield d
    d.decoder.stop()


def semantic_events(text):
    """The events of a Responses stream: `event: TYPE` and `data: JSON` of the same type."""
    out = []
    for block in text.split("\n\n")[:-1]:
        head, data = block.split("\n")
        out.append(json.loads(data.removeprefix("data: ")))
        assert head == "event: " + out[-1]["type"], block
    return out


def handle(d, method, path, body=None, **kw):
    data = json.dumps(body).encode() if body is not None else b""
    return d.api.handle(ApiRequest(method, path, data, **kw))


def test_reasoning_items_whole_streamed_and_sent_back(tiny):
    body = {"input": "Once upon a time", "temperature": 0, "max_output_tokens": 8}

    async def main():
        r = (await handle(tiny, "POST", "/v1/responses", body)).body
        [item] = r["output"]            # all of it inside <think>: one reasoning item
        assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == r["usage"]["output_tokens"] == 8
        assert item["type"] == "reasoning" and item["id"].startswith("rs_") and item["summary"] == []
        thought = item["content"][0]["text"]
        assert item["content"][0]["type"] == "reasoning_text" and thought
        s = await handle(tiny, "POST", "/v1/responses", {**body, "stream": True})
        assert isinstance(s, StreamReply)
        events = semantic_events(b"".join([c async for c in s.chunks()]).decode())
        await s.close()
        kinds = [e["type"] for e in events]
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added"] and kinds[-1] == "response.incomplete"
        # (the whole reply's reasoning is stripped of the white space it starts with, as chat's)
        assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta").strip() == thought
        [streamed] = events[-1]["response"]["output"]
        assert streamed["type"] == "reasoning" and streamed["content"][0]["text"].strip() == thought
        # sent back, the reasoning becomes the assistant turn's reasoning_content (which this
        # template does not show: the prompt is the conversation's text alone)
        back = await handle(tiny, "POST", "/v1/responses", {
            **body, "input": [{"role": "user", "content": "Once upon a time"}, item,
                              {"role": "user", "content": "Go on."}]})
        assert back.status == 200, back.body
        # reasoning effort "none": the template is asked not to think, the reply is a message
        off = (await handle(tiny, "POST", "/v1/responses", {**body, "reasoning": {"effort": "none"}})).body
        assert [x["type"] for x in off["output"]] == ["message"] and off["output"][0]["content"][0]["text"]
        assert off["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
        chat = (await handle(tiny, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 0, "max_tokens": 5})).body
        assert chat["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}
        await tiny.registry.close_all()

    asyncio.run(main())


def test_reasoning_tokens_counted_as_generated():
    """A token is reasoning when it opens, continues or closes a think block (or is in a
    harmony analysis message), whatever pieces the tags arrive in."""
    from types import SimpleNamespace
    from edged.service.jobs import Choice
    tok = SimpleNamespace(eog_ids=())

    def count(pieces, **prep):
        base = dict(think=True, think_inside=False, think_tags=("<think>", "</think>"), harmony=False,
                    family=None, tools=())
        c = Choice(0, [], None, SimpleNamespace(**{**base, **prep}), tok)
        for i, text in enumerate(pieces):
            c.add(SimpleNamespace(text=text, token=i, records=(), stop=None))
        return c.n_reasoning

    assert count(["<think>", "a", " b", "</", "think>", "\n\n", "Hi", " there"]) == 5
    assert count(["Hi", " <think>", "x"]) == 0                       # no think block at the start
    assert count(["a", "</think>", "b"], think_inside=True) == 2      # the template opened it
    assert count(["a", "b"], think=False) == 0
    assert count(["<|channel|>analysis<|message|>", "mm", "<|end|>", "<|start|>assistant<|channel|>final<|message|>",
                  "Hi"], harmony=True) == 3


def test_a_stored_response_belongs_to_its_peer(tiny):
    ada, bob = Peer(1, 1000, 1000), Peer(2, 1001, 1001)
    body = {"input": "Once upon a time", "temperature": 0, "max_output_tokens": 2}

    async def main():
        r = await handle(tiny, "POST", "/v1/responses", body, peer=ada)
        rid = r.body["id"]
        assert (await handle(tiny, "GET", f"/v1/responses/{rid}", peer=ada)).status == 200
        for method, path, b in [("GET", f"/v1/responses/{rid}", None), ("DELETE", f"/v1/responses/{rid}", None),
                                ("POST", "/v1/responses", {**body, "previous_response_id": rid})]:
            other = await handle(tiny, method, path, b, peer=bob)
            assert other.status == 404 and rid in other.body["error"]["message"], other.body
        # over TCP, the API key is the owner
        k = await handle(tiny, "POST", "/v1/responses", body, tcp=True, api_key="key-a")
        kid = k.body["id"]
        assert (await handle(tiny, "GET", f"/v1/responses/{kid}", tcp=True, api_key="key-b")).status == 404
        assert (await handle(tiny, "GET", f"/v1/responses/{kid}", peer=ada)).status == 404
        assert (await handle(tiny, "DELETE", f"/v1/responses/{kid}", tcp=True, api_key="key-a")).status == 200
        assert (await handle(tiny, "GET", f"/v1/responses/{rid}", peer=ada)).status == 200
        await tiny.registry.close_all()

    asyncio.run(main())


def test_api_key_ids():
    """The id of the key that admitted a request, whichever header carried it; None for none."""
    from edged.service.apikeys import key_id
    keys = (b"edged-test-key-0123456789abcdef", b"edged-test-key-0123456789abcdeF")
    a = key_id("Bearer edged-test-key-0123456789abcdef", keys)
    assert a == key_id("bearer  edged-test-key-0123456789abcdef", keys) and len(a) == 32
    assert a == key_id("Bearer not-a-key", keys, "edged-test-key-0123456789abcdef")
    assert a != key_id("Bearer edged-test-key-0123456789abcdeF", keys)
    assert key_id("Bearer not-a-key", keys) is None and key_id(None, keys) is None


def test_the_store_is_bounded(tmp_path):
    """responses_store_max entries at most (the oldest go first); responses_store_max_age."""
    from edged.service import config
    from edged.service.responses import Entry, Store
    cfg = config.load(None, {"responses_store_max": 2, "responses_store_max_age": 3600.0})
    s, who, t = Store(), ("uid", 0), time.monotonic() - 100
    for i in range(3):
        s.put(cfg, f"r{i}", Entry(who, t + i, (), {}))
    assert list(s.entries) == ["r1", "r2"] and s.get(cfg, "r0", who) is None
    assert s.get(cfg, "r2", ("uid", 1)) is None and s.get(cfg, "r2", who) is not None
    younger = config.load(None, {"responses_store_max": 2, "responses_store_max_age": 50.0})
    assert s.get(younger, "r2", who) is None and list(s.entries) == []
    none = config.load(None, {"responses_store_max": 0})
    s.put(none, "r", Entry(who, time.monotonic(), (), {}))
    assert not s.entries
