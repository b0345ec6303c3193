"""Gemma 4 tool calls end to end: a real daemon serves the real SmolLM2-135M with the Gemma 4
chat template the converter stored in llama.cpp's gemma-4 vocabulary file as the operator's
template file (MODELS_DIR/NAME.jinja; the compiled backend does not run gemma4 files yet), so
the daemon finds the gemma4 family from the template, the forced call is written as
`<|tool_call>call:NAME{...}<tool_call|>` under its grammar and comes back as OpenAI
tool_calls, streamed and not; a conversation with an earlier call and its result renders
through the older template (tool results folded into the model's turn) and is answered."""
import json
import os
import shutil

import pytest

from conftest import ROOT, testdata
from daemon_support import Server, openai_client, signing_key, sse_events, uds_httpx
from edged.format.gguf import GGUFFile, Key

pytest.importorskip("llguidance")
pytest.importorskip("httpx")

VOCAB = os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-gemma-4.gguf")
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-gemma4")
    models = tmp / "models"
    models.mkdir()
    shutil.copyfile(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"), models / "g4.gguf")
    sign_file(str(models / "g4.gguf"), key)
    with GGUFFile.open(VOCAB) as f:
        (models / "g4.jinja").write_text(f.metadata[Key.CHAT_TEMPLATE], encoding="utf-8")
    s = Server(tmp, str(models), trusted, default_model="g4",
               extra={"n_parallel": 1, "ctx_size": 2048, "threads": 2})
    s.template_path = str(models / "g4.jinja")
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def http(srv):
    with uds_httpx(srv.socket) as c:
        yield c


def test_forced_call_is_parsed_and_streamed(srv, http):
    body = {"messages": ASK, "tools": [TOOL], "temperature": 0, "max_tokens": 60,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    (call,) = ch["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert isinstance(args, dict)
    r = http.post("/v1/chat/completions", json={**body, "logprobs": True})
    written = "".join(t["token"] for t in r.json()["choices"][0]["logprobs"]["content"])
    assert written.startswith("<|tool_call>call:get_weather{") and written.endswith("}<tool_call|>")
    events = sse_events(http.post("/v1/chat/completions", json={**body, "stream": True}).text)
    got = [tc for e in events if e["choices"] for tc in e["choices"][0]["delta"].get("tool_calls") or ()]
    assert [c["function"] for c in got] == [call["function"]]
    assert "<|tool_call>" not in "".join(e["choices"][0]["delta"].get("content") or ""
                                         for e in events if e["choices"])
    r2 = openai_client(srv.socket).chat.completions.create(model="g4", **body)
    assert json.loads(r2.choices[0].message.tool_calls[0].function.arguments) == args


def test_conversation_with_a_tool_result_is_answered(srv, http):
    """The prompt is the older template's rendering of the folded conversation (the tool
    result inside the model's turn, `response:get_weather{temp:18}`), not of a `tool` turn."""
    from edged import Model
    from edged.text import gemma4, tools
    conv = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18}"}]
    r = http.post("/v1/chat/completions", json={"messages": conv, "tools": [TOOL], "temperature": 0,
                                                "max_tokens": 8})
    assert r.status_code == 200, r.text
    with GGUFFile.open(VOCAB) as f:
        source = f.metadata[Key.CHAT_TEMPLATE]
    msgs = gemma4.messages_for_template(tools.messages_for_template(conv), source)
    with Model.load(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf")) as m:
        prompt = m.chat_prompt(msgs, tools=[TOOL], template_file=srv.template_path)
        folded = len(m.encode_chat(msgs, tools=[TOOL], template_file=srv.template_path))
    assert "<|tool_response>response:get_weather{temp:18}<tool_response|>" in prompt
    assert r.json()["usage"]["prompt_tokens"] == folded

