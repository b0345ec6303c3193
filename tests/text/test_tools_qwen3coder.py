"""Qwen3-Coder / Qwen3.5 XML-style tool calls (text/tools.py, family "qwen3coder"): the family
from the real templates (../shared/testdata/templates), the prompt they render for earlier
calls, replies written the way these models write them parsed into OpenAI tool_calls with
values typed by the tools' JSON schemas, streaming, and the grammar that forces a call."""
import json

import pytest

from conftest import testdata
from grammar_support import smol_tokenizer  # noqa: F401  (a fixture)
from grammar_support import feed as run
from edged.text import tools
from edged.text.chat import render

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "metric": {"type": "boolean"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"},
            "mode": {"type": ["integer", "string"]},
            "options": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
            "backup": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
            "required": ["path", "content"]}}},
]


def template(name):
    return open(testdata("templates", name + ".jinja"), encoding="utf-8").read()


@pytest.mark.parametrize("name", ["Qwen3-Coder", "Qwen3.5-4B"])
def test_family_from_the_template(name):
    assert tools.family_of(template(name)) == "qwen3coder"


def test_qwen3_without_xml_stays_hermes():
    assert tools.family_of(template("Qwen-Qwen3-0.6B")) == "hermes"
    # llama.cpp excludes templates that write the tags without newlines between them
    t = template("Qwen3-Coder") + "{{ '<tool_call><function=' ~ tool_call.name ~ '>' }}"
    assert tools.family_of(t) == "hermes"


def test_rendered_prompt_writes_earlier_calls_as_xml():
    conv = [{"role": "user", "content": "Weather in Paris for 3 days?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    out = render(template("Qwen3-Coder"), tools.messages_for_template(conv), tools=TOOLS[:1],
                 add_generation_prompt=True, bos_token="", eos_token="")
    assert out.endswith(
        "<|im_start|>user\nWeather in Paris for 3 days?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n"
        "</tool_response>\n<|im_end|>\n<|im_start|>assistant\n")
    assert "<function>\n<name>get_weather</name>" in out      # the tool list, in its XML
    assert "<name>days</name>\n<type>integer</type>" in out


def args(call):
    return call["function"]["name"], json.loads(call["function"]["arguments"])


# Replies as Qwen3-Coder writes them (its template's instructions; llama.cpp's parser tests)
RECORDED = [
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>",
     "", [("get_weather", {"city": "Paris", "days": 3, "metric": True})]),
    # text before the call, two calls, a multi-line string, JSON object and array values,
    # a numeric string kept a string, an integer-or-string given an integer
    ("I'll write both files.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\n007.txt\n"
     "</parameter>\n<parameter=content>\ndef f():\n    return \"<b>\"\n\n</parameter>\n"
     "<parameter=mode>\n644\n</parameter>\n<parameter=options>\n{\"overwrite\": true}\n</parameter>\n"
     "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>",
     "I'll write both files.",
     [("write_file", {"path": "007.txt", "content": "def f():\n    return \"<b>\"\n", "mode": 644,
                      "options": {"overwrite": True}, "tags": ["a", "b"]}),
      ("get_weather", {"city": "42"})]),
    # Qwen3-Coder sometimes leaves out the opening <tool_call>; null for a nullable boolean;
    # a string where integer-or-string is allowed
    ("<function=write_file>\n<parameter=path>\na b.md\n</parameter>\n<parameter=content>\n"
     "# Title\n</parameter>\n<parameter=mode>\nrw\n</parameter>\n<parameter=backup>\nnull\n"
     "</parameter>\n</function>\n</tool_call>",
     "", [("write_file", {"path": "a b.md", "content": "# Title", "mode": "rw", "backup": None})]),
]


@pytest.mark.parametrize("text, content, calls", RECORDED)
def test_parse_recorded_replies(text, content, calls):
    got_content, got = tools.parse("qwen3coder", text, TOOLS)
    assert got_content == content
    assert [args(c) for c in got] == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)


@pytest.mark.parametrize("text", [
    "Sure, use <function=get_weather> like this",                      # not closed
    "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
])
def test_malformed_calls_stay_content(text):
    assert tools.parse("qwen3coder", text, TOOLS) == (text, [])


def test_plain_content_and_include_lines_are_not_calls():
    text = "In C++ write #include <functional> and call std::function<int()>."
    assert tools.parse("qwen3coder", text, TOOLS) == (text, [])


@pytest.mark.parametrize("text, content, calls", RECORDED)
def test_stream_splitter_holds_back_calls(text, content, calls):
    sp = tools.StreamSplitter("qwen3coder", TOOLS)
    out = "".join(sp.push(ch) for ch in text)
    rest, got = sp.finish()
    assert (out + rest).rstrip() == content
    assert [args(c) for c in got] == calls
    assert "<tool_call>" not in out and "<function=" not in out



@pytest.mark.parametrize("parallel, good, bad", [
    (True, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan José, CA\n</parameter>\n"
           "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=write_file>\n"
           "<parameter=path>\nx.py\n</parameter>\n<parameter=content>\nif a < b:\n    pass\n</parameter>\n"
           "<parameter=options>\n{\"x\": 1}\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>"),
    (False, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"),          # city is required
])
def test_call_grammar_accepts_calls_and_refuses_the_rest(smol_tokenizer, parallel, good, bad):
    from edged.text import grammar
    g = grammar.from_lark(tools.call_grammar("qwen3coder", TOOLS, parallel=parallel))
    grammar.check(g, smol_tokenizer)
    assert run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, good)
    assert not run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, bad)
    _, calls = tools.parse("qwen3coder", good, TOOLS)
    assert calls[0]["function"]["name"] == "get_weather"
    if parallel:
        assert args(calls[1])[1]["content"] == "if a < b:\n    pass"


def test_call_grammar_bounds_string_values_by_max_length(smol_tokenizer):
    from edged.text import grammar
    short = [{"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "maxLength": 5}},
        "required": ["text"]}}}]
    g = grammar.from_lark(tools.call_grammar("qwen3coder", short, parallel=False))
    call = "<tool_call>\n<function=note>\n<parameter=text>\n{}\n</parameter>\n</function>\n</tool_call>"
    assert run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, call.format("hi\nyo"))
    assert not run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, call.format("too long"))
