"""llama.cpp's own tokenizer suites (../shared/testdata/vocab, and tests/data/vocab for the
WordPiece `bert-bge`, Gemma 4 `gemma-4` and Qwen3.5 `qwen35` suites) through edged.Tokenizer, and the round trip
decode(encode(t)) == t on the same inputs (not for WordPiece, which lowercases and drops accents
by design)."""
import functools
import os

import pytest

from conftest import testdata_files
from edged import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
BERT_BGE = os.path.join(HERE, "..", "data", "vocab", "ggml-vocab-bert-bge.gguf")
GEMMA4 = os.path.join(HERE, "..", "data", "vocab", "ggml-vocab-gemma-4.gguf")
QWEN35 = os.path.join(HERE, "..", "data", "vocab", "ggml-vocab-qwen35.gguf")  # 50 cases
LOSSLESS = [p for p in testdata_files("vocab", ".gguf") if os.path.exists(p + ".inp")] + [GEMMA4, QWEN35]
VOCABS = LOSSLESS + [BERT_BGE]


@functools.lru_cache(maxsize=None)
def tokenizer(path):
    return Tokenizer.from_gguf(path)


def cases(path):
    sep = "\n__ggml_vocab_test__\n"
    data = open(path + ".inp", encoding="utf-8", newline="").read()
    texts = data.split(sep)
    if data.endswith(sep):                      # gemma-4's file has no separator after the last
        texts.pop()
    outs = open(path + ".out", encoding="utf-8", newline="").read().split("\n")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, outs)]


@pytest.mark.parametrize("path", VOCABS, ids=os.path.basename)
def test_llama_cpp_suite_passes_completely(path):
    tok = tokenizer(path)
    got = [(text, tok.encode(text, add_special=False, parse_special=False)) for text, _ in cases(path)]
    bad = [(text, ids, want) for (text, ids), (_, want) in zip(got, cases(path)) if ids != want]
    n = 50 if path == QWEN35 else 46
    assert len(cases(path)) == n
    assert not bad, f"{len(bad)} of {n} differ, first: {bad[0]!r}"


@pytest.mark.parametrize("path", LOSSLESS, ids=os.path.basename)
def test_round_trip_on_suite_inputs(path):
    tok = tokenizer(path)
    for text, _ in cases(path):
        for add_special in (False, True):
            ids = tok.encode(text, add_special=add_special)
            assert tok.decode(ids) == text, (text, ids)


@pytest.mark.parametrize("path", LOSSLESS, ids=os.path.basename)
def test_streaming_decoder_matches_decode_and_emits_whole_characters(path):
    tok = tokenizer(path)
    for text, _ in cases(path):
        ids = tok.encode(text, add_special=False)
        dec = tok.stream_decoder(strip_leading_space=tok.add_space_prefix)
        parts = [dec.push(i) for i in ids] + [dec.flush()]
        assert "".join(parts) == text
        assert all("\ufffd" not in p for p in parts)
