"""Special tokens around a text and a pair exactly as llama.cpp adds them (issue 44.1), for
each tokenizer model, pre-tokenizer default and combination of add_bos_token / add_eos_token /
add_sep_token (absent, true, false). The expectations below are llama.cpp's code written out
again, independently of edged's table (src/llama-vocab.cpp llama_vocab::impl::load and
::tokenize, tools/server/server-common.cpp format_prompt_rerank, llama-cpp-python 0.3.36)."""
import functools
import itertools
import os

import numpy as np
import pytest

from bpe_vocab import bpe_metadata
from edged import Tokenizer
from edged.errors import TokenizerError
from edged.format.gguf import GGUFFile, Key
from edged.text.tokenizer import TokenType

HERE = os.path.dirname(os.path.abspath(__file__))
BERT_BGE = os.path.join(HERE, "..", "data", "vocab", "ggml-vocab-bert-bge.gguf")
FLAGS = (Key.ADD_BOS, Key.ADD_EOS, Key.ADD_SEP)
COMBOS = list(itertools.product((None, True, False), repeat=3))


@functools.lru_cache(maxsize=None)
def bert_metadata():
    with GGUFFile.open(BERT_BGE) as f:
        return dict(f.metadata)


def spm(**keys):
    tokens = ["<unk>", "<s>", "</s>", "<sep>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["\u2581", "h", "i", "hi", "\u2581hi"]
    types = [TokenType.UNKNOWN] + [TokenType.CONTROL] * 3 + [TokenType.BYTE] * 256 + \
        [TokenType.NORMAL] * 5
    scores = [0.0] * 260 + [-1.0, -2.0, -2.0, -1.5, -0.5]
    return {Key.TOKENIZER_MODEL: "llama", Key.TOKENS: tokens, Key.SEP_ID: 3,
            Key.TOKEN_TYPE: np.array(types, np.int32), Key.SCORES: np.array(scores, np.float32),
            **keys}


def bpe(pre):
    md = bpe_metadata(merges=[("h", "i")], pre=pre,
                      extra=[("<s>", TokenType.CONTROL), ("</s>", TokenType.CONTROL),
                             ("<sep>", TokenType.CONTROL)])
    n = len(md[Key.TOKENS])
    md.update({Key.BOS_ID: n - 3, Key.EOS_ID: n - 2, Key.SEP_ID: n - 1})
    return md


def gemma4():
    """A tiny plain-text BPE vocabulary of the `gemma4` tokenizer model."""
    tokens = ["<s>", "</s>", "<sep>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["\u2581", "h", "i", "hi"]
    types = [TokenType.CONTROL] * 3 + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * 4
    return {Key.TOKENIZER_MODEL: "gemma4", Key.TOKENS: tokens, Key.MERGES: ["h i"],
            Key.TOKEN_TYPE: np.array(types, np.int32), Key.BOS_ID: 0, Key.EOS_ID: 1, Key.SEP_ID: 2}


VOCABS = {   # name -> (metadata, tokenizer model, pre)
    "spm": (spm(), "llama", None),
    "bpe-gpt-2": (bpe("gpt-2"), "gpt2", "gpt-2"),
    "bpe-llama-bpe": (bpe("llama-bpe"), "gpt2", "llama-bpe"),      # adds BOS by default
    "bpe-roberta-bpe": (bpe("roberta-bpe"), "gpt2", "roberta-bpe"),  # adds SEP by default
    "bert-bge": (None, "bert", None),                               # no EOS id in the file
    "bert-with-eos": (None, "bert", "eos"),                         # as the converter writes now
    "gemma4": (gemma4(), "gemma4", None),                           # add_bos forced on
}


def llama_cpp_flags(model, pre, flags):
    """add_bos, add_eos, add_sep as llama_vocab::impl::load leaves them."""
    if model == "gemma4":                                # llama.cpp PR 21500: BOS whatever the file says
        return [True] + [False if f is None else f for f in flags[1:]]
    if model == "llama":
        add = [True, False, False]
    elif model == "bert":
        add = [True, False, True]
    else:
        add = [pre in ("llama3", "llama-bpe"), False, pre in ("jina-v1-en", "jina-v2-code",
                                                              "roberta-bpe")]
    return [d if f is None else f for f, d in zip(flags, add)]


def llama_cpp_single(model, add, ids, body):
    """llama_vocab::impl::tokenize(text, add_special=true)."""
    if model == "bert":                                  # WPM: BOS and SEP, flags unread
        return [ids["bos"]] + body + [ids["sep"]]
    return [ids["bos"]] * add[0] + body + [ids["eos"]] * add[1]


def llama_cpp_pair(add, ids, a, b):
    """format_prompt_rerank without a rerank template."""
    end = ids["eos"] if ids["eos"] is not None else ids["sep"]
    return ([ids["bos"]] * add[0] + a + [end] * add[1] + [ids["sep"]] * add[2] + b
            + [end] * add[1])


@pytest.mark.parametrize("flags", COMBOS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", VOCABS)
def test_special_tokens_as_llama_cpp_adds_them(name, flags):
    md, model, pre = VOCABS[name]
    if model == "bert":
        md = dict(bert_metadata())
        if pre == "eos":
            md[Key.EOS_ID] = 102
    md = dict(md, **{k: v for k, v in zip(FLAGS, flags) if v is not None})
    add = llama_cpp_flags(model, pre, flags)
    tok = Tokenizer(md)
    ids = {"bos": tok.bos_id, "eos": tok.eos_id, "sep": tok.sep_id}
    assert (tok.add_bos, tok.add_eos, tok.add_sep) == tuple(add)
    body = tok.encode("hi", add_special=False)
    assert tok.encode("hi") == llama_cpp_single(model, add, ids, body)
    other = tok.encode("i", add_special=False)
    pair, types = tok.encode_pair("hi", "i")
    assert pair == llama_cpp_pair(add, ids, body, other)
    cut = add[0] + len(body) + add[1]                  # the second part starts at its SEP
    assert types == [0] * cut + [1] * (len(pair) - cut)


def test_a_flag_that_needs_a_missing_token_is_refused():
    md = bert_metadata()
    tok = Tokenizer(dict(md, **{Key.ADD_EOS: True}))         # no EOS: the pair ends in SEP
    assert tok.encode_pair("a", "b")[0][-1] == 102
    with pytest.raises(TokenizerError, match="EOS"):
        Tokenizer(spm(**{Key.ADD_EOS: True, Key.EOS_ID: 0xFFFFFFFF, Key.TOKENS: ["<unk>", "a"],
                         Key.TOKEN_TYPE: np.array([2, 1], np.int32),
                         Key.SCORES: np.zeros(2, np.float32)}))


def test_gemma4_spaces_newlines_and_byte_fallback():
    """Spaces become U+2581 before merging, a newline-only word that is a token stays whole,
    a character no token covers comes out as its <0xXX> bytes, and all of it decodes back."""
    md = gemma4()
    md[Key.TOKENS] = md[Key.TOKENS] + ["\n\n", "\u2581hi"]
    md[Key.TOKEN_TYPE] = np.append(md[Key.TOKEN_TYPE], [TokenType.NORMAL] * 2).astype(np.int32)
    md[Key.MERGES] = ["h i", "\u2581 hi"]
    tok = Tokenizer(md)
    ids = {t: i for i, t in enumerate(md[Key.TOKENS])}
    text = "hi hi\n\n\u00e9"
    got = tok.encode(text, add_special=False)
    assert got == [ids["hi"], ids["\u2581hi"], ids["\n\n"], ids["<0xC3>"], ids["<0xA9>"]]
    assert tok.decode(got) == text
    assert tok.encode("\n\n\n", add_special=False) == [ids["<0x0A>"]] * 3   # "\n\n\n" is no token
