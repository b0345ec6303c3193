"""Gemma 4 tool calls end to end: a real daemon serves the real SmolLM2-135M with the Gemma 4
chat template the converter stored in llama.cpp's gemma-4 vocabulary file as the operator's
template file (MODELS_DIR/smol.jinja; the compiled backend does not run gemma4 files yet), so
the daemon finds the gemma4 family from the template, the forced call is written as
`<|tool_call>call:NAME{...}<tool_call|>` under its grammar and comes back as OpenAI
tool_calls, streamed and not; a conversation with an earlier call and its result renders
through the older template (tool results folded into the model's turn) and is answered."""
import os

import pytest

from conftest import ROOT, testdata
from daemon_support import Server, forced_call, smol_models, uds_httpx
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
    tmp, models, trusted = smol_models(tmp_path_factory, "api-gemma4")
    path = os.path.join(models, "smol.jinja")
    with GGUFFile.open(VOCAB) as f, open(path, "w", encoding="utf-8") as fh:
        fh.write(f.metadata[Key.CHAT_TEMPLATE])
    s = Server(tmp, models, trusted, default_model="smol",
               extra={"n_parallel": 1, "ctx_size": 2048, "threads": 2})
    s.template_path = path
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def http(srv):
    with uds_httpx(srv.socket) as c:
        yield c


def test_forced_call_is_parsed_and_streamed(srv, http):
    body = {"messages": ASK, "tools": [TOOL], "temperature": 0, "max_tokens": 60,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    call, args = forced_call(srv.socket, http, body, "smol", "<|tool_call>")
    assert call["function"]["name"] == "get_weather" and isinstance(args, dict)
    r = http.post("/v1/chat/completions", json={**body, "logprobs": True})
    written = "".join(t["token"] for t in r.json()["choices"][0]["logprobs"]["content"])
    assert written.startswith("<|tool_call>call:get_weather{") and written.endswith("}<tool_call|>")


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

