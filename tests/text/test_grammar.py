"""Structured output (text/grammar.py): llguidance constraints on a real 49k vocabulary drawn
through the compiled sampler and its NumPy twin. Whatever the logits, what comes out parses and
validates; bad schemas and grammars fail with a GrammarError that names the problem, in bounded
time."""
import json
import os
import time

import numpy as np
import pytest

from conftest import ROOT, testdata
from edged.errors import GrammarError

pytest.importorskip("llguidance")
from edged.text import grammar  # noqa: E402
from edged.text.sampling import Sampler, SamplingParams, keyed_uniform, sample_reference  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "pets", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok():
    from edged.text.tokenizer import Tokenizer
    return Tokenizer.from_gguf(testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def draw(tok, g, seed, temperature, compiled=True, limit=200):
    """Generate from random logits under the grammar until an end token; returns the text."""
    rng = np.random.default_rng(seed)
    s = Sampler(tok.n_vocab, SamplingParams(temperature=temperature, seed=seed),
                constraint=grammar.Constraint(g, tok))
    out = []
    for _ in range(limit):
        logits = rng.normal(0, 3, tok.n_vocab).astype(np.float32)
        if compiled:
            t = s.sample(logits)
        else:
            t = sample_reference(logits, s.params, s.bias_ids, s.bias_vals, np.zeros(0, np.int32),
                                 np.zeros(0, np.int32), keyed_uniform(s.seed, len(out)), s.constraint.mask())
        if t in tok.eog_ids:
            return tok.decode(out)
        s.accept(t)
        out.append(t)
    raise AssertionError(f"no end token after {limit} tokens: {tok.decode(out)!r}")


def valid(v):
    assert set(v) == {"name", "age", "pets", "ok"}
    assert isinstance(v["name"], str) and len(v["name"]) <= 12
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 120
    assert all(p in ("cat", "dog", "fish") for p in v["pets"]) and len(v["pets"]) <= 3
    assert isinstance(v["ok"], bool)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("compiled", [True, False])
def test_random_logits_give_valid_json(tok, seed, compiled):
    pytest.importorskip("edged._core") if compiled else None
    g = grammar.check(grammar.from_json_schema(SCHEMA), tok)
    text = draw(tok, g, seed, temperature=1.0 if seed % 2 else 0.0, compiled=compiled)
    valid(json.loads(text))
    # json.dumps's layout: no stray white space (a string may hold any character the grammar allows)
    assert text == json.dumps(json.loads(text), ensure_ascii=False)


def accepts(tok, g, text):
    c = grammar.Constraint(g, tok)
    for t in tok.encode(text, add_special=False):
        if not np.unpackbits(c.mask().view(np.uint8), bitorder="little")[t]:
            return False
        c.consume(t)
    return c.is_accepting()


def test_json_object_and_gbnf_and_lark(tok):
    any_object = grammar.check(grammar.from_json_schema(None), tok)      # response_format json_object
    assert accepts(tok, any_object, '{"a": [1, 2.5, {"b": null}], "c": "x"}')
    assert not accepts(tok, any_object, '[1, 2]')
    assert not accepts(tok, any_object, '{"a": 1')
    gbnf = 'root ::= "yes" | "no" | digit digit\ndigit ::= [0-9]'
    for _ in range(3):
        assert draw(tok, grammar.check(grammar.from_grammar(gbnf), tok), _, 1.0) in \
            {"yes", "no"} | {f"{i:02d}" for i in range(100)}
    lark = 'start: "color: " COLOR\nCOLOR: "red" | "green"'
    assert draw(tok, grammar.check(grammar.from_grammar(lark), tok), 3, 1.0) in ("color: red", "color: green")


def test_compiled_mask_matches_the_reference(tok):
    """The compiled sampler and its NumPy twin draw the same token under the same mask."""
    core = pytest.importorskip("edged._core")
    g = grammar.check(grammar.from_json_schema(SCHEMA), tok)
    c = grammar.Constraint(g, tok)
    for t in tok.encode('{"name": "Bo', add_special=False):
        c.consume(t)
    mask = c.mask()
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:tok.n_vocab].astype(bool)
    assert 0 < bits.sum() < tok.n_vocab
    rng = np.random.default_rng(1)
    e = np.zeros(0, np.int32)
    for i in range(30):
        x = rng.normal(0, 2, tok.n_vocab).astype(np.float32)
        temp, top_k, top_p, min_p, u = [(0.0, 0, 1.0, 0.0, 0.0), (1.0, 0, 1.0, 0.0, 0.5),
                                         (0.7, 40, 0.9, 0.0, 0.3), (1.3, 0, 0.95, 0.05, 0.9)][i % 4]
        p = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
        a = core.sample_logits(x, p, e, np.zeros(0, np.float32), e, e, u, None, mask)
        b = sample_reference(x, p, e, np.zeros(0, np.float32), e, e, u, mask)
        assert a == b and bits[a]
    with pytest.raises(ValueError, match="mask"):
        core.sample_logits(x, SamplingParams(temperature=1.0), e, np.zeros(0, np.float32), e, e, 0.5, None,
                           mask[:10])


def test_logit_bias_cannot_revive_a_masked_token(tok):
    g = grammar.check(grammar.from_grammar('root ::= "no"'), tok)
    yes = tok.encode("yes", add_special=False)[0]
    s = Sampler(tok.n_vocab, SamplingParams(logit_bias={yes: 100.0}), constraint=grammar.Constraint(g, tok))
    t = s.sample(np.zeros(tok.n_vocab, np.float32))
    assert t != yes and tok.decode([t]) in ("n", "no")


@pytest.mark.parametrize("make, needle", [
    (lambda: grammar.from_json_schema({"type": "objekt"}), "objekt"),
    (lambda: grammar.from_json_schema([1, 2]), "must be an object"),
    (lambda: grammar.from_json_schema({"type": "string", "pattern": "(unclosed"}), "json_schema"),
    (lambda: grammar.from_grammar("root ::= missing_rule"), "missing_rule"),
    (lambda: grammar.from_json_schema({"type": "string", "pattern": "(unclosed"}), "unclosed group"),
    (lambda: grammar.from_grammar("root ::= ("), "grammar"),
    (lambda: grammar.from_grammar(""), "non-empty"),
    (lambda: grammar.from_grammar('root ::= "' + "a" * 70000 + '"'), "larger than"),
])
def test_bad_schema_or_grammar_names_the_problem(tok, make, needle):
    with pytest.raises(GrammarError, match=needle):
        grammar.check(make(), tok, what=needle)


def test_compilation_is_bounded(tok):
    """Schemas that blow up a lexer (huge counted repetitions, deep nesting) fail fast."""
    hostile = [{"type": "string", "pattern": "(a|b|c){1000}(d{1000}){1000}"},
               {"type": "string", "pattern": "([a-z]{1,50}){1,50}x{20000}"},
               {"type": "array", "minItems": 100000, "items": {"type": "string", "pattern": "[a-z]{1,100}"}}]
    for schema in hostile:
        t0 = time.monotonic()
        try:
            g = grammar.check(grammar.from_json_schema(schema), tok)
            c = grammar.Constraint(g, tok)
            c.mask()
        except GrammarError as e:
            assert "json_schema" in str(e)
        assert time.monotonic() - t0 < 10, schema


@pytest.mark.parametrize("seed", range(3))
def test_forced_text_on_a_sentencepiece_vocabulary_has_no_space_prefix(seed):
    """SentencePiece vocabularies add a space before text that starts a prompt or follows a
    special token; the text a grammar forces continues a reply, so "Once" must not become the
    token " Once" (the reply would start with a space the grammar does not allow)."""
    from edged.text.tokenizer import Tokenizer
    spm = Tokenizer.from_gguf(os.path.join(ROOT, "edged", "data", "stories260K.gguf"))
    assert spm.add_space_prefix
    for src, want in (('start: "Once upon" " a time"', b"Once upon a time"),
                      ('start: " Once" | "Lily"', None)):
        rng = np.random.default_rng(seed)
        c = grammar.Constraint(grammar.from_lark(src), spm)
        out = []
        while not c.is_accepting():
            m = c.mask()
            allowed = [i for i in range(spm.n_vocab) if m[i // 32] >> (i % 32) & 1]
            t = allowed[rng.integers(len(allowed))]
            out.append(spm.token_piece(t))
            c.consume(t)
        text = b"".join(out)
        assert text == want if want else text in (b" Once", b"Lily")


def test_schemas_are_read_as_llama_cpp_reads_them(tok):
    """grammar.llama_like: an object with properties and no additionalProperties is closed, an
    integer has at most 16 digits (|n| <= 2**53), a number at most 10 decimals; an object
    without properties stays any object, an explicit additionalProperties stays, and the
    members of an allOf (merged parts) stay open."""
    city = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"},
                                             "x": {"type": "number"}}}
    g = grammar.check(grammar.from_json_schema(city), tok)
    assert accepts(tok, g, '{"city": "Paris", "n": 9007199254740992, "x": -0.1234567891}')
    assert not accepts(tok, g, '{"city": "Paris", "n": 1, "x": 1, "extra": 1}')
    assert not accepts(tok, g, '{"n": 90071992547409921}')
    assert not accepts(tok, g, '{"x": 1.12345678901}')
    opened = grammar.check(grammar.from_json_schema(dict(city, additionalProperties=True)), tok)
    assert accepts(tok, opened, '{"city": "Paris", "extra": 1}')
    assert accepts(tok, grammar.check(grammar.from_json_schema({"type": "object"}), tok), '{"any": [1]}')
    merged = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]}
    assert accepts(tok, grammar.check(grammar.from_json_schema(merged), tok), '{"a": 1, "b": 2}')
    # the rewrite knows which keys hold schemas: a property named "properties" is a name
    s = grammar.llama_like({"type": "object", "properties": {"properties": {"type": "integer", "minimum": 0}}})
    assert s == {"type": "object", "additionalProperties": False, "properties": {
        "properties": {"type": "integer", "minimum": 0, "maximum": grammar.INT_LIMIT}}}
    assert grammar.llama_like(city) != city and "additionalProperties" not in city    # a copy
    pi = {"type": "number", "const": 3.14159265358979}        # more decimals than FRACTION allows
    assert accepts(tok, grammar.check(grammar.from_json_schema(pi), tok), "3.14159265358979")


def test_tool_call_arguments_are_read_as_llama_cpp_reads_them(tok):
    from edged.text import tools
    fn = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    g = grammar.check(grammar.from_lark(tools.call_grammar("llama3", [fn])), tok)
    assert accepts(tok, g, '{"name": "f", "parameters": {"n": 12}}')
    assert not accepts(tok, g, '{"name": "f", "parameters": {"n": 12, "m": 1}}')
