"""A real sandboxed daemon against the grammar attacks of issue 41 (items 1, 11, 12): each is
answered within seconds, with a 400 naming the problem or a reply the grammar allows, and the
daemon still answers /health afterwards. Before: the Lark chain and the -2**63 schema killed the
daemon (SIGSEGV), `/z+/ "z"` froze its decode thread for good, a 5,000-rule GBNF chain took
seconds to convert, deep tool-call arguments were a 500, a multipleOf of 2**31 held the compile
thread past 20 s and 1.3 GB (and every later grammar request behind it)."""
import time

import pytest

from daemon_support import model_dir, running, signing_key, stories
from grammar_shapes import lark_chain, largest, short_chain

pytest.importorskip("llguidance")
pytest.importorskip("pyseccomp")

ARGS = "messages[1].tool_calls[0].function.arguments"


def completion(grammar_field, value):
    return "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0, grammar_field: value}


def deep_tool_call():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 995 + "]" * 995}}
    return "/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}


# name -> (request, expected status, text the reply's text starts with or the error names)
ATTACKS = {
    "lark_chain_3600": (completion(*lark_chain(3600)), 200, "y"),
    "gbnf_chain_64k": (completion(*largest(short_chain, gbnf=True)), 200, "y"),
    "const_int64_min": (completion("json_schema", {"const": -2**63}), 400, "'const' is -9223372036854775808"),
    "integer_beyond_int64": (completion("json_schema", {"type": "integer", "minimum": 2**63,
                                                        "maximum": 2**63 + 5}), 400, "2**53"),
    "forced_forever": (completion("grammar", 'start: /z+/ "z"'), 200, "z"),
    "regex_panic": (completion("grammar", "start: /((\\p{L}|(\\p{L}|\u00e9)))/"), 400, "llguidance failed"),
    "multiple_of_2_31": (completion("json_schema", {"type": "array", "items": {"type": "integer", "multipleOf": 2**31}}),
                         400, "'multipleOf' is 2147483648"),
    "deep_tool_arguments": (deep_tool_call(), 400, f"'{ARGS}' is nested too deeply (more than 100 levels)"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    key, trusted = signing_key(tmp_path_factory)
    return model_dir(tmp_path_factory.mktemp("grammar"), key, {"alpha": stories()}), trusted


def test_grammar_attacks_against_a_sandboxed_daemon(tmp_path, models):
    models_dir, trusted = models
    with running(tmp_path, models_dir, trusted, default_model="alpha", extra={"sandbox": "enforce"}) as srv:
        for name, ((path, body), status, expect) in ATTACKS.items():
            t0 = time.monotonic()
            got, _, reply = srv.request("POST", path, body, timeout=60)
            took = time.monotonic() - t0
            assert got == status, (name, got, reply, srv.logtext()[-2000:])
            if status == 200:
                assert reply["choices"][0]["text"].startswith(expect), (name, reply)
            else:
                assert expect in reply["error"]["message"], (name, reply)
            assert took < 20, (name, took)
            srv.assert_serving("/health")
        # and it still generates for everyone
        got, _, reply = srv.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
        assert got == 200 and reply["choices"][0]["text"], reply
        assert "Traceback" not in srv.logtext()
