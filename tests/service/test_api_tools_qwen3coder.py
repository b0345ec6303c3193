"""Qwen3-Coder XML tool calls end to end: a real daemon serves the real SmolLM2-135M with the
Qwen3-Coder chat template as the operator's template file (MODELS_DIR/NAME.jinja), so the
daemon finds the qwen3coder family from the template, the forced call is written in the XML
format under its grammar, and the reply is parsed into OpenAI tool_calls with values typed by
the schema, streamed and not; the openai SDK reads both."""
import shutil

import pytest

from conftest import testdata
from daemon_support import Server, forced_call, signing_key, uds_httpx

pytest.importorskip("llguidance")
pytest.importorskip("httpx")

TOOL = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm",
    "parameters": {"type": "object", "properties": {
        "label": {"type": "string", "maxLength": 20}, "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "repeat": {"type": "boolean"}}, "required": ["label", "hour", "repeat"]}}}
ASK = [{"role": "user", "content": "Wake me at 7 every day."}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-qwen3coder")
    models = tmp / "models"
    models.mkdir()
    shutil.copyfile(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"), models / "coder.gguf")
    sign_file(str(models / "coder.gguf"), key)
    shutil.copyfile(testdata("templates", "Qwen3-Coder.jinja"), models / "coder.jinja")
    s = Server(tmp, str(models), trusted, default_model="coder",
               extra={"n_parallel": 1, "ctx_size": 2048, "threads": 2})
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def http(srv):
    with uds_httpx(srv.socket) as c:
        yield c


def test_forced_xml_call_is_parsed_typed_and_streamed(srv, http):
    body = {"messages": ASK, "tools": [TOOL], "temperature": 0, "max_tokens": 120,
            "tool_choice": {"type": "function", "function": {"name": "set_alarm"}}}
    call, args = forced_call(srv.socket, http, body, "coder", "<function=")
    assert call["function"]["name"] == "set_alarm"
    assert isinstance(args["label"], str) and isinstance(args["repeat"], bool)
    assert isinstance(args["hour"], int) and 0 <= args["hour"] <= 23      # typed, not "7"
