"""Synthetic byte-level BPE vocabularies for tokenizer tests: GPT-2's byte -> character table
written out independently of edged, and GGUF tokenizer metadata built from a list of merges."""
import numpy as np

from edged.format.gguf import Key
from edged.text.tokenizer import TokenType


def gpt2_byte_chars():
    """GPT-2's byte -> character table, written out independently of edged."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_metadata(merges=(), extra=(), pre="gpt-2", **keys):
    """A byte-level BPE vocabulary: 256 byte tokens, one token per merge, then `extra`
    (text, type) tokens."""
    chars = gpt2_byte_chars()
    tokens = [chars[b] for b in range(256)]
    types = [TokenType.NORMAL] * 256
    merge_strs = []
    for left, right in merges:
        l_, r_ = ("".join(chars[b] for b in s.encode()) for s in (left, right))
        merge_strs.append(f"{l_} {r_}")
        if l_ + r_ not in tokens:
            tokens.append(l_ + r_)
            types.append(TokenType.NORMAL)
    for text, ttype in extra:
        tokens.append(text)
        types.append(ttype)
    md = {Key.TOKENIZER_MODEL: "gpt2", Key.TOKENS: tokens,
          Key.TOKEN_TYPE: np.array(types, np.int32), Key.MERGES: merge_strs}
    if pre is not None:
        md[Key.PRE] = pre
    md.update(keys)
    return md
