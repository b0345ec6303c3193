"""Property tests: the compiled regex ops against Python's `re` running the same regexes the way
llama.cpp runs them, and encode/decode on arbitrary text (no exception, ids in range, lossless)."""
import functools
import re
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpe_vocab import bpe_metadata
from conftest import testdata
from edged import Tokenizer, _bpe
from edged.text.tokenizer import (A_LSTRIP, A_RSTRIP, CJK_HANGUL, CL_CRLF, CL_L, CL_N, CL_P, CL_P_DEFAULT,
                                  CL_P_FALCON, CL_RANGES, DEEPSEEK_LETTERS, DEEPSEEK_PUNCT, OP_DIGITS3,
                                  OP_NEWLINES, OP_ONE, OP_QWEN2, OP_QWEN35, OP_RUN, OP_TRAIL_WS, OP_WS_RUN,
                                  PRE_TOKENIZERS, TokenType)
from regex_oracle import ALPHABET, WS, classes, stl_split


def ranges_class(rng):
    return "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in rng)


def op_cases():
    c = classes()
    nows = f"(?!{WS})"
    return [
        ((OP_RUN, CL_P_DEFAULT, None), f"[{c['P']}$+<=>^~|]+"),
        ((OP_RUN, CL_P_FALCON, None), f"[{c['P']}$+<=>^~|`]+"),
        ((OP_RUN, CL_N, None), f"[{c['N']}]+"),
        ((OP_ONE, CL_N, None), f"[{c['N']}]"),
        ((OP_ONE, CL_CRLF, None), r"[\r\n]"),
        ((OP_WS_RUN, CL_L, None), f"{WS}?[{c['L']}]+"),
        ((OP_WS_RUN, CL_P, None), f"{WS}?[{c['P']}]+"),
        ((OP_WS_RUN, CL_RANGES, DEEPSEEK_LETTERS), f"{WS}?(?:{nows}[{ranges_class(DEEPSEEK_LETTERS)}])+"),
        ((OP_WS_RUN, CL_RANGES, DEEPSEEK_PUNCT), f"{WS}?(?:{nows}[{ranges_class(DEEPSEEK_PUNCT)}])+"),
        ((OP_RUN, CL_RANGES, CJK_HANGUL), f"(?:{nows}[{ranges_class(CJK_HANGUL)}])+"),
        ((OP_TRAIL_WS, 0, None), f"{WS}+\\Z"),
        ((OP_DIGITS3, 0, None), "[0-9][0-9][0-9]"),
        ((OP_NEWLINES, 0, None), "[^\\n]+|[\\n]+"),
    ]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="unicodedata too old")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=ALPHABET, max_size=40))
def test_regex_ops_match_python_re(text):
    for op, pattern in op_cases():
        got = _bpe.PreTokenizer([op]).split(text)
        assert got == stl_split(text, pattern), (op, text)
        assert "".join(got) == text


def test_qwen35_keeps_combining_marks_with_letters():
    text = "n\u0303a b\u0301"
    assert _bpe.PreTokenizer([(OP_QWEN2, 0, None)]).split(text) == ["n", "\u0303a", " b", "\u0301"]
    assert _bpe.PreTokenizer([(OP_QWEN35, 0, None)]).split(text) == ["n\u0303a", " b\u0301"]


def test_starcoder_splits_every_digit_and_falcon_groups_three():
    assert _bpe.PreTokenizer(PRE_TOKENIZERS["starcoder"].ops).split("abc 123") == ["abc", " ", "1", "2", "3"]
    assert _bpe.PreTokenizer(PRE_TOKENIZERS["falcon"].ops).split("x 12345") == ["x", " ", "123", "45"]
    assert _bpe.PreTokenizer(PRE_TOKENIZERS["deepseek-coder"].ops).split("a1\n") == ["a", "1", "\n"]


@functools.lru_cache(maxsize=None)
def vocab(name):
    return Tokenizer.from_gguf(testdata("vocab", f"ggml-vocab-{name}.gguf"))


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe", "qwen2", "deepseek-llm", "gpt-2"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT)
def test_encode_decode_round_trip_on_any_text(name, text):
    tok = vocab(name)
    if tok.model == "llama":
        text = text.replace("\u2581", "_")       # SPM writes spaces as U+2581: that one is ambiguous
    ids = tok.encode(text, add_special=False)
    assert all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode(ids) == text
    dec = tok.stream_decoder(strip_leading_space=tok.add_space_prefix)
    assert "".join(dec.push(i) for i in ids) + dec.flush() == text


@pytest.mark.parametrize("name", ["llama-bpe", "phi-3"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.one_of(TEXT, st.sampled_from(["<|eot_id|>", "<|user|>", "</s>", "<s>", "<|end|>",
                                                       "<|begin_of_text|>", " "])), max_size=6))
def test_parse_special_on_any_text_never_fails(name, parts):
    tok = vocab(name)
    text = "".join(parts)
    for parse in (False, True):
        ids = tok.encode(text, add_special=True, parse_special=parse)
        assert all(0 <= i < tok.n_vocab for i in ids)
        tok.decode(ids, special=True)


def test_lone_surrogates_are_tokenized_not_raised():
    tok = vocab("llama-bpe")
    ids = tok.encode("a\ud800b", add_special=False)
    assert ids and all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode(ids).startswith("a") and tok.decode(ids).endswith("b")


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT)
def test_spm_word_by_word_equals_whole_text_merging(name, text):
    tok = vocab(name)
    assert tok._spm_words                      # these vocabularies allow the word-by-word path
    data = (" " + text).replace(" ", "\u2581").encode("utf-8", "surrogatepass")
    assert tok._spm.encode(data, True) == tok._spm.encode(data, False)


SPECIAL_PARTS = st.lists(st.one_of(
    st.text(alphabet="ab \t\n\u00e9\u00f8<>|", max_size=6),
    st.sampled_from(["<|user|>", "</s>", "<s>", "<|end|>", "\u00f8", "\u00e9", "<a>", "<a><b>", "<b>",
                     "[PAD151650]", "<|im_start|>", "  ", "\n"])), max_size=12)


@pytest.mark.parametrize("name", ["phi-3", "deepseek-llm", "qwen2"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=SPECIAL_PARTS)
def test_partition_equals_llama_cpp_transcription(name, parts):
    tok = vocab(name)
    text = "".join(parts)
    for parse in (False, True):
        assert tok._partition(text, parse) == tok._partition_reference(text, parse)


@settings(max_examples=150, deadline=None)
@given(parts=SPECIAL_PARTS)
def test_partition_with_lstrip_and_rstrip_equals_transcription(parts):
    tok = Tokenizer(bpe_metadata(extra=[("<a>", TokenType.CONTROL), ("<a><b>", TokenType.USER_DEFINED),
                                        ("<b>", TokenType.CONTROL), ("</s>", TokenType.USER_DEFINED)]))
    flags = [A_LSTRIP, A_RSTRIP, A_LSTRIP | A_RSTRIP, 0]
    tok._special_all = [(t, i, a | flags[k % 4]) for k, (t, i, a) in enumerate(tok._special_all)]
    tok._special_user = [(t, i, a | flags[(k + 1) % 4]) for k, (t, i, a) in enumerate(tok._special_user)]
    tok._groups_all, tok._groups_user = tok._group(tok._special_all), tok._group(tok._special_user)
    text = "".join(parts)
    for parse in (False, True):
        assert tok._partition(text, parse) == tok._partition_reference(text, parse)
