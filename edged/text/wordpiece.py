"""WordPiece (`tokenizer.ggml.model = bert`): the tokenizer of BERT-family embedding models
(all-MiniLM, bge, nomic-embed-text), the way llama.cpp's WPM tokenizer reads a GGUF vocabulary.

The converters store a word-initial piece with a leading U+2581 ("\u2581hello") and a
continuation piece bare ("##ing" -> "ing"). Encoding a text:

1. BERT's basic pre-tokenisation: NFD and accent marks dropped when `strip_accents`, lowercase
   when `lowercase` (tokenizer.ggml.normalizer.*; both default to true, strip_accents to the
   lowercase setting), control characters, NUL and U+FFFD dropped, whitespace splits words,
   and every punctuation mark, ASCII symbol and CJK ideograph is a word of its own;
2. each word, with U+2581 in front, is cut greedily into the longest pieces of the vocabulary
   from the left; a word that cannot be cut completely becomes one [UNK].

Our own code because it is part of the product (the tokenizer layer) and must give llama.cpp's
ids (tests/data/vocab/ggml-vocab-bert-bge.gguf: llama.cpp's suite). Plain Python: embedding
inputs are short and the longest-match loop is a few dictionary lookups per character.
"""
from __future__ import annotations

import unicodedata

WORD_START = "\u2581"

# llama.cpp's whitespace set (unicode_set_whitespace), not Python's str.isspace
_WHITESPACE = frozenset(map(chr, (
    0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
    0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F,
    0x3000)))

# CJK ideographs BERT splits one by one (its _is_chinese_char; 0x2B920 as the HF code has it)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(cp):
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _lower(c):
    """One code point's simple lowercase mapping (str.lower may give several, e.g. U+0130)."""
    low = c.lower()
    return low if len(low) == 1 else low[0]


def pre_tokenize(text, lowercase=True, strip_accents=True):
    """BERT's basic tokenisation: the list of words (punctuation and CJK characters alone)."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words, cur = [], []
    for c in text:
        if c in _WHITESPACE:
            if cur:
                words.append("".join(cur))
                cur = []
            continue
        cat = unicodedata.category(c)
        if c in ("\0", "\ufffd") or (cat[0] == "C" and cat != "Cn"):
            continue
        if strip_accents and cat[0] == "M":
            continue
        s = _lower(c) if lowercase else c
        cp = ord(c)
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_cjk(cp):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(s)
        else:
            cur.append(s)
    if cur:
        words.append("".join(cur))
    return words


class WordPiece:
    """Greedy longest-match segmentation over a vocabulary {text: id}."""

    def __init__(self, token_ids, unk_id, lowercase=True, strip_accents=True):
        self._ids = token_ids
        self.unk_id = unk_id
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self._max_len = max(map(len, token_ids))

    def encode_word(self, word, out):
        w = WORD_START + word
        n, start, i = len(w), len(out), 0
        while i < n:
            for j in range(min(n, i + self._max_len), i, -1):
                tid = self._ids.get(w[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:                       # an uncuttable rest: the whole word is unknown
                del out[start:]
                break
        if len(out) == start:
            out.append(self.unk_id)

    def encode(self, text):
        out = []
        for word in pre_tokenize(text, self.lowercase, self.strip_accents):
            self.encode_word(word, out)
        return out
