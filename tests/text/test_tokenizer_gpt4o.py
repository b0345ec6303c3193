"""The o200k pre-tokenizer (`tokenizer.ggml.pre` = "gpt-4o": gpt-oss, Llama 4) against
Python's `re` running llama.cpp's own regex for it the way llama.cpp runs it (std::regex over
text whose non-ASCII letters and digits stand for their category, so a non-ASCII letter is both
"upper" ([^a-z]) and "lower" ([^A-Z]) case), on the vocabulary suites' texts and on random
text; plus the cases that show what the regex does."""
import re
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import testdata_files
from edged import _bpe
from edged.text.tokenizer import PRE_TOKENIZERS
from regex_oracle import ALPHABET, WS, WS_CHARS, classes, stl_split


def gpt4o_pattern():
    """llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O regex with \\p{L}, \\p{N} and \\s spelled out."""
    c = classes()
    L, N, S = c["L"], c["N"], re.escape(WS_CHARS)
    contr = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    upper, lower = f"(?:(?=[{L}])[^a-z])", f"(?:(?=[{L}])[^A-Z])"
    return (f"[^\\r\\n{L}{N}]?{upper}*{lower}+{contr}"
            f"|[^\\r\\n{L}{N}]?{upper}+{lower}*{contr}"
            f"|[{N}]{{1,3}}"
            f"| ?[^{S}{L}{N}]+[\\r\\n/]*"
            f"|{WS}*[\\r\\n]+"
            f"|{WS}+(?={WS}|\\Z)"
            f"|{WS}+")


def split(text):
    return _bpe.PreTokenizer(PRE_TOKENIZERS["gpt-4o"].ops).split(text)


@pytest.mark.parametrize("text, words", [
    ("HTMLParser isn't", ["HTMLParser", " isn't"]),          # upper* lower+ and a contraction
    ("helloWorld DON'T", ["hello", "World", " DON'T"]),       # a capital starts a word
    ("  hello\n\n  world", [" ", " hello", "\n\n", " ", " world"]),   # \s+(?!\S), \s*[\r\n]+
    ("x 12345 (a) //\n", ["x", " ", "123", "45", " (", "a", ")", " //\n"]),
    ("\u00c9A caf\u00e9", ["\u00c9", "A", " caf\u00e9"]),     # a non-ASCII letter is lower case too
    ("\u4e2d\u6587abc", ["\u4e2d\u6587abc"]),
])
def test_what_the_regex_does(text, words):
    assert split(text) == words
    assert re.findall(gpt4o_pattern(), text) == words


def suite_texts():
    out = []
    for path in testdata_files("vocab", ".inp"):
        with open(path, encoding="utf-8") as f:
            out += f.read().split("\n__ggml_vocab_test__\n")[:-1]
    return out


@pytest.mark.skipif(sys.version_info < (3, 11), reason="unicodedata too old")
def test_vocab_suite_texts():
    texts = suite_texts()
    if not texts:
        pytest.skip("shared test data missing: ../shared/testdata/vocab")
    pattern = re.compile(gpt4o_pattern())
    for text in texts:
        assert split(text) == stl_split(text, pattern), repr(text)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="unicodedata too old")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=ALPHABET + "ABCdefÀàŁłΣσ'sStTdD/", max_size=40))
def test_random_text(text):
    got = split(text)
    assert got == stl_split(text, re.compile(gpt4o_pattern())), text
    assert "".join(got) == text
