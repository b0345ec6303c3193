"""tool_choice "auto" with a lazy grammar (as llama.cpp's): the reply is free text until the
model writes the token that opens a call, and from there on the call follows the grammar of
the offered tools (its arguments match their schema). A random-weight model does not call
tools on its own: logit_bias pushes it to the opening token at every step, which without the
grammar gives a run of opening tokens, never a call."""
import asyncio
import json

import pytest

from daemon_support import make_daemon, stories
from edged.service.wire import ApiRequest
from gguf_clone import clone

pytest.importorskip("llguidance")
gguf = pytest.importorskip("gguf")

HERMES = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
          "{% if tools %}Call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}"
          "{% if add_generation_prompt %}assistant:{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture
def daemon(tmp_path):
    """stories260K with <tool_call> and </tool_call> as user-defined tokens (as in Qwen's
    vocabulary) and a Hermes-style template, served in this process."""
    src = stories()
    r = gguf.GGUFReader(src)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()[:-2] + ["<tool_call>", "</tool_call>"]
    types = r.fields["tokenizer.ggml.token_type"].contents()[:-2] + [4, 4]
    d = make_daemon(tmp_path, default_model="tiny", max_body_bytes=1 << 16)
    A = gguf.GGUFValueType
    clone(src, tmp_path / "models" / "tiny.gguf", tokens=tokens, drop_meta=("tokenizer.ggml.token_type",),
          meta={"tokenizer.ggml.token_type": (types, A.ARRAY, A.INT32),
                "tokenizer.chat_template": (HERMES, A.STRING)})
    d.start_threads()
    yield d, len(tokens) - 2
    d.decoder.stop()


def chat(d, **body):
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            "temperature": 0, "max_tokens": 48, **body}

    async def go():
        try:
            return (await d.api.handle(ApiRequest("POST", "/v1/chat/completions", json.dumps(body).encode()))).body
        finally:
            await d.registry.close_all()
    return asyncio.run(go())


def test_a_call_follows_the_schema_once_opened(daemon):
    d, opener = daemon
    r = chat(d, logit_bias={str(opener): 100}, parallel_tool_calls=False)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls", r
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 12


def test_text_is_free_until_a_call_opens(daemon):
    d, _ = daemon
    r = chat(d, max_tokens=12)
    choice = r["choices"][0]
    assert choice["message"]["content"] and not choice["message"].get("tool_calls")
    assert choice["finish_reason"] in ("stop", "length")
