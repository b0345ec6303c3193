"""The oracle of the pre-tokenizer tests: llama.cpp's whitespace, Unicode category classes from
Python's unicodedata, and splitting text the way llama.cpp's std::regex path does, for the
compiled regex ops to be compared against."""
import functools
import re
import unicodedata

# llama.cpp's whitespace: Unicode White_Space without U+001C..U+001F
WS_CHARS = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
           "\u2028\u2029\u202f\u205f\u3000"
WS = "[" + re.escape(WS_CHARS) + "]"

# characters whose category is the same in Python's unicodedata and in edged's Unicode 15.1 table
ALPHABET = ("abcXYZ019 \t\r\n!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" "\u00e9\u00df\u00b5\u00b2\u0663\u4e2d"
            "\uac00\u3002\uff01\u3000\u00a0\u2003\u0303\x1c\x85\u2126\U0001F999\u2018\u20ac\u0800\u00c4")


def category_class(prefix):
    chars = [chr(c) for c in range(0x30000) if unicodedata.category(chr(c)).startswith(prefix)
             and chr(c) not in WS_CHARS]
    return "".join(re.escape(c) for c in chars)


@functools.lru_cache(maxsize=None)
def classes():
    return {"N": category_class("N"), "L": category_class("L"), "P": category_class("P")}


def stl_split(text, pattern):
    """llama.cpp's std::regex splitting: matches and the text between them are the pieces."""
    out, last = [], 0
    for m in re.finditer(pattern, text):
        if m.start() > last:
            out.append(text[last:m.start()])
        out.append(m.group())
        last = m.end()
    if last < len(text):
        out.append(text[last:])
    return out
