"""The compiled merge loops against slow, obvious Python twins: BPE merges the lowest-ranked
adjacent pair (leftmost first) until none is left; SentencePiece merges the adjacent pair
whose concatenation is the best-scoring token (leftmost first)."""
import functools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import testdata
from edged import Tokenizer

WORDS = st.text(alphabet="abcdeilnorstu THE'\u00e9\u4e2d\U0001F999", min_size=1, max_size=12)


@functools.lru_cache(maxsize=None)
def vocab(name):
    return Tokenizer.from_gguf(testdata("vocab", f"ggml-vocab-{name}.gguf"))


@functools.lru_cache(maxsize=None)
def byte_level(name):
    """(rank of (left bytes, right bytes), id of bytes) from the vocabulary's own strings."""
    from edged import _bpe
    from edged.format.gguf import GGUFFile, Key
    with GGUFFile.open(testdata("vocab", f"ggml-vocab-{name}.gguf")) as f:
        tokens, merges = f.metadata[Key.TOKENS], f.metadata[Key.MERGES]
    ranks = {}
    for i, m in enumerate(merges):
        left, right = m.split(" ", 1)
        pair = tuple(_bpe.byte_level_decode([left, right]))
        ranks.setdefault(pair, i)
    ids = {b: i for i, b in enumerate(_bpe.byte_level_decode(tokens)) if b is not None}
    return ranks, ids


def merge_by_rank(syms, ranks):
    """Merge the adjacent pair of lowest rank (leftmost among equals) until none is left."""
    while len(syms) > 1:
        best = min(((ranks.get((syms[i], syms[i + 1]), 1 << 60), i) for i in range(len(syms) - 1)))
        if best[0] == 1 << 60:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    return syms


def reference_bpe(word, ranks, ids):
    syms = merge_by_rank([bytes((b,)) for b in word], ranks)
    out = []
    for s in syms:
        out += [ids[s]] if s in ids else [ids[bytes((b,))] for b in s if bytes((b,)) in ids]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(word=WORDS)
def test_bpe_merge_loop_equals_reference(word):
    tok = vocab("gpt-2")                    # no ignore_merges: every word goes through the merges
    ranks, ids = byte_level("gpt-2")
    expect = []
    from edged import _bpe
    for w in _bpe.PreTokenizer([(1, 0, None)]).split(word):
        expect += reference_bpe(w.encode(), ranks, ids)
    assert tok.encode(word, add_special=False) == expect


def reference_spm(tok, text):
    data = text.encode()
    syms, i = [], 0
    while i < len(data):
        n = 1 if data[i] < 0xC0 else 2 if data[i] < 0xE0 else 3 if data[i] < 0xF0 else 4
        syms.append(data[i:i + n])
        i += n
    score = {t.encode(): float(tok._scores[i]) for i, t in enumerate(tok._text)}
    while True:
        cands = [(-score[syms[i] + syms[i + 1]], i) for i in range(len(syms) - 1)
                 if syms[i] + syms[i + 1] in score]
        if not cands:
            break
        i = min(cands)[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    out = []
    for s in syms:
        t = s.decode()
        out += [tok._id[t]] if t in tok._id else [tok._id[f"<0x{b:02X}>"] for b in s]
    return out


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=WORDS)
def test_spm_merge_loop_equals_reference(name, text):
    tok = vocab(name)
    assert tok.encode(text, add_special=False) == reference_spm(tok, ("\u2581" + text).replace(" ", "\u2581"))


@functools.lru_cache(maxsize=None)
def gemma4_vocab():
    """Gemma 4's tokenizer, its merge ranks over UTF-8 strings and its token ids by text."""
    import os
    from edged.format.gguf import GGUFFile, Key
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "vocab",
                        "ggml-vocab-gemma-4.gguf")
    with GGUFFile.open(path) as f:
        merges = f.metadata[Key.MERGES]
    ranks = {}
    for i, m in enumerate(merges):
        ranks.setdefault(tuple(m.split(" ", 1)), i)
    tok = Tokenizer.from_gguf(path)
    return tok, ranks


def reference_gemma4(tok, ranks, word):
    """llama.cpp's BPE over characters of plain text: lowest rank first, leftmost among
    equals; a newline-only word that is a token stays whole; no token: <0xXX> bytes."""
    if set(word) == {"\n"} and word in tok._id:
        return [tok._id[word]]
    syms = merge_by_rank(list(word), ranks)
    out = []
    for s in syms:
        out += [tok._id[s]] if s in tok._id else [tok._id[f"<0x{b:02X}>"] for b in s.encode()]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet="abcdeilnorstu THE'\n\u00e9\u4e2d\U0001F999\u0378", min_size=1,
                    max_size=16))
def test_gemma4_merge_loop_equals_reference(text):
    """The compiled plain-text BPE (raw=True) against the Python twin, word by word (runs of
    newlines and of the rest), spaces as U+2581; U+0378 (unassigned) has no token."""
    tok, ranks = gemma4_vocab()
    expect = []
    for word in re.findall(r"\n+|[^\n]+", text.replace(" ", "\u2581")):
        expect += reference_gemma4(tok, ranks, word)
    assert tok.encode(text, add_special=False) == expect
