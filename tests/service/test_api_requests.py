"""Requests as clients send them (docs/api.md, the field tables): every message field of the
openai SDK's model_dump(), legacy `functions`, `tool_choice` without tools, other servers' names
(vLLM, llama-server, Ollama's `options`), `min_tokens`, and the refusals that say what to use
instead. Parsing is checked without a socket; the shapes that come back, and what the model
does under them, against a real daemon serving SmolLM2-135M through the openai SDK."""
import json

import pytest

from conftest import testdata
from daemon_support import openai_client, smol_daemon, sse_events, uds_httpx
from edged.errors import RequestError
from edged.service import openai_schema
from edged.service.openai import parse

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                          "required": ["city"]}}


# --- parsing -------------------------------------------------------------------------------

def test_an_assistant_message_as_model_dump_gives_it_is_accepted():
    types = pytest.importorskip("openai.types.chat")
    m = types.ChatCompletionMessage(role="assistant", content="Hello!", refusal=None, annotations=[],
                                    audio=None, function_call=None, tool_calls=None)
    body = {"messages": [CHAT["messages"][0], m.model_dump(), {"role": "user", "content": "more"}]}
    assert set(m.model_dump()) >= {"annotations", "audio", "function_call", "refusal"}
    r = parse(body, chat=True)
    assert r.messages[1] == {"role": "assistant", "content": "Hello!"}


def test_text_and_refusal_parts_are_the_message_text():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "name": "bot", "content": [{"type": "refusal", "refusal": "no"}]}]}
    assert parse(body, chat=True).messages == ({"role": "user", "content": "ab"},
                                               {"role": "assistant", "content": "no", "name": "bot"})


def test_legacy_functions_are_tools_called_once():
    body = {**CHAT, "functions": [WEATHER], "function_call": {"name": "get_weather"}}
    r = parse(body, chat=True)
    assert r.tools.tools == ({"type": "function", "function": WEATHER},)
    assert (r.tools.choice, r.tools.parallel, r.tools.legacy) == ("get_weather", False, True)
    assert parse({**CHAT, "functions": [WEATHER]}, chat=True).tools.choice == "auto"
    assert parse({**CHAT, "functions": [WEATHER], "function_call": "none"}, chat=True).tools.choice == "none"
    # the legacy conversation: an assistant's function_call, the function's answer
    body = {"messages": [CHAT["messages"][0],
                         {"role": "assistant", "content": None, "function_call": {"name": "get_weather",
                                                                                   "arguments": '{"city": "Paris"}'}},
                         {"role": "function", "name": "get_weather", "content": "sunny"}],
            "functions": [WEATHER]}
    r = parse(body, chat=True)
    assert r.messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "get_weather",
                                                                             "arguments": '{"city": "Paris"}'}}]
    assert r.messages[2] == {"role": "tool", "content": "sunny", "name": "get_weather"}
    with pytest.raises(RequestError, match="names function 'nope'") as e:
        parse({**CHAT, "functions": [WEATHER], "function_call": {"name": "nope"}}, chat=True)
    assert e.value.param == "function_call"


@pytest.mark.parametrize("choice", ["required", "auto", "none", {"type": "function", "function": {"name": "f"}}])
def test_tool_choice_without_tools_is_ignored_as_llama_server_does(choice):
    """LlamaIndex's structured_predict sends tool_choice "required" with no tools."""
    r = parse({**CHAT, "tool_choice": choice}, chat=True)
    assert (r.tools.tools, r.tools.choice) == ((), "none")


@pytest.mark.parametrize("chat", [True, False])
def test_other_servers_names_reach_the_typed_request(chat):
    base = CHAT if chat else {"prompt": "x"}
    r = parse({**base, "max_completion_tokens": 7, "repetition_penalty": 1.3, "repeat_last_n": 16,
               "min_tokens": 4, "keep_alive": "5m"}, chat=chat)
    assert (r.output.max_tokens, r.sampling.repeat_penalty, r.sampling.penalty_last_n,
            r.sampling.min_tokens) == (7, 1.3, 16, 4)
    assert parse({**base, "n_predict": 9}, chat=chat).output.max_tokens == 9
    assert parse({**base, "n_predict": -1}, chat=chat).output.max_tokens is None
    # the same value under both names is one value
    assert parse({**base, "max_tokens": 5, "max_completion_tokens": 5}, chat=chat).output.max_tokens == 5


def test_ollama_options_map_and_num_ctx_is_ignored():
    r = parse({**CHAT, "options": {"num_ctx": 8192, "num_predict": 12, "temperature": 0.2, "top_k": 7,
                                   "top_p": 0.8, "min_p": 0.1, "seed": 3, "stop": ["END"], "repeat_penalty": 1.2,
                                   "num_thread": 4}}, chat=True)
    s = r.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.repeat_penalty) == (0.2, 7, 0.8, 0.1, 3, 1.2)
    assert (r.output.max_tokens, r.output.stop, r.output.context) == (12, ("END",), None)
    r = parse({**CHAT, "options": {"seed": -1, "num_predict": -1}}, chat=True)     # Ollama's "none"
    assert (r.sampling.seed, r.output.max_tokens) == (None, None)
    with pytest.raises(RequestError, match="'options.stop' must be") as e:
        parse({**CHAT, "options": {"stop": ["a", "b", "c", "d", "e"]}}, chat=True)
    assert e.value.param == "options.stop"


@pytest.mark.parametrize("body, kind, source", [
    ({"guided_json": {"type": "object"}}, "json_schema", {"type": "object"}),
    ({"guided_json": '{"type": "array"}'}, "json_schema", {"type": "array"}),
    ({"guided_regex": "[0-9]{3}"}, "regex", "[0-9]{3}"),
    ({"guided_grammar": 'root ::= "yes"'}, "grammar", 'root ::= "yes"'),
    ({"guided_choice": ["yes", 'no "way"']}, "grammar", 'start: "yes" | "no \\"way\\""'),
])
def test_guided_fields_are_the_constraint_kinds(body, kind, source):
    c = parse({**CHAT, **body}, chat=True).constraint
    assert (c.kind, c.source, c.what) == (kind, source, next(iter(body)))


def test_guided_choice_and_regex_compile_to_what_they_say():
    pytest.importorskip("llguidance")
    from edged.text import grammar
    from edged.text.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"))

    def accepts(c, text):
        import numpy as np
        c = grammar.constraint(c.kind, c.source, c.what, tok)
        for t in tok.encode(text, add_special=False):
            if not np.unpackbits(c.mask().view(np.uint8), bitorder="little")[t]:
                return False
            c.consume(t)
        return c.is_accepting()

    choice = parse({**CHAT, "guided_choice": ["yes", 'no "way"']}, chat=True).constraint
    assert accepts(choice, "yes") and accepts(choice, 'no "way"') and not accepts(choice, "maybe")
    regex = parse({**CHAT, "guided_regex": r"\d{3}-[a-z]+"}, chat=True).constraint
    assert accepts(regex, "123-abc") and not accepts(regex, "12-abc")


@pytest.mark.parametrize("field", sorted(openai_schema.REFUSED) + sorted(openai_schema.COMPLETION_REFUSED))
def test_a_refused_field_names_itself_and_what_to_use_instead(field):
    chat = field in openai_schema.REFUSED
    base = CHAT if chat else {"prompt": "x"}
    with pytest.raises(RequestError) as e:
        parse({**base, field: {"x": 1} if field in ("audio", "web_search_options") else True}, chat=chat)
    instead = {**openai_schema.REFUSED, **openai_schema.COMPLETION_REFUSED}[field]
    assert e.value.param == field and str(e.value) == f"'{field}' is not supported: {instead}"
    parse({**base, field: None}, chat=chat)         # null is the default: accepted


# --- against a real daemon -----------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("llguidance")
    with smol_daemon(tmp_path_factory, "api-requests", n_parallel=2, ctx_size=1024, threads=2) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai_client(srv.socket)


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_sdk_model_dump_round_trip(client):
    r = client.chat.completions.create(model="smol", messages=ASK, max_tokens=8, temperature=0)
    messages = ASK + [r.choices[0].message.model_dump(), {"role": "user", "content": "And in Rome?"}]
    r2 = client.chat.completions.create(model="smol", messages=messages, max_tokens=8, temperature=0)
    assert r2.choices[0].message.content


def test_sdk_legacy_functions_are_answered_in_the_legacy_shape(client):
    r = client.chat.completions.create(model="smol", messages=ASK, functions=[WEATHER],
                                       function_call={"name": "get_weather"}, max_tokens=60, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "function_call" and c.message.tool_calls is None
    assert c.message.function_call.name == "get_weather"
    assert isinstance(json.loads(c.message.function_call.arguments)["city"], str)
    # streamed: the call arrives as a function_call delta
    chunks = list(client.chat.completions.create(model="smol", messages=ASK, functions=[WEATHER], stream=True,
                                                 function_call={"name": "get_weather"}, max_tokens=60,
                                                 temperature=0))
    calls = [ch.choices[0].delta.function_call for ch in chunks if ch.choices and ch.choices[0].delta.function_call]
    assert [f.name for f in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == json.loads(c.message.function_call.arguments)
    assert chunks[-1].choices[0].finish_reason == "function_call"


def test_sdk_tool_choice_required_without_tools_answers_text(client):
    r = client.chat.completions.create(model="smol", messages=ASK, tool_choice="required", max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None


def test_sdk_min_tokens_holds_back_the_end_token(client):
    """With the end tokens biased to +100 the reply ends at once; min_tokens=5 draws five other
    tokens first (the sixth, the end token, counts too, as every generated token does)."""
    eos = {"0": 100, "2": 100}          # SmolLM2's <|endoftext|> and <|im_end|>
    r = client.chat.completions.create(model="smol", messages=ASK, logit_bias=eos, max_tokens=20, temperature=0)
    assert r.usage.completion_tokens == 1 and r.choices[0].message.content == ""
    r = client.chat.completions.create(model="smol", messages=ASK, logit_bias=eos, max_tokens=20, temperature=0,
                                       extra_body={"min_tokens": 5})
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content


def test_min_tokens_holds_back_stop_strings(client):
    prompt = "1, 2, 3, 4, 5, 6, 7, 8"
    free = client.completions.create(model="smol", prompt=prompt, stop=[","], max_tokens=16, temperature=0)
    held = client.completions.create(model="smol", prompt=prompt, stop=[","], max_tokens=16, temperature=0,
                                     extra_body={"min_tokens": 4})
    assert "," not in free.choices[0].text and free.usage.completion_tokens < 4, free
    assert "," in held.choices[0].text and held.usage.completion_tokens >= 4, held
    assert held.choices[0].finish_reason == "stop"


CITY = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"]}


@pytest.mark.parametrize("schema", [CITY, dict(CITY, additionalProperties=False)], ids=["open", "closed"])
def test_the_issue_city_schema_gives_json_within_max_tokens(client, schema):
    """Issue 43: without `additionalProperties` the object stayed open (extra keys until
    max_tokens), and the integer unbounded (seeds 1 and 4 wrote 50+ digits until max_tokens);
    read as llama.cpp reads the schema, every seed ends in JSON with exactly the two keys.
    llama.cpp's default sampler settings (tools/bench_json_schema.py has the same)."""
    for seed in range(6):
        r = client.chat.completions.create(
            model="smol", messages=[{"role": "system", "content": "You are a helpful assistant. Answer with "
                                                                  "JSON only."},
                                    {"role": "user", "content": "What is the capital of France and how many "
                                                                "people live there? Answer in JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema,
                                                                    "strict": True}},
            temperature=0.8, top_p=0.95, extra_body={"top_k": 40, "min_p": 0.05}, seed=seed, max_tokens=60)
        c = r.choices[0]
        assert c.finish_reason == "stop", (seed, c.message.content)
        v = json.loads(c.message.content)
        assert set(v) == {"city", "population"} and abs(v["population"]) <= 2 ** 53, (seed, v)


def test_guided_json_and_options_over_the_wire(srv):
    with uds_httpx(srv.socket) as h:
        r = h.post("/v1/chat/completions", json={
            "messages": ASK, "guided_json": CITY, "options": {"temperature": 0, "num_predict": 60, "num_ctx": 4096},
            "keep_alive": "10m", "stream": True})
        assert r.status_code == 200, r.text
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in sse_events(r.text) if e["choices"])
        assert set(json.loads(text)) == {"city", "population"}
        r = h.post("/v1/chat/completions", json={"messages": ASK, "echo": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
        assert "unsupported field(s): echo" in r.json()["error"]["message"]    # chat has no echo


def test_docs_field_tables_name_every_field():
    """docs/api.md's Chat Completions and Completions tables name every field a body may have
    (the Completions section refers to the chat table for the ignored and refused ones)."""
    import os
    import re
    from conftest import ROOT
    from edged.service import openai as wire
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        doc = f.read()
    for title, fields in (("### Chat Completions", openai_schema.CHAT_FIELDS | set(openai_schema.REFUSED)),
                          ("### Completions", (openai_schema.COMPLETION_FIELDS - openai_schema.IGNORED)
                           | set(openai_schema.COMPLETION_REFUSED))):
        section = doc[doc.index(title):]
        section = section[:section.index("\n## ")]
        named = set(re.findall(r"`([a-z_]+)`", section))
        assert not fields - named, (title, sorted(fields - named))
    assert set(wire.SYNONYMS) | {"options"} <= named
