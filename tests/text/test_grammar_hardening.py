"""Hostile grammars and schemas against llguidance's native code (issue 41.1, 41.11, 41.12).

llguidance compiles recursively and a crash there is a crash of the daemon, so every hostile
shape compiles in a process of its own (tests/support/grammar_shapes.py): it must either
compile, and then step as the decode thread does on a small stack, or raise GrammarError, and
the process must live. A hypothesis search over grammar and schema shapes does the same for a
bounded time (test_fuzz_grammars_and_schemas)."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT, testdata
from edged.errors import GrammarError, RequestError

pytest.importorskip("llguidance")
from edged.service import openai_schema  # noqa: E402
from edged.text import grammar, tools  # noqa: E402
from grammar_shapes import DEEPEST, REPRODUCTIONS, gbnf_chain  # noqa: E402

SHAPES = os.path.join(ROOT, "tests", "support", "grammar_shapes.py")
FUZZ = os.path.join(ROOT, "tests", "support", "grammar_fuzz.py")


def isolated(script, *args, env=None, timeout=300):
    """Run a tests/support script in a fresh interpreter: (exit status, JSON lines, stderr)."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "support")]))
    e.update(env or {})
    r = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=ROOT)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")], r.stderr


@pytest.fixture(scope="module")
def tok():
    from edged.text.tokenizer import Tokenizer
    return Tokenizer.from_gguf(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def test_reproductions_compile_or_are_refused_and_the_process_lives():
    """The issue's reproductions, from a worker thread with the default stack as the daemon's
    handlers: a 3,600-rule Lark chain (SIGSEGV before), the 64 KiB GBNF chain, JSON nesting,
    deep groups, wide alternations, regex groups, numbers a float cannot hold (an integer range
    at -2**63 recursed forever in llguidance: SIGSEGV)."""
    code, out, err = isolated(SHAPES, "--mask-stack", "256", *REPRODUCTIONS,
                              env={"EDGED_GRAMMAR_TOKENIZER": testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf")})
    assert code == 0, f"the compiling process died ({code}) at:\n{err[-2000:]}"
    assert [o["name"] for o in out] == REPRODUCTIONS
    for o in out:
        assert o["result"] in ("compiled", "GrammarError"), o
        assert o["seconds"] < 10, o
    results = {o["name"]: o["result"] for o in out}
    assert results["lark_chain_3600"] == results["gbnf_chain_cap"] == "compiled"
    assert results["schema_items_150"] == results["const_int64_min"] == "GrammarError"
    assert results["multiple_of_2_31"] == results["multiple_of_5_digit_primes"] == "GrammarError"


def test_deepest_grammars_fit_a_quarter_of_the_compile_stack():
    """The worst stack per byte found (chains of rules of 28 nested groups: ~48 MiB at 64 KiB;
    rule, terminal and $ref chains) compiles with COMPILE_STACK / 4: the stack holds 4x the
    most a grammar under the size cap was seen to need. Each then steps on 256 KiB of stack:
    masks do not recurse with the grammar's depth."""
    code, out, err = isolated(SHAPES, "--compile-stack", str(grammar.COMPILE_STACK // 4),
                              "--mask-stack", "256", *DEEPEST)
    assert code == 0, f"the compiling process died ({code}) at:\n{err[-2000:]}"
    assert {o["name"]: o["result"] for o in out} == {
        name: "GrammarError" if name == "template_nesting_cap" else "compiled" for name in DEEPEST}
    assert all(o["bytes"] > grammar.MAX_GRAMMAR_BYTES * 0.95 for o in out), out


def test_failing_compile_is_fast_with_rust_backtraces_on():
    """With RUST_BACKTRACE=1 in the environment llguidance captured a backtrace per level of a
    failing compile: 39 s for a 2,000-rule chain ending in an unknown name (3 ms without)."""
    code, out, err = isolated(SHAPES, "bad_chain_2000", env={"RUST_BACKTRACE": "1"})
    assert code == 0, err[-2000:]
    assert out[0]["result"] == "GrammarError" and "unknown name" in out[0]["message"], out
    assert out[0]["seconds"] < 5, out


def test_gbnf_chain_converts_in_linear_time():
    """llguidance's GBNF converter found terminals one chain link per pass: a chain written top
    down took ~30x longer than the same chain bottom up (3.3 s for 5,500 rules). Rules are
    now put in dependency order first, so both orders cost the same."""
    kind, top_down = gbnf_chain(3000)
    lines = top_down.split("\n")
    bottom_up = "\n".join([lines[0]] + lines[:0:-1])

    def seconds(text):
        t0 = time.monotonic()
        grammar.from_grammar(text)
        return time.monotonic() - t0
    fast = min(seconds(bottom_up) for _ in range(2))
    assert seconds(top_down) < 4 * fast + 0.2, (fast, seconds(top_down))


GBNF = r'''# a JSON-ish grammar, rules in no particular order
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''


@pytest.mark.parametrize("text", [
    GBNF,
    'root ::= a "x ::= y" [:=]\nb ::= "b" # c ::= d\na ::= b b-c\nb-c ::= "q"',
    'root ::= a\na ::= "first"\na ::= "second"',                  # the last definition counts
    'root ::= ( a\n  | b )\nb ::= "b"\na ::= "a"',                 # a group over two lines
])
def test_gbnf_dependency_order_keeps_the_grammar(text):
    from llguidance.gbnf_to_lark import gbnf_to_lark

    def rules(t):           # the Lark rules, comments aside (they go with the next rule)
        out = []
        for line in gbnf_to_lark(t).split("\n"):
            if line.startswith((" ", "\t")):
                out[-1] += line                 # `     | ...`: the rule goes on
            elif line and not line.startswith("//"):
                out.append(line)
        return sorted(out)
    assert rules(grammar._gbnf_dependency_order(text)) == rules(text)


# --- numbers a 64-bit float cannot hold (issue 41.11) -----------------------------------------

@pytest.mark.parametrize("schema, key", [
    ({"type": "integer", "minimum": 2**63, "maximum": 2**63 + 5}, "maximum"),
    ({"type": "integer", "minimum": 2**53 + 1}, "minimum"),
    ({"type": "integer", "exclusiveMinimum": 2**63 - 2}, "exclusiveMinimum"),
    ({"type": "integer", "exclusiveMaximum": -2**64}, "exclusiveMaximum"),
    ({"type": "number", "minimum": 2**63 + 5, "maximum": 2**63 + 5}, "maximum"),
    ({"type": "number", "maximum": 1e300}, "maximum"),
    ({"type": "number", "minimum": float("nan")}, "minimum"),
    ({"type": "number", "maximum": float("inf")}, "maximum"),
    ({"type": "integer", "minimum": 10**400}, "minimum"),                # no float holds it at all
    ({"type": "integer", "multipleOf": 2**63 + 1}, "multipleOf"),
    ({"type": "object", "properties": {"n": {"const": 2**63 + 5}}}, "const"),
    ({"enum": [1, -2**63]}, "enum[1]"),
])
def test_numbers_beyond_a_float_are_refused_naming_the_keyword(schema, key):
    """llguidance holds schema numbers as 64-bit floats: {"minimum": 2**63, "maximum": 2**63+5}
    gave 9223372036854775807 with finish "stop" (a violation), a const 2**63+5 gave
    9223372036854776000."""
    with pytest.raises(GrammarError, match=re.escape(f"'{key}' is ") + r".*\(2\*\*53\)"):
        grammar.from_json_schema(schema, "response_format.json_schema.schema")


def test_numbers_within_a_float_are_exact(tok):
    from grammar_support import feed
    schema = {"type": "integer", "minimum": 2**53 - 3, "maximum": 2**53}
    g = grammar.check(grammar.from_json_schema(schema), tok)
    for n in (2**53 - 3, 2**53):
        assert feed(grammar.Constraint(g, tok), tok, str(n))
    for n in (2**53 - 4, 2**53 + 1):
        assert not feed(grammar.Constraint(g, tok), tok, str(n))


def test_schemas_inside_a_lark_grammar_are_checked():
    with pytest.raises(GrammarError, match=r"grammar: %json at 7: 'const' is -9223372036854775808"):
        grammar.from_grammar('start: %json {"const": -9223372036854775808}')
    with pytest.raises(GrammarError, match=r"nested too deeply \(more than 100 levels"):
        grammar.from_lark("start: %json " + '{"items": ' * 101 + "{}" + "}" * 101, "tools")


# --- multipleOf, and compiles that run too long -------------------------------------------

@pytest.mark.parametrize("schema, shown", [
    ({"type": "array", "items": {"type": "integer", "multipleOf": 2**31}}, "'multipleOf' is 2147483648 (at '.items.multipleOf')"),
    ({"type": "integer", "multipleOf": 999983}, "'multipleOf' is 999983"),
    ({"type": "number", "multipleOf": 12.3456}, "'multipleOf' is 12.3456"),
    ({"type": "integer", "multipleOf": 0}, "'multipleOf' is 0"),
    ({"type": "number", "multipleOf": -0.5}, "'multipleOf' is -0.5"),
    ({"type": "number", "multipleOf": 1e-11}, "'multipleOf' is 1e-11 (at '.multipleOf'); it may have at most 10 decimals"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer", "multipleOf": 99991 - 2 * i} for i in range(3)}},
     "'multipleOf' values add up to more than edged compiles (at '.properties.p1.multipleOf')"),
])
def test_costly_multiple_of_is_refused_naming_it(schema, shown):
    """llguidance's lexer spends time and memory in proportion to a multipleOf's significant
    digits before its own limits refuse it (2**31 ran on past 20 s and 1.3 GB; found by the fuzz)."""
    with pytest.raises(GrammarError, match=re.escape(shown)):
        grammar.from_json_schema(schema, "response_format.json_schema.schema")


@pytest.mark.parametrize("schema, good, bad", [
    # llguidance writes a fraction with multipleOf's decimals or none: 2.5 is "2.50"
    ({"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 10}, ["0.75", "2.50", "10"], ["0.3", "2.55", "10.25"]),
    ({"type": "integer", "multipleOf": 1024, "minimum": 0}, ["0", "1024", "3072"], ["1000", "1025"]),
    ({"type": "integer", "multipleOf": 15000, "minimum": 0}, ["45000", "0"], ["1500", "15001"]),
])
def test_multiple_of_within_the_bound_is_exact(tok, schema, good, bad):
    from grammar_support import feed
    g = grammar.check(grammar.from_json_schema(schema), tok)
    for text in good:
        assert feed(grammar.Constraint(g, tok), tok, text), text
    for text in bad:
        assert not feed(grammar.Constraint(g, tok), tok, text), text


def test_a_compile_past_the_deadline_is_a_grammar_error_and_the_next_one_goes_ahead(monkeypatch):
    """llguidance's native code cannot be stopped: a compile still running after COMPILE_SECONDS
    is given up (counted), and it holds nothing the next compile needs."""
    import threading
    monkeypatch.setattr(grammar, "COMPILE_SECONDS", 0.3)
    release = threading.Event()
    before = grammar.ABANDONED[0]
    t0 = time.monotonic()
    with pytest.raises(GrammarError, match=r"response_format did not compile within 0.3 s"):
        grammar._on_compile_thread("response_format", lambda: release.wait(30))
    assert time.monotonic() - t0 < 5 and grammar.ABANDONED[0] == before + 1
    try:
        assert grammar._on_compile_thread("response_format", lambda: 42) == 42     # not blocked by the first
    finally:
        release.set()


# --- JSON nested too deep for Python (issue 41.12) -----------------------------------------

def _chat(arguments=None, **extra):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments or "{}"}}
    return {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}], **extra}


def _nest(n):
    v = 1
    for _ in range(n):
        v = {"a": [v]}
    return v


@pytest.mark.parametrize("body, param", [
    (_chat("[" * 995 + "]" * 995), "messages[1].tool_calls[0].function.arguments"),    # a 500 before
    (_chat("[" * 101 + "]" * 101), "messages[1].tool_calls[0].function.arguments"),
    (_chat(_nest(60)), "messages[1].tool_calls[0].function.arguments"),
    (_chat(tools=[{"type": "function", "function": {"name": "f", "parameters": _nest(60)}}]),
     "tools[0].function.parameters"),
    (_chat(chat_template_kwargs={"x": _nest(400)}), "chat_template_kwargs"),
])
def test_deep_json_in_a_chat_request_is_a_400_naming_the_field(body, param):
    with pytest.raises(RequestError, match=r"nested too deeply \(more than 100 levels\)") as e:
        openai_schema.validate(json.loads(json.dumps(body)), chat=True)
    assert e.value.param == param


def test_json_as_deep_as_allowed_passes_and_parses_as_text_when_deeper():
    openai_schema.validate(_chat("[" * 100 + "]" * 100, tools=[{"type": "function", "function": {
        "name": "f", "parameters": _nest(49)}}]), chat=True)
    deep = "[" * 5000 + "]" * 5000
    # past validation (another protocol's adapter): the template gets the text as sent
    m = tools.messages_for_template([_chat(deep)["messages"][1]])[0]
    assert m["tool_calls"][0]["function"]["arguments"] == deep
    # a reply too deep to parse is content, not a 500
    reply = "<tool_call>\n" + deep + "\n</tool_call>"
    assert tools.parse("hermes", reply) == (reply, [])
    assert tools.parse("generic", "{" + '"a": [' * 3000) == ("{" + '"a": [' * 3000, [])


# --- the fuzz ------------------------------------------------------------------------------

def test_fuzz_grammars_and_schemas():
    """Random Lark and GBNF grammars, JSON schemas and regexes (deep nesting, long chains, wide
    alternations, recursive references, huge counted repetitions, numbers at the int64 edges,
    odd unicode) for FUZZ_SECONDS in a process of its own: each compiles, and steps on a 256 KiB
    stack, or raises GrammarError; nothing else, and the process lives."""
    seconds = float(os.environ.get("EDGED_GRAMMAR_FUZZ_SECONDS", "30"))
    fresh = ["--random"] if os.environ.get("EDGED_FUZZ_RANDOM") else []
    code, out, err = isolated(FUZZ, "--seconds", str(seconds), *fresh, timeout=seconds + 120)
    assert code == 0, f"the fuzzing process died ({code}); last input:\n{err[-3000:]}"
    summary = out[-1]
    assert summary["examples"] >= 50 and summary["compiled"] and summary["refused"], summary
