"""The clients programs on a device use, against a real daemon serving the real, signed
SmolLM2-135M-Instruct (ChatML template, no tool support in its template: the generic tool
format): the openai SDK (structured output through `.parse` with a pydantic model, a forced
tool call, logprobs, n=2, models.retrieve), LangChain's ChatOpenAI.with_structured_output
(json_schema and function_calling), plus curl-level checks of the request surface.

A 135M model cannot pick tools sensibly, so calls are forced with tool_choice; what these
tests check is that the output is well-formed and parsed, whatever the model would prefer."""
import json
import shutil

import pytest

from conftest import testdata
from daemon_support import Server, signing_key, sse_events

pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-clients")
    models = tmp / "models"
    models.mkdir()
    dst = models / "smol.gguf"
    shutil.copyfile(testdata("models", SMOL), dst)
    sign_file(str(dst), key)
    s = Server(tmp, str(models), trusted, default_model="smol",
               extra={"n_parallel": 2, "ctx_size": 1024, "max_queue": 16, "threads": 2})
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket), base_url="http://edged",
                      timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def client(srv):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url="http://edged/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket), timeout=300))


def chat(http, **body):
    r = http.post("/v1/chat/completions", json={"messages": ASK, "temperature": 0, **body})
    return r.status_code, r.json()


# --- structured output ---------------------------------------------------------------------

def test_openai_parse_with_a_pydantic_model(client):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)
        population_millions: int = Field(ge=0, le=100)

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model="smol", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
              response_format=City, temperature=0, max_tokens=120)
    city = r.choices[0].message.parsed
    assert isinstance(city, City), r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("fmt", [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
        "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "integer"}},
        "required": ["answer", "confidence"], "additionalProperties": False}}}},
    {"json_schema": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                     "minItems": 2, "maxItems": 4}},
])
def test_response_format_on_chat_and_completions(http, fmt):
    code, r = chat(http, max_tokens=80, **fmt)
    assert code == 200, r
    v = json.loads(r["choices"][0]["message"]["content"])
    rc = http.post("/v1/completions", json={"prompt": "JSON: ", "max_tokens": 80, "temperature": 0.8,
                                           "seed": 3, **fmt}).json()
    w = json.loads(rc["choices"][0]["text"])
    for x in (v, w):
        if "json_schema" in fmt:
            assert isinstance(x, list) and 2 <= len(x) <= 4 and all(isinstance(i, int) for i in x)
        elif fmt["response_format"]["type"] == "json_schema":
            assert x["answer"] in ("yes", "no") and isinstance(x["confidence"], int)
        else:
            assert isinstance(x, dict)


def test_gbnf_grammar_and_streaming(http):
    gbnf = 'root ::= ("yes" | "no") ", because " [a-z ]{1,40} "."'
    code, r = chat(http, grammar=gbnf, max_tokens=40)
    assert code == 200, r
    text = r["choices"][0]["message"]["content"]
    import re
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,40}\.", text), text
    body = {"messages": ASK, "temperature": 0, "grammar": gbnf, "max_tokens": 40, "stream": True}
    events = sse_events(http.post("/v1/chat/completions", json=body).text)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == text


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema"),
    ({"grammar": "root ::= undefined_rule"}, "grammar"),
    ({"json_schema": {"type": "string", "pattern": "(a"}}, "json_schema"),
])
def test_bad_schema_or_grammar_is_a_400_naming_it_and_the_daemon_serves_on(http, srv, body, param):
    code, r = chat(http, max_tokens=4, **body)
    assert code == 400, r
    assert r["error"]["message"].startswith(param + ":") and r["error"]["code"] is None
    srv.assert_serving()
    assert chat(http, max_tokens=2)[0] == 200


# --- tool calls ----------------------------------------------------------------------------

def test_openai_forced_tool_call(client):
    r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    # the call and its result go back through the model's template
    r2 = client.chat.completions.create(model="smol", tools=[WEATHER], temperature=0, max_tokens=10, messages=ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}])
    assert r2.choices[0].message.content is not None


def test_required_tool_call_streams_openai_shaped_deltas(http, client):
    body = {"messages": ASK, "tools": [WEATHER, {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}},
                                           "required": ["tz"]}}}],
            "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_tokens": 60}
    whole = http.post("/v1/chat/completions", json=body).json()
    calls = whole["choices"][0]["message"]["tool_calls"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and len(calls) == 1
    assert calls[0]["function"]["name"] in ("get_weather", "get_time")
    events = sse_events(http.post("/v1/chat/completions", json={**body, "stream": True}).text)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    got = [tc for d in deltas for tc in d.get("tool_calls") or ()]
    assert [(c["index"], c["type"], c["function"]) for c in got] == [(0, "function", calls[0]["function"])]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the openai SDK's streaming accumulates the same
    stream = client.chat.completions.create(model="smol", stream=True, **{k: v for k, v in body.items()})
    names = [tc.function.name for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert names == [calls[0]["function"]["name"]]


def test_tool_choice_none_answers_in_text(http):
    code, r = chat(http, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert code == 200 and "tool_calls" not in r["choices"][0]["message"]


# --- logprobs, n, models, prompt lists -----------------------------------------------------

def test_logprobs_chat_and_stream(client, http):
    r = client.chat.completions.create(model="smol", messages=ASK, temperature=0, max_tokens=8, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 3 and c.logprob <= 0
        lps = [t.logprob for t in c.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert c.top_logprobs[0].token == c.token and c.top_logprobs[0].logprob == c.logprob   # greedy
        assert bytes(c.bytes).decode("utf-8", "replace") == c.token
    body = {"messages": ASK, "temperature": 0, "max_tokens": 8, "logprobs": True, "top_logprobs": 3, "stream": True}
    events = sse_events(http.post("/v1/chat/completions", json=body).text)
    streamed = [c for e in events if e["choices"] and e["choices"][0]["logprobs"]
                for c in e["choices"][0]["logprobs"]["content"]]
    assert [(c["token"], c["logprob"]) for c in streamed] == [(c.token, c.logprob) for c in content]


def test_logprobs_completions(http):
    r = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                           "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == r["choices"][0]["text"] and len(lp["token_logprobs"]) == 6
    assert all(len(t) == 2 and max(t.values()) == v for t, v in zip(lp["top_logprobs"], lp["token_logprobs"]))
    assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])


def test_n_choices_share_the_prompt_and_each_has_its_seed_stream(client):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Write a word."}], temperature=1.0,
              max_tokens=12, seed=1234)
    r = client.chat.completions.create(n=2, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    # choice j draws with seed + j: the same as a single request with that seed, which also
    # proves the copied KV cache equals a fresh evaluation of the prompt
    one = [client.chat.completions.create(n=1, **dict(kw, seed=1234 + j)).choices[0].message.content
           for j in (0, 1)]
    assert [c.message.content for c in r.choices] == one
    assert r.usage.completion_tokens == sum(
        client.chat.completions.create(n=1, **dict(kw, seed=1234 + j)).usage.completion_tokens for j in (0, 1))


def test_n_choices_stream(http):
    body = {"messages": [{"role": "user", "content": "Write a word."}], "temperature": 1.0, "max_tokens": 8,
            "seed": 5, "n": 2, "stream": True}
    events = sse_events(http.post("/v1/chat/completions", json=body).text)
    text = {0: "", 1: ""}
    finishes = {}
    for e in events:
        for c in e["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                finishes[c["index"]] = c["finish_reason"]
    whole = http.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert text == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    assert set(finishes) == {0, 1}


def test_models_retrieve(client):
    import openai
    m = client.models.retrieve("smol")
    assert m.id == "smol" and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("ghost")


def test_list_of_prompts_on_completions(http):
    prompts = ["Once upon a time", "The capital of France is"]
    r = http.post("/v1/completions", json={"prompt": prompts, "max_tokens": 5, "temperature": 0}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    for p, c in zip(prompts, r["choices"]):
        single = http.post("/v1/completions", json={"prompt": p, "max_tokens": 5, "temperature": 0}).json()
        assert c["text"] == single["choices"][0]["text"]


def test_chat_matches_llama_cpp_reply(http):
    ref = json.load(open(testdata("models", SMOL.replace(".gguf", ".reference.json"))))
    code, r = chat(http, messages=[{"role": "user", "content": ref["chat_question"]}], max_tokens=30)
    assert code == 200 and "Paris" in r["choices"][0]["message"]["content"]


# --- LangChain -----------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(srv, method):
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Capital(BaseModel):
        """The capital city of a country."""
        country: str = Field(max_length=30)
        city: str = Field(max_length=30)

    llm = lc.ChatOpenAI(model="smol", base_url="http://edged/v1", api_key="unused", temperature=0, max_tokens=80,
                        max_retries=0, http_client=httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket),
                                                                timeout=300))
    out = llm.with_structured_output(Capital, method=method).invoke("What is the capital of France?")
    assert isinstance(out, Capital)
