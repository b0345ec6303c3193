"""Gemma 4's chat conventions (text/gemma4.py): the tool-call family found from its templates,
tool results folded into the assistant turn for the older template (as llama.cpp does) so that
it renders what the official one renders, calls parsed out of replies in Gemma 4's value
syntax, streaming, the `<|channel>thought` reasoning split and the grammar that forces a call."""
import functools
import json
import os

import pytest

from conftest import testdata
from grammar_support import TOOLS, smol_tokenizer  # noqa: F401  (smol_tokenizer: a fixture)
from grammar_support import feed as run
from edged.format.gguf import GGUFFile, Key
from edged.text import gemma4, reasoning, tools
from edged.text.chat import render

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = os.path.join(HERE, "..", "data", "vocab", "ggml-vocab-gemma-4.gguf")
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "18 C"},
    {"role": "assistant", "content": "It is 18 C."},
    {"role": "user", "content": "Thanks"}]
OFFICIAL_PROMPT = (
    '<bos><|turn>system\n<|tool>declaration:get_weather{description:<|"|>Weather in a city<|"|>,'
    'parameters:{properties:{city:{type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT'
    '<|"|>}}<tool|><turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n<|tool_call>call:'
    'get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>response:get_weather{value:<|"|>18 C'
    '<|"|>}<tool_response|>It is 18 C.<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n'
    '<|channel>thought\n<channel|>')


@functools.lru_cache(maxsize=None)
def official():
    return open(testdata("templates", "google-gemma-4-31B-it.jinja"), encoding="utf-8").read()


@functools.lru_cache(maxsize=None)
def older():
    """The template the converter stored in llama.cpp's gemma-4 vocabulary file (pre-"OpenAI
    Chat Completions" handling: it reads only `tool_responses`)."""
    with GGUFFile.open(VOCAB) as f:
        return f.metadata[Key.CHAT_TEMPLATE]


def rendered(template, convert=True):
    msgs = tools.messages_for_template(CONVERSATION)
    if convert:
        msgs = gemma4.messages_for_template(msgs, template)
    return render(template, msgs, tools=TOOLS[:1], bos_token="<bos>", eos_token="<eos>")


def test_family_and_reasoning_tags_from_both_templates():
    for t in (official(), older()):
        assert tools.family_of(t) == "gemma4"
        assert reasoning.tags_of(t) == reasoning.GEMMA4_TAGS


def test_official_template_renders_tool_results_itself():
    assert rendered(official()) == OFFICIAL_PROMPT
    assert rendered(official(), convert=False) == OFFICIAL_PROMPT


def test_older_template_gets_tool_results_folded_into_the_model_turn():
    assert rendered(older()) == OFFICIAL_PROMPT
    assert rendered(older(), convert=False) != OFFICIAL_PROMPT      # a bare `tool` turn otherwise


def test_tool_result_names_fall_back_to_the_call_id_and_keep_plain_text():
    msgs = [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "a", "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "not json"},
            {"role": "tool", "tool_call_id": "c2", "content": "[1, 2]"}]
    out = gemma4.messages_for_template(msgs, older())
    assert out == [{"role": "assistant", "tool_calls": msgs[0]["tool_calls"],
                    "tool_responses": [{"name": "a", "response": "not json"},
                                       {"name": "c2", "response": [1, 2]}]}]


@pytest.mark.parametrize("text, content, calls", [
    ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "",
     [("get_weather", {"city": "Paris"})]),
    ('Let me check.\n<|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|"|>}<tool_call|>'
     '<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>', "Let me check.",
     [("get_weather", {"city": 'Paris, "FR"'}), ("get_time", {"tz": "CET"})]),
    ('<|tool_call>call:f{a:-1.5e3,b:true,c:null,d:[1, <|"|>x<|"|>, {e:false}],f:{},g:[]}<tool_call|>', "",
     [("f", {"a": -1500.0, "b": True, "c": None, "d": [1, "x", {"e": False}], "f": {}, "g": []})]),
    ('<|tool_call>call:f{<|"|>k<|"|>:1}', "", [("f", {"k": 1})]),     # quoted key, no closing marker
])
def test_parse_replies(text, content, calls):
    got_content, got = tools.parse("gemma4", text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls


@pytest.mark.parametrize("text", [
    '<|tool_call>call:f{a:<|"|>open}<tool_call|>', '<|tool_call>call:{a:1}<tool_call|>',
    '<|tool_call>call:f{a 1}<tool_call|>', '<|tool_call>call:f{a:[1 2]}<tool_call|>',
    '<|tool_call>call:f{a:nope}<tool_call|>', '<|tool_call>call:f' + '{a:[' * 200,
])
def test_malformed_calls_stay_content(text):
    assert tools.parse("gemma4", text) == (text, [])


def test_stream_splitter_holds_back_the_call():
    s = tools.StreamSplitter("gemma4")
    text = 'Checking.<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>'
    out = "".join(s.push(text[i:i + 3]) for i in range(0, len(text), 3))
    rest, calls = s.finish()
    assert out + rest == "Checking."
    assert [c["function"]["name"] for c in calls] == ["get_time"]


def test_reasoning_split_on_the_thought_channel():
    text = "<|channel>thought\nThe user wants X.<channel|>The answer."
    r, c = reasoning.split(text, tags=reasoning.GEMMA4_TAGS)
    assert (r, c) == ("The user wants X.", "The answer.")
    s = reasoning.ThinkSplitter(tags=reasoning.GEMMA4_TAGS)
    parts = [s.push(text[i:i + 4]) for i in range(0, len(text), 4)] + [s.flush()]
    assert "".join(p[0] for p in parts).strip() == "The user wants X."
    assert "".join(p[1] for p in parts) == "The answer."


@pytest.mark.parametrize("parallel, good, bad", [
    (True, '<|tool_call>call:get_weather{city:{name:<|"|>Paris<|"|>,at:[1, 2.5]}}<tool_call|>'
           '<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>',
     '<|tool_call>call:get_wether{city:<|"|>Paris<|"|>}<tool_call|>'),
    (True, '<|tool_call>call:get_time{tz:<|"|>CET<|"|>,tz:null}<tool_call|>',
     '<|tool_call>call:get_time{zone:<|"|>CET<|"|>}<tool_call|>'),          # keys of the schema
    (False, '<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>',
     '<|tool_call>call:get_time{tz:CET}<tool_call|>'),
    (False, '<|tool_call>call:get_time{}<tool_call|>',
     '<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_time{}<tool_call|>'),
])
def test_call_grammar_accepts_calls_and_refuses_the_rest(smol_tokenizer, parallel, good, bad):
    from edged.text import grammar
    g = grammar.from_lark(tools.call_grammar("gemma4", TOOLS, parallel=parallel))
    grammar.check(g, smol_tokenizer)
    assert run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, good)
    assert not run(grammar.Constraint(g, smol_tokenizer), smol_tokenizer, bad)
    _, calls = tools.parse("gemma4", good)
    assert calls and all(c["function"]["name"] in ("get_weather", "get_time") for c in calls)


def test_a_prompt_left_after_a_closed_turn_opens_the_model_turn():
    """With thinking on, the older template ends a prompt after a turn with tool results and
    text at `<turn|>`: the model's turn is opened after it (as llama.cpp does); other prompts
    stay as they are."""
    msgs = gemma4.messages_for_template(tools.messages_for_template(CONVERSATION[:4]), older())
    prompt = render(older(), msgs, tools=TOOLS[:1], bos_token="<bos>", enable_thinking=True)
    assert prompt.endswith("<tool_response|>It is 18 C.<turn|>\n")
    assert gemma4.generation_prompt(prompt) == prompt + "<|turn>model\n"
    assert gemma4.generation_prompt(OFFICIAL_PROMPT) == OFFICIAL_PROMPT


def test_model_chat_prompt_opens_the_model_turn(tmp_path):
    """Model.chat_prompt applies it to a Gemma 4 template (here an operator's template file on
    another model: the compiled backend does not run gemma4 files yet)."""
    from edged import Model
    path = tmp_path / "gemma4.jinja"
    path.write_text(older(), encoding="utf-8")
    msgs = gemma4.messages_for_template(tools.messages_for_template(CONVERSATION[:4]), older())
    with Model.load(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf")) as m:
        prompt = m.chat_prompt(msgs, template_file=str(path), enable_thinking=True)
    assert prompt.endswith("It is 18 C.<turn|>\n<|turn>model\n")
