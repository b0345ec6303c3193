"""Tool calls per model family (text/tools.py): the family found from real chat templates, the
prompt those templates render for a conversation with tools, earlier calls and a tool result,
the calls parsed out of recorded replies (several calls, text before a call), streaming, and
the grammars that force a well-formed call, run against a real 49k vocabulary."""
import json

import pytest

from conftest import testdata
from grammar_support import TOOLS, smol_tokenizer  # noqa: F401  (smol_tokenizer: a fixture)
from grammar_support import feed as run
from edged.text import tools
from edged.text.chat import render

CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "18 C"}]


def template(name):
    return open(testdata("templates", name + ".jinja"), encoding="utf-8").read()


def rendered(name):
    return render(template(name), tools.messages_for_template(CONVERSATION), tools=TOOLS[:1],
                  bos_token="<s>", eos_token="</s>", date_string="26 Jul 2024")


@pytest.mark.parametrize("name, family", [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"), ("Qwen-Qwen3-0.6B", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"), ("ibm-granite-granite-4.0", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"), ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"), ("Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
    ("unsloth-mistral-Devstral-Small-2507", "mistral"),
    ("ibm-granite-granite-3.3-2B-Instruct", "phi4"),
    ("microsoft-Phi-3.5-mini-instruct", "generic"), ("google-gemma-2-2b-it", "generic"),
])
def test_family_from_the_template(name, family):
    assert tools.family_of(template(name)) == family


def test_mistral_call_format_from_the_template():
    assert not tools.mistral_args_style(template("mistralai-Mistral-Nemo-Instruct-2407"))
    assert tools.mistral_args_style(template("Mistral-Small-3.2-24B-Instruct-2506"))


QWEN25 = (
    '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n'
    'You may call one or more functions to assist with the user query.\n\nYou are provided with function '
    'signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": '
    '"get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\nFor each function call, return a '
    'json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n'
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n'
    'Weather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response>'
    '<|im_end|>\n<|im_start|>assistant\n')

LLAMA31 = (
    '<s><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December '
    '2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the '
    'following functions, please respond with a JSON for a function call with its proper arguments that best '
    'answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of '
    'argument name and its value}.Do not use variables.\n\n{\n    "type": "function",\n    "function": {\n'
    '        "name": "get_weather",\n        "description": "Weather in a city",\n        "parameters": {\n'
    '            "type": "object",\n            "properties": {\n                "city": {\n'
    '                    "type": "string"\n                }\n            },\n            "required": [\n'
    '                "city"\n            ]\n        }\n    }\n}\n\nWeather in Paris?<|eot_id|>'
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}'
    '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"18 C"<|eot_id|><|start_header_id|>assistant'
    '<|end_header_id|>\n\n')

NEMO = (
    '<s>[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather", "description": "Weather in '
    'a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": '
    '["city"]}}}][/AVAILABLE_TOOLS][INST]Weather in Paris?[/INST][TOOL_CALLS][{"name": "get_weather", '
    '"arguments": {"city": "Paris"}, "id": "call00001"}]</s>[TOOL_RESULTS]{"content": 18 C, "call_id": '
    '"call00001"}[/TOOL_RESULTS]')


@pytest.mark.parametrize("name, want", [("Qwen-Qwen2.5-7B-Instruct", QWEN25),
                                        ("meta-llama-Llama-3.1-8B-Instruct", LLAMA31),
                                        ("mistralai-Mistral-Nemo-Instruct-2407", NEMO)])
def test_rendered_prompt_with_tools_calls_and_results(name, want):
    """The OpenAI conversation (arguments as a JSON string) goes through the model's own template."""
    assert rendered(name) == want


def test_rendered_prompt_hermes_and_mistral_small():
    hermes = rendered("NousResearch-Hermes-3-Llama-3.1-8B-tool_use")
    assert '<tools> {"type": "function", "function": {"name": "get_weather"' in hermes
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response>\n18 C\n</tool_response><|im_end|>'
            '<|im_start|>assistant\n') in hermes
    small = rendered("Mistral-Small-3.2-24B-Instruct-2506")
    assert small.endswith('[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather", '
                          '"description": "Weather in a city", "parameters": {"type": "object", "properties": '
                          '{"city": {"type": "string"}}, "required": ["city"]}}}][/AVAILABLE_TOOLS][INST]'
                          'Weather in Paris?[/INST][TOOL_CALLS]get_weather[CALL_ID]call00001[ARGS]{"city": '
                          '"Paris"}</s>[TOOL_RESULTS]call00001[TOOL_CONTENT]18 C[/TOOL_RESULTS]')


def calls_of(family, text):
    content, calls = tools.parse(family, text)
    for c in calls:
        assert c["type"] == "function" and c["id"]
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


# Replies as each family writes them (formats from the models' own templates and documentation).
RECORDED = [
    ("hermes", 'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     "Let me check both.", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [("get_weather", {"city": "Paris"})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", {"city": "Paris"})]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_time", "parameters": {"tz": "CET"}}',
     "", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("llama3", 'Sure. {"type": "function", "name": "get_time", "parameters": {"tz": "CET"}}',
     "Sure.", [("get_time", {"tz": "CET"})]),
    ("mistral", 'I will look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
                '{"name": "get_time", "arguments": {"tz": "CET"}, "id": "f5g6h7i8j"}]',
     "I will look.", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "CET"}',
     "", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("phi4", 'Checking.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
             '{"name": "get_time", "arguments": {"tz": "CET"}}]<|/tool_call|>',
     "Checking.", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("phi4", '<|tool_call|>[{"name": "get_time", "arguments": {"tz": "CET"}}]', "", [("get_time", {"tz": "CET"})]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"tz": "CET"}}]}',
     "", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("generic", ' {"response": "It is sunny."}', "It is sunny.", []),
    ("generic", "It is sunny.", "It is sunny.", []),
]


@pytest.mark.parametrize("family, text, content, calls", RECORDED)
def test_parse_recorded_replies(family, text, content, calls):
    assert calls_of(family, text) == (content, calls)


@pytest.mark.parametrize("family, text", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'),
    ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
    ("mistral", "[TOOL_CALLS]not json"),
    ("generic", '{"tool_calls": 5}'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Par'),
])
def test_malformed_calls_stay_content(family, text):
    assert tools.parse(family, text) == (text, [])


def test_mistral_ids_fit_its_templates():
    _, calls = tools.parse("mistral", '[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}')
    assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()


@pytest.mark.parametrize("family, text, content, calls", RECORDED)
def test_stream_splitter_holds_back_calls(family, text, content, calls):
    """Streamed one character at a time: the content comes out before the calls, never a piece
    of a call marker; the calls equal the complete reply's."""
    sp = tools.StreamSplitter(family)
    out = "".join(sp.push(ch) for ch in text)
    rest, got = sp.finish()
    assert (out + rest).rstrip() == content.rstrip() if calls else out + rest == text
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    for m in tools.markers(family):
        assert m not in out


def test_generic_system_prompt_lists_the_tools():
    note = tools.generic_system_prompt(TOOLS, required=True)
    assert '"name": "get_weather"' in note and '"name": "get_time"' in note and '{"tool_calls": [' in note


# --- grammars that force a call, on a real vocabulary --------------------------------------

@pytest.mark.parametrize("family, parallel, good, bad", [
    ("hermes", True, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                     '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_wether", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", False, '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'),
    ("llama3", False, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("mistral", True, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     '[TOOL_CALLS][]'),
    ("phi4", True, '<|tool_call|>[{"name": "get_time", "arguments": {"tz": "CET"}}]<|/tool_call|>',
     '<|tool_call|>[{"name": "get_time"}]'),
    ("generic", True, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                      '{"name": "get_time", "arguments": {"tz": "CET"}}]}',
     '{"tool_calls": [{"name": "get_weather", "arguments": {"city": 5}}]}'),
    ("generic", False, '{"tool_calls": [{"name": "get_time", "arguments": {"tz": "CET"}}]}',
     '{"tool_calls": [{"name": "get_time", "arguments": {"tz": "CET"}}, '
     '{"name": "get_time", "arguments": {"tz": "CET"}}]}'),
])
def test_call_grammar_accepts_calls_and_refuses_the_rest(smol_tokenizer, family, parallel, good, bad):
    from edged.text import grammar
    g = grammar.from_lark(tools.call_grammar(family, TOOLS, parallel=parallel))
    grammar.check(g, smol_tokenizer)
    assert run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, good)
    assert not run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, bad)
    _, calls = tools.parse(family, good)
    assert calls and all(c["function"]["name"] in ("get_weather", "get_time") for c in calls)


def test_mistral_args_grammar(smol_tokenizer):
    from edged.text import grammar
    g = grammar.from_lark(tools.call_grammar("mistral", TOOLS, parallel=True, args_style=True))
    ok = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}'
    assert run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, ok)
    assert not run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, '[TOOL_CALLS]get_weather{"city": "P"}')
