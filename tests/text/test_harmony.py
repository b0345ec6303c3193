"""gpt-oss's harmony format (text/harmony.py): replies written the way the harmony spec and
gpt-oss's own chat template write them, split into reasoning_content, content and OpenAI tool
calls, whole and streamed in pieces of every size; the real gpt-oss template rendering its
features (reasoning_effort, tools, an earlier call and its result); the grammar that forces a
harmony call."""
import json

import pytest

from conftest import testdata
from edged.text import harmony, tools
from edged.text.chat import render
from grammar_support import feed as run

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                       "required": ["tz"]}}}

# (reply as the model writes it after the prompt's `<|start|>assistant`, reasoning, content, calls)
REPLIES = [
    ("<|channel|>analysis<|message|>User asks 2+2. Simple: 4.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
     "User asks 2+2. Simple: 4.", "2 + 2 = 4.", []),
    # a call: recipient after the channel, content type through <|constrain|> (harmony spec)
    ("<|channel|>analysis<|message|>Need the weather tool.<|end|>"
     '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}',
     "Need the weather tool.", "", [("get_weather", '{"city":"Oslo"}')]),
    # the recipient in the role part, as the template renders earlier calls; no analysis
    (' to=functions.get_time<|channel|>commentary json<|message|>{"tz": "CET"}',
     "", "", [("get_time", '{"tz": "CET"}')]),
    # a preamble on the commentary channel is for the user; then the call
    ("<|channel|>commentary<|message|>Checking the weather now.<|end|>"
     '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
     "", "Checking the weather now.", [("get_weather", '{"city": "Paris"}')]),
    # two analysis messages, a multi-line final with a '<' that is no marker
    ("<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|> Second.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>a < b\nand <|x is text",
     "First. Second.", "a < b\nand <|x is text", []),
    # a model that ignores the format: all content
    ("Hello there, no channels here.", "", "Hello there, no channels here.", []),
]


@pytest.mark.parametrize("text, reasoning, content, calls", REPLIES)
def test_parse_recorded_replies(text, reasoning, content, calls):
    r, c, found = harmony.parse(text)
    assert (r or "", c, found) == (reasoning, content, calls)


@pytest.mark.parametrize("text, reasoning, content, calls", REPLIES)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streamed_in_pieces_equals_whole(text, reasoning, content, calls, size):
    s = harmony.HarmonyStream()
    rs, cs = [], []
    for i in range(0, len(text), size):
        r, c = s.push(text[i:i + size])
        rs.append(r)
        cs.append(c)
        assert "<|" not in r + c or "<|x" in c, (r, c)   # no marker leaks into a delta
    r, c, found = s.finish()
    assert ("".join(rs) + r, "".join(cs) + c, found) == (reasoning, content, calls)


def test_reasoning_off_keeps_the_analysis_in_the_content():
    text = REPLIES[0][0]
    r, c, _ = harmony.parse(text, reasoning=False)
    assert r is None
    assert c == "<|channel|>analysis<|message|>User asks 2+2. Simple: 4.<|end|>2 + 2 = 4."


def test_without_tools_a_call_body_is_content():
    r, c, found = harmony.parse(REPLIES[1][0], calls=False)
    assert found == [] and c == '{"city":"Oslo"}' and r == "Need the weather tool."


def test_openai_shaped_calls_through_tools():
    content, calls = tools.parse("harmony", REPLIES[1][0])
    (call,) = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}


def gpt_oss_template():
    return open(testdata("templates", "openai-gpt-oss-120b.jinja"), encoding="utf-8").read()


def test_the_real_template_is_harmony():
    t = gpt_oss_template()
    assert harmony.is_harmony(t) and tools.family_of(t) == "harmony"
    assert tools.template_takes_tools(t)


def test_the_real_template_renders_effort_tools_and_an_earlier_call():
    """reasoning_effort from chat_template_kwargs, the tools as a TypeScript namespace, an
    earlier call (its reasoning_content as the analysis) and its result, the generation prompt."""
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    msgs = harmony.messages_for_template(tools.messages_for_template(conversation))
    out = render(gpt_oss_template(), msgs, tools=[WEATHER], reasoning_effort="low")
    assert out.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "Reasoning: low\n\n" in out
    assert "Calls to these tools must go to the commentary channel: 'functions'." in out
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n" in out
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in out
    assert ("<|start|>user<|message|>Weather in Paris?<|end|>"
            "<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|>"
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"18 C"<|end|>'
            "<|start|>assistant") in out
    assert out.endswith("<|start|>assistant")
    # the default effort
    assert "Reasoning: medium" in render(gpt_oss_template(), msgs[:2])


def test_parse_what_the_template_renders_for_a_call():
    """The call as the template writes it back is parsed to the same call."""
    written = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    assert harmony.parse(written)[2] == [("get_weather", '{"city": "Paris"}')]


@pytest.fixture(scope="module")
def smol_tokenizer():
    pytest.importorskip("llguidance")
    from edged.text.tokenizer import Tokenizer
    return Tokenizer.from_gguf(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def test_call_grammar(smol_tokenizer):
    """tool_choice required / named: the grammar lets through exactly one harmony call of a
    given tool with arguments of its schema (markers as text in a vocabulary without them)."""
    from edged.text import grammar
    g = grammar.from_lark(tools.call_grammar("harmony", [WEATHER, TIME]))
    grammar.check(g, smol_tokenizer)
    good = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "CET"}'
    assert run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, good)
    for bad in ('<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "CET"}',
                '<|channel|>commentary to=functions.get_wether <|constrain|>json<|message|>{"city": "x"}',
                "<|channel|>final<|message|>hi"):
        assert not run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, bad)
    _, _, found = harmony.parse(good)
    assert found == [("get_time", '{"tz": "CET"}')] and json.loads(found[0][1]) == {"tz": "CET"}
